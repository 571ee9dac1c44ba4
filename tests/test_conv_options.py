"""torch.nn.Conv2d's options end to end, serially: padding strings in model files, the planner
and the cost model (the distributed property tests draw them too: tests/mpi/test_distconv.py)."""

import numpy

from refconv import Model, cost_model
from refconv.plan import graph

SAME_EVEN = {"in_channels": 2, "layers": [
    {"type": "conv", "out": 3, "kernel": [2, 4], "padding": "same", "dilation": [1, 2]},
    {"type": "conv", "out": 3, "kernel": 3, "padding": "valid"},
    {"type": "gap"}, {"type": "linear", "out": 2}]}


def test_padding_strings_in_a_model_file_and_the_planner():
    model = Model.from_spec(SAME_EVEN, serial=True, backend="numpy", dtype=numpy.float64)
    x = numpy.random.default_rng(0).standard_normal((2, 2, 7, 6))
    first = model.layers[0]
    assert first.forward(x).shape == (2, 3, 7, 6)  # 'same': the output is as large as the input
    stages = graph.bind(SAME_EVEN, x.shape)
    assert [s.main.out_shape for s in stages[:2]] == [(2, 3, 7, 6), (2, 3, 5, 4)]


def test_cost_model_takes_padding_strings():
    """'same' with a 4-row kernel reads 1 row above and 2 below: the halo of a rank in the middle
    of a height split is 1 row to the rank above and 2 to the rank below, each way."""
    calls = cost_model.layer_records("stationary-x", (1, 1, 12, 5), 1, (4, 1), padding="same", bias=False,
                                     grid_shape=(1, 1, 3, 1), coords=(0, 0, 1, 0), itemsize=1)
    assert [(c.kind, c.bytes, c.messages) for c in calls if c.kind == "halo"] == [("halo", 3 * 5, 2)] * 2
