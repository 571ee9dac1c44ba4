"""The planner's entry points under mpiexec: what simulated ranks cannot run.

``train``'s ``check_serial`` (rank 0 replays on a twin built on ``MPI.COMM_SELF``) and
``refconv calibrate`` (it times kernels on a grid of COMM_SELF) split COMM_SELF, which a
simulated rank refuses; ``python -m refconv.plan.validate`` runs on ``MPI.COMM_WORLD``.  So
they stay here, at 2 ranks.  tests/on_ranks/test_plan.py checks the rest at 1 to 8 simulated
ranks, and the planned models against a one-rank replay made in the test's thread.

The planner's output for this world size (for every shipped machine file, so the plans differ
and mix grids and algorithms) is trained by ``refconv.train`` with ``check_serial``: rank 0
replays the first steps on one rank and the losses must agree (float64, relative 1e-6).
"""

import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/: the package on_ranks
from on_ranks.test_plan import BATCH, SPEC, STEPS  # noqa: E402
from refconv.plan import calibrate, validate  # noqa: E402
from refconv.pricing import machine, search  # noqa: E402
from refconv.testing.asserts import assert_all_ranks  # noqa: E402
from refconv.testing.mpirun import mpi_test  # noqa: E402
from refconv.train import train  # noqa: E402
from refconv.train_config import TrainConfig  # noqa: E402

comm = MPI.COMM_WORLD  # SPEC: the model tests/on_ranks/test_plan.py plans too

@mpi_test(sizes=(2,), timeout=240)
def test_planned_models_train_as_the_serial_model():
    """Real MPI: ``check_serial`` replays on a twin built on MPI.COMM_SELF, which a simulated rank
    cannot use (tests/on_ranks/test_plan.py replays in the test's thread)."""
    grids = set()
    for name in machine.builtin_names():
        _, plan = search.plan_model(SPEC, (BATCH, 1, 16, 16), comm.size, machine.load(name))
        grids |= {r.cost.grid for r in plan.rows}
        cfg = TrainConfig(model=search.to_spec(SPEC, plan), batch_size=BATCH, epochs=1, max_steps=STEPS,
                          check_serial=STEPS, dtype="float64", backend="numpy", progress=False)
        result = train(cfg, log=lambda *a, **k: None)
        assert_all_ranks(comm, result["serial_check"] is not None and result["serial_check"] <= 1e-6,
                         f"{name}: {result['serial_check']}")
    assert_all_ranks(comm, len(grids) > 1, f"every plan used one grid {grids}: the test checks no shuffle")


@mpi_test(sizes=(2,), timeout=120)
def test_quick_calibration_gives_a_loadable_machine_file_with_the_models_table():
    """``refconv calibrate --quick --model SPEC`` (as a function): a machine file that loads, whose
    conv_table holds exactly the local shapes the planner prices for SPEC here, each measured.
    Real MPI: calibrate times kernels on a grid of MPI.COMM_SELF, which a simulated rank cannot use."""
    shapes = calibrate.model_shapes(SPEC, (BATCH, 1, 16, 16), comm.size, machine.load("v100-edr"))
    try:
        doc = calibrate.calibrate(comm, "numpy", quick=True, shapes=shapes)
    except calibrate.Unmeasured:   # its own advice on a busy machine (the suite's other worker): run it again, once
        doc = calibrate.calibrate(comm, "numpy", quick=True, shapes=shapes)
    m = machine.from_dict(doc)  # raises on a malformed file
    assert_all_ranks(comm, m.ranks_per_node == comm.size and m.comm_seconds("allreduce", 2, 1 << 20) > 0
                     and m.conv_seconds("conv_fwd", 9, 1e8) > 0, f"{doc}")
    keys = {s for _, s in m.conv_table}
    assert_all_ranks(comm, len(shapes) == len(set(shapes)) > 5 and keys == set(shapes)
                     and len(m.conv_table) == 3 * len(shapes) and all(t > 0 for t in m.conv_table.values()),
                     f"{len(shapes)} shapes, table {m.conv_table}")
    _, plan = search.plan_model(SPEC, (BATCH, 1, 16, 16), comm.size, m)  # plans with the table
    assert_all_ranks(comm, plan.seconds > 0, f"{plan}")


@mpi_test(sizes=(2,), timeout=180)
def test_quick_validation_measures_every_strategy_at_1_and_2_ranks():
    """Real MPI: ``python -m refconv.plan.validate`` runs on MPI.COMM_WORLD."""
    result = validate.main(["--quick", "--table", "--machine", "v100-edr"])
    labels = {(r.P, r.label) for r in result["rows"]}
    assert_all_ranks(comm, labels == {(1, "serial"), (2, "sample"), (2, "height"), (2, "X"), (2, "Y")}
                     and all(r.predicted > 0 and r.measured.min > 0 for r in result["rows"])
                     and [(p.layer, p.P) for p in result["picks"]] == [("narrow 3x3", 2)]
                     and result["measured"]["planned"].min > 0 and result["measured"]["sample"].min > 0, f"{result}")
    # --table: the same measurements priced from the conv times measured here, which the datasheet
    # V100's rates (GPU speed) are far from: this CPU's convolutions run about 100x slower than the
    # V100 file prices them, so the 5x bound below has a wide margin and no timing race
    tabled = result["table"]["rows"]
    assert_all_ranks(comm, [(r.label, r.measured) for r in tabled] == [(r.label, r.measured) for r in result["rows"]]
                     and all(t.cost.fwd > 5 * r.cost.fwd for t, r in zip(tabled, result["rows"]))
                     and "planned (table)" in result["predicted"], f"{result}")
