"""A planned model file runs unchanged and trains as the serial model does.

The planner's output for this world size (for every shipped machine file, so the
plans differ and mix grids and algorithms) is trained by ``refconv.train`` with
``check_serial``: rank 0 replays the first steps on one rank and the losses must
agree (float64, relative 1e-6).
"""

from mpi4py import MPI

from refconv.plan import machine, search
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import train
from refconv.train_config import TrainConfig

comm = MPI.COMM_WORLD
STEPS, BATCH = 3, 8
SPEC = {
    "in_channels": 1,
    "layers": [
        {"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "residual",
         "layers": [{"type": "conv", "out": 8, "kernel": 3, "padding": 1, "bias": False}, {"type": "batchnorm"}],
         "shortcut": [{"type": "conv", "out": 8, "kernel": 1, "bias": False}]},
        {"type": "relu"},
        {"type": "gap"}, {"type": "linear", "out": 10},
    ],
}


@mpi_test(sizes=(2, 4), timeout=240)
def test_planned_models_train_as_the_serial_model():
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
def test_quick_calibration_gives_a_loadable_machine_file():
    from refconv.plan import calibrate

    doc = calibrate.calibrate(comm, "numpy", quick=True)
    m = machine.from_dict(doc)  # raises on a malformed file
    assert_all_ranks(comm, m.ranks_per_node == comm.size and m.comm_seconds("allreduce", 2, 1 << 20) > 0
                     and m.conv_seconds("conv_fwd", 9, 1e8) > 0, f"{doc}")


@mpi_test(sizes=(2,), timeout=180)
def test_quick_validation_measures_every_strategy_at_1_and_2_ranks():
    from refconv.plan import validate

    result = validate.main(["--quick", "--machine", "v100-edr"])
    labels = {(r.P, r.label) for r in result["rows"]}
    assert_all_ranks(comm, labels == {(1, "serial"), (2, "sample"), (2, "height"), (2, "X"), (2, "Y")}
                     and all(r.predicted > 0 and r.measured.min > 0 for r in result["rows"])
                     and [(p.layer, p.P) for p in result["picks"]] == [("narrow 3x3", 2)]
                     and result["measured"]["planned"].min > 0 and result["measured"]["sample"].min > 0, f"{result}")
