"""Grouped and depthwise models train distributed as they do on one rank (float64, 20 steps).

Tiny versions of the ``mobilenet`` (depthwise-separable) and ``resnext50-32x4d``
presets run with a channel split, where their grouped convs run the "grouped"
algorithm (docs/grouped.md), and on one rank (``serial=True``); the losses of every
step must agree to a relative 1e-6, as in tests/mpiexec/launched/test_training.py.  On 4 simulated ranks
(refconv.simulated), and on 2 and 8; the serial models train in the test's own thread.
"""

import numpy

from refconv import datasets, simulated
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks
from refconv.train import step

STEPS, BATCH = 20, 8
TINY = {  # every grouped conv has 4 or more groups: a multiple of channel = 2 or 4
    "mobilenet": dict(width=1 / 8, blocks=((64, 1), (128, 2)), num_classes=10, in_channels=1),
    "resnext50-32x4d": dict(cardinality=4, group_width=2, stages=((4, 1, 1), (8, 1, 2)), stem=8, num_classes=10,
                            in_channels=1),
}


# channel splits that divide every grouped conv's groups (4 or more), per world size
GRIDS = {2: ({"channel": 2},), 4: ({"sample": 2, "channel": 2}, {"channel": 4}),
         8: ({"sample": 2, "channel": 4}, {"sample": 4, "channel": 2})}


def _losses(model):
    x, y, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    opt = SGD(model, 0.1, momentum=0.9)
    batches = datasets.batches(x, y, BATCH, seed=1, drop_last=True)
    return numpy.array([step(model, opt, x_b, y_b) for _, (x_b, y_b) in zip(range(STEPS), batches)])


def _build(kwargs):
    return dict(backend="numpy", dtype=numpy.float64, seed=3, **kwargs)


def trains_as_on_one_rank(comm, serial):
    """On every rank: each preset on two grids, against ``serial``, its losses on one rank."""
    for name, kwargs in TINY.items():
        for grid in GRIDS[comm.size]:
            with Model.from_spec(name, comm=comm, defaults={"grid": grid, "algorithm": "stationary-x"},
                                 **_build(kwargs)) as model:
                grouped = [layer.algorithm for _, layer in model.named_layers() if getattr(layer, "groups", 1) > 1]
                dist = _losses(model)
            rel = numpy.abs(dist - serial[name]) / numpy.abs(serial[name])
            assert_all_ranks(comm, grouped and set(grouped) == {"grouped"}, f"{name} {grid}: {grouped}")
            assert_all_ranks(comm, rel.max() < 1e-6, f"{name} {grid}: largest relative difference {rel.max():.2e}"
                             f"\ndistributed {dist}\nserial {serial[name]}")


@on_ranks(*GRIDS)
def test_grouped_presets_train_as_on_one_rank(ranks):
    # the serial runs train in the test's thread: serial=True builds on MPI.COMM_SELF, which a
    # simulated rank may not use
    serial = {name: _losses(Model.from_spec(name, serial=True, **_build(kwargs))) for name, kwargs in TINY.items()}
    for name, losses in serial.items():
        assert losses[-5:].mean() < losses[:5].mean(), f"{name}: the loss did not go down: {losses}"
    simulated.run(trains_as_on_one_rank, ranks, args=(serial,))
