"""A training step makes exactly the calls its layers' ``records()`` list: the calls the
planner prices (refconv.pricing.perf sums the same records), compared with what CommStats
measures, kind, communicator size, bytes and messages (``check_records``).

Every preset runs, the large ones in small versions built by the same functions (16x16
digits-sized images, 10 classes): digits-cnn as shipped, resnet50 at 16x16, and the tiny
mobilenet and resnext50-32x4d of tests/on_ranks/test_grouped_models.py.  The wide ResNets
(resnet50-wide2, -wide4) are resnet50's builder with wider bottlenecks, the same layer
kinds; at 69M and 240M parameters per rank they do not fit this test's memory.  The
cosmoflow preset's step (volumes) is checked in tests/on_ranks/test_volumes.py.  On simulated ranks
(refconv.simulated): each rank thread trains its own model, as each process would.
"""

import numpy

from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.check import check_records
from refconv.testing.ranks import on_ranks
from refconv.train import step

SMALL = {"digits-cnn": {},
         "resnet50": dict(num_classes=10, in_channels=1),
         "mobilenet": dict(width=1 / 8, blocks=((64, 1), (128, 2)), num_classes=10, in_channels=1),
         "resnext50-32x4d": dict(cardinality=4, group_width=2, stages=((4, 1, 1), (8, 1, 2)), stem=8,
                                 num_classes=10, in_channels=1)}
# grids per world size; every preset runs on each (the grouped ones need channel | their groups)
GRIDS = {1: [{"sample": 1}],
         2: [{"sample": 2}, {"channel": 2}, {"height": 2}],
         3: [{"sample": 3}, {"height": 3}],
         4: [{"sample": 2, "channel": 2}, {"channel": 4}, {"height": 2, "width": 2}, {"sample": 2, "height": 2}]}
SPATIAL_LIMIT = {"resnet50": 1, "resnext50-32x4d": 2}  # their last stages are 1x1 or 2x2 at 16x16
# a grid per layer: shuffles between them, around an identity shortcut too, and every algorithm
MIXED = {"name": "mixed", "in_channels": 1, "layers": [
    {"type": "conv", "out": 8, "kernel": 3, "padding": 1, "grid": {"sample": 2, "height": 2}},
    {"type": "batchnorm"}, {"type": "relu"},
    {"type": "residual", "layers": [{"type": "conv", "out": 8, "kernel": 3, "padding": 1, "grid": {"channel": 4},
                                     "algorithm": "stationary-y"}, {"type": "batchnorm"}]},
    {"type": "relu"}, {"type": "avgpool", "kernel": 2},
    {"type": "conv", "out": 16, "kernel": 3, "padding": 1, "grid": {"channel": 4}, "algorithm": "stationary-w",
     "filter_groups": 2},
    {"type": "conv", "out": 8, "kernel": 1, "grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x"},
    {"type": "gap"}, {"type": "linear", "out": 10, "grid": {"sample": 2, "channel": 2}}]}


def _step_records(comm, name, grid, algorithm, filter_groups=None):
    defaults = {"grid": grid, "algorithm": algorithm, "filter_groups": filter_groups} if grid else None
    model = Model.from_spec(name, comm=comm, backend="numpy", seed=0, defaults=defaults,
                            **(SMALL[name] if isinstance(name, str) else {}))
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 16, 16)).astype(numpy.float32), rng.integers(0, 10, 8)
    optimizer = SGD(model.bind(x.shape), 0.1)   # bound first: an auto conv's weight layout is its choice's
    step(model, optimizer, x, y)        # the first step may do one-off work; the second is measured
    check_records(comm, lambda: step(model, optimizer, x, y), model.records(), f"{name!s:.40} on {grid} ({algorithm})",
                  ordered=False)
    model.close()


def _runs(size):
    for grid in GRIDS[size]:
        spatial = grid.get("height", 1) * grid.get("width", 1)
        for name in SMALL:
            if spatial <= SPATIAL_LIMIT.get(name, spatial):
                yield name, grid


@on_ranks(1, 2, 3, 4)
def test_a_training_step_makes_the_calls_of_its_layers_records(comm):
    for name, grid in _runs(comm.size):
        _step_records(comm, name, grid, "stationary-y" if grid.get("channel", 1) > 1 else "stationary-x")


@on_ranks(8)
def test_a_training_step_at_8_ranks_makes_the_calls_of_its_layers_records(comm):
    """Every preset at 8 ranks: the shipped digits-cnn on sample x channel x height and on 8
    channel ranks with Stationary-W (p_f = 2 and 4); the others on 2 samples x 4 channels
    (Stationary-X; the grouped ones through the grouped classes)."""
    for grid, algorithm, p_f in (({"sample": 2, "channel": 2, "height": 2}, "stationary-x", None),
                                 ({"channel": 8}, "stationary-w", 2), ({"channel": 8}, "stationary-w", 4)):
        _step_records(comm, "digits-cnn", grid, algorithm, p_f)
    for name in SMALL:
        if name != "digits-cnn":
            _step_records(comm, name, {"sample": 2, "channel": 4}, "stationary-x")


@on_ranks(2, 4)
def test_the_records_of_auto_and_stationary_w_convs_are_the_calls_made(comm):
    for grid, algorithm in (({"channel": comm.size}, "auto"), ({"channel": comm.size}, "stationary-w")):
        _step_records(comm, "digits-cnn", grid, algorithm)


@on_ranks(4)
def test_the_records_of_a_model_on_a_grid_per_layer_are_the_calls_made(comm):
    _step_records(comm, MIXED, None, None)
