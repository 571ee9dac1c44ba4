"""Grouped and depthwise models train distributed as they do on one rank (float64, 20 steps).

Tiny versions of the ``mobilenet`` (depthwise-separable) and ``resnext50-32x4d``
presets run with a channel split, where their grouped convs run the "grouped"
algorithm (docs/grouped.md), and on one rank (``serial=True``); the losses of every
step must agree to a relative 1e-6, as in tests/mpi/test_training.py.
"""

import numpy
from mpi4py import MPI

from refconv import datasets
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import step

comm = MPI.COMM_WORLD
STEPS, BATCH = 20, 8
TINY = {  # every grouped conv has 4 or more groups: a multiple of channel = 2 or 4
    "mobilenet": dict(width=1 / 8, blocks=((64, 1), (128, 2)), num_classes=10, in_channels=1),
    "resnext50-32x4d": dict(cardinality=4, group_width=2, stages=((4, 1, 1), (8, 1, 2)), stem=8, num_classes=10,
                            in_channels=1),
}


def _losses(model):
    x, y, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    opt = SGD(model, 0.1, momentum=0.9)
    batches = datasets.batches(x, y, BATCH, seed=1, drop_last=True)
    return numpy.array([step(model, opt, x_b, y_b) for _, (x_b, y_b) in zip(range(STEPS), batches)])


@mpi_test(sizes=(4,), timeout=240)
def test_grouped_presets_train_as_on_one_rank():
    for name, kwargs in TINY.items():
        build = dict(backend="numpy", dtype=numpy.float64, seed=3, **kwargs)
        serial = comm.bcast(_losses(Model.from_spec(name, serial=True, **build)) if comm.rank == 0 else None)
        for grid in ({"sample": 2, "channel": 2}, {"channel": 4}):
            model = Model.from_spec(name, comm=comm, defaults={"grid": grid, "algorithm": "stationary-x"}, **build)
            grouped = [layer.algorithm for _, layer in model.named_layers() if getattr(layer, "groups", 1) > 1]
            dist = _losses(model)
            rel = numpy.abs(dist - serial) / numpy.abs(serial)
            assert_all_ranks(comm, grouped and set(grouped) == {"grouped"}, f"{name} {grid}: {grouped}")
            assert_all_ranks(comm, rel.max() < 1e-6, f"{name} {grid}: largest relative difference {rel.max():.2e}"
                             f"\ndistributed {dist}\nserial {serial}")
        assert_all_ranks(comm, serial[-5:].mean() < serial[:5].mean(), f"{name}: the loss did not go down: {serial}")
