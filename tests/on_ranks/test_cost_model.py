"""Each algorithm's ``records()``, which the cost model prices, lists call for call, in
order, what CommStats measures: any grid, halos included, on 1 to 8 simulated ranks
(refconv.simulated)."""

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import simulated
from refconv.layers import DistConv2d
from refconv.cost_model import layer_records
from refconv.grid import ProcessGrid
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import check_layer, check_records
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem, dist_conv_cases


def predicted_calls_equal_measured_calls(comm, case):
    p = case.problem
    grid = ProcessGrid(comm, **case.grid_kwargs())
    layer = DistConv2d(p.C, p.F, (p.Kh, p.Kw), grid=grid, backend="numpy", input_shape=p.x_shape, **case.layer_kwargs())
    x, w, b, dy = p.arrays()
    predicted = layer_records(
        case.algorithm, p.x_shape, p.F, (p.Kh, p.Kw), stride=p.stride, padding=p.padding, dilation=p.dilation,
        groups=p.groups, grid_shape=case.grid_shape, coords=grid.coords, filter_groups=case.filter_groups,
        itemsize=numpy.dtype(p.dtype).itemsize, padding_mode=p.padding_mode)
    assert_all_ranks(comm, predicted == layer.records(), f"{case}\npredicted {predicted}\nlayer     {layer.records()}")
    x_loc, dy_loc = layer.input_distribution.extract(x, grid.rank), layer.output_distribution.extract(dy, grid.rank)
    check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), predicted, str(case))
    grid.free()


@on_ranks(1, 2, 3, 4, 5, 6, 7, 8)
@settings(max_examples=30)
@given(st.data())
def test_predicted_calls_equal_measured_calls(ranks, data):
    case = data.draw(dist_conv_cases(ranks, dtypes=("float32", "float64"), grouped_channel_split=True))
    simulated.run(predicted_calls_equal_measured_calls, ranks, args=(case,))


@on_ranks(4)
def test_auto_picks_the_cheapest_and_computes_the_same(comm):
    problem = ConvProblem(N=2, C=8, F=8, H=6, W=6, Kh=3, Kw=3, padding=(1, 1))
    grid = ProcessGrid(comm, channel=4)
    layer = DistConv2d(8, 8, 3, padding=1, grid=grid, algorithm="auto", backend="numpy", dtype=numpy.float64,
                       input_shape=problem.x_shape)
    best = min(layer.cost_estimates.values())
    chosen = layer.cost_estimates[(layer.algorithm, layer.filter_groups)]
    assert_all_ranks(comm, chosen == best and layer.algorithm == "stationary-w" and layer.filter_groups == 2,
                     f"chose {layer.algorithm} p_f={layer.filter_groups} from {layer.cost_estimates}")
    check_layer(layer, problem)
    grid.free()
