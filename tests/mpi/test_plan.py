"""A planned model file runs unchanged and trains as the serial model does.

The planner's output for this world size (several machines, so the plans differ
and mix grids and algorithms) is built with ``Model.from_spec`` on every rank; its
losses over a few steps must match the one-rank twin of the same spec.
"""

import numpy
from mpi4py import MPI

from refconv import datasets
from refconv.model import Model
from refconv.optim import SGD
from refconv.plan import machine, search
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import step

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


def _losses(model):
    x, y, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    opt = SGD(model, 0.1, momentum=0.9)
    out = []
    for i, (x_b, y_b) in enumerate(datasets.batches(x, y, BATCH, seed=1, drop_last=True)):
        if i == STEPS:
            break
        out.append(step(model, opt, x_b, y_b))
    return numpy.array(out)


@mpi_test(sizes=(2, 4), timeout=240)
def test_planned_models_train_as_the_serial_model():
    serial = comm.bcast(_losses(Model.from_spec(SPEC, serial=True, backend="numpy", dtype=numpy.float64, seed=3))
                        if comm.rank == 0 else None, root=0)
    grids = set()
    for name in machine.builtin_names():
        _, plan = search.plan_model(SPEC, (BATCH, 1, 16, 16), comm.size, machine.load(name))
        planned = search.to_spec(SPEC, plan)
        grids |= {r.cost.grid for r in plan.rows}
        model = Model.from_spec(planned, comm=comm, backend="numpy", dtype=numpy.float64, seed=3)
        dist = _losses(model)
        rel = numpy.abs(dist - serial) / numpy.abs(serial)
        assert_all_ranks(comm, rel.max() < 1e-6, f"{name}: distributed {dist} vs serial {serial}")
    assert_all_ranks(comm, len(grids) > 1, f"every plan used one grid {grids}: the test checks no shuffle")
