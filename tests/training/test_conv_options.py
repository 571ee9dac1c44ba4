"""torch.nn.Conv2d's options end to end, serially: padding strings in model files, the planner
and the cost model, and padding modes in the one-rank halo (the distributed property tests
draw them too: tests/on_ranks/test_distconv.py)."""

import numpy
import pytest
from hypothesis import given, settings
from mpi4py import MPI

from refconv import Model, algorithms, checks, cost_model
from refconv.halo import Halo
from refconv.pricing import choose_for_layer, graph
from refconv import reference as ref
from refconv.reference import padding
from refconv.testing.strategies import PADDING_MODES, conv_problems

SAME_EVEN = {"in_channels": 2, "layers": [
    {"type": "conv", "out": 3, "kernel": [2, 4], "padding": "same", "dilation": [1, 2], "padding_mode": "reflect"},
    {"type": "conv", "out": 3, "kernel": 3, "padding": "valid"},
    {"type": "gap"}, {"type": "linear", "out": 2}]}


def test_padding_strings_in_a_model_file_and_the_planner():
    model = Model.from_spec(SAME_EVEN, serial=True, backend="numpy", dtype=numpy.float64)
    x = numpy.random.default_rng(0).standard_normal((2, 2, 7, 6))
    first = model.layers[0]
    assert first.forward(x).shape == (2, 3, 7, 6)  # 'same': the output is as large as the input
    assert first.padding_mode == "reflect"
    numpy.testing.assert_allclose(first.forward(x), ref.conv2d_forward(x, first.weight, first.bias, padding="same",
                                                                       dilation=(1, 2), padding_mode="reflect"))
    stages = graph.bind(SAME_EVEN, x.shape)
    assert [s.main.out_shape for s in stages[:2]] == [(2, 3, 7, 6), (2, 3, 5, 4)]


def test_cost_model_takes_padding_strings():
    """'same' with a 4-row kernel reads 1 row above and 2 below: the halo of a rank in the middle
    of a height split is 1 row to the rank above and 2 to the rank below, each way."""
    calls = cost_model.layer_records("stationary-x", (1, 1, 12, 5), 1, (4, 1), padding="same", bias=False,
                                     grid_shape=(1, 1, 3, 1), coords=(0, 0, 1, 0), itemsize=1)
    assert [(c.kind, c.bytes, c.messages) for c in calls if c.kind == "halo"] == [("halo", 3 * 5, 2)] * 2


@settings(max_examples=60)
@given(conv_problems(max_extra=5, padding_strings=True, padding_modes=PADDING_MODES))
def test_one_rank_halo_window_is_the_padded_image(problem):
    """On one rank the window is the input padded by padding_mode (the reference's numpy.pad,
    an oracle independent of refconv.halo.source_index), and reduce is extend's adjoint."""
    p = problem
    x, _, _, _ = p.arrays(seed=8)
    stride, low, dilation, _, out_hw = checks.conv_geometry(p.x_shape, p.w_shape, p.stride, p.padding, p.dilation,
                                                            p.groups)
    halo = Halo(MPI.COMM_SELF, (1, 1), (p.H, p.W), out_hw, (p.Kh, p.Kw), stride, low, dilation, p.padding_mode)
    pads = checks.conv_padding(p.padding, (p.Kh, p.Kw), stride, dilation)
    if p.padding_mode == "zeros":
        x_pad = numpy.pad(x, ((0, 0), (0, 0)) + pads)  # rows [-top, H + bottom), columns likewise
    else:
        x_pad = padding.pad(x, pads, p.padding_mode)
    win = halo.window[0]
    x_win = halo.extend(x, numpy)
    rows, cols = slice(win.h0 + pads[0][0], win.h1 + pads[0][0]), slice(win.w0 + pads[1][0], win.w1 + pads[1][0])
    numpy.testing.assert_array_equal(x_win, x_pad[:, :, rows, cols])
    d = numpy.random.default_rng(9).standard_normal(x_win.shape)
    lhs, rhs = float((x_win * d).sum()), float((x * halo.reduce(d, numpy)).sum())
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))


def test_records_take_the_name_the_chooser_returns_for_a_grouped_layer():
    geom = algorithms.ConvGeometry.of((2, 8, 6, 6), (8, 1, 3, 3), groups=8, padding=1)
    name, p_f, table = choose_for_layer((2, 8, 6, 6), 8, (3, 3), grid_shape=(1, 2, 1, 1), padding=(1, 1), groups=8,
                                        machine="v100-edr")
    calls = algorithms.records(name, geom, (1, 2, 1, 1), (0, 0, 0, 0), p_f)
    assert name == "grouped" and [c.kind for c in calls] == ["allreduce", "allreduce"]  # no channel collective
    assert set(table) == {("grouped", None)}


def test_filter_groups_error_offers_only_divisors_of_a_spanned_group():
    """groups=2 on channel=8 (a group spans 4 ranks): a p_f that divides neither P_c nor 4 is
    refused with the divisors of 4, not of P_c (8 would then be refused in turn)."""
    for p_f in (3, 8):
        with pytest.raises(ValueError, match=r"expected a divisor of grid\.P_c/groups=4 .*\(one of \[1, 2, 4\]\)"):
            algorithms.resolve("stationary-w", 8, p_f, 2, (16, 16))
    assert algorithms.resolve("stationary-w", 8, 2, 2, (16, 16))[1] == 2
    with pytest.raises(ValueError, match=r"expected a divisor of grid\.P_c=8 \(one of \[1, 2, 4, 8\]\)"):
        algorithms.resolve("stationary-w", 8, 3)  # ungrouped: the whole channel group
