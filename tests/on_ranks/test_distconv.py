"""DistConv2d against the serial reference, for drawn problems, grids and algorithms, on
simulated ranks (refconv.simulated): Hypothesis draws each example in the test's thread, then
every rank runs it; the checks of refconv.testing.check are collective.
"""

import numpy
from hypothesis import given, settings, strategies as st
import refconv
from refconv import collectives, simulated
from refconv.distribution import Distribution
from refconv.grid import AXES, ProcessGrid
from refconv.layers import DistConv2d
from refconv.testing.asserts import assert_all_ranks, collective_assert_close
from refconv.testing.check import case_layer, check_case, check_layer, run_layer
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem, dist_conv_cases

SIZES = (1, 2, 3, 4)
EXAMPLES = 25


def _drawn_test(algorithm):
    @settings(max_examples=EXAMPLES)
    @given(st.data())
    def test(ranks, data):
        case = data.draw(dist_conv_cases(ranks, algorithms=(algorithm,), grouped_channel_split=True))
        simulated.run(check_case, ranks, args=(case,))

    return test


test_stationary_x_drawn = on_ranks(*SIZES)(_drawn_test("stationary-x"))
test_stationary_y_drawn = on_ranks(*SIZES)(_drawn_test("stationary-y"))
test_stationary_w_drawn = on_ranks(*SIZES)(_drawn_test("stationary-w"))


@on_ranks(2, 4)
@settings(max_examples=10)
@given(st.data())
def test_float32_every_algorithm(ranks, data):
    case = data.draw(dist_conv_cases(ranks, dtypes=("float32",), grouped_channel_split=True))
    simulated.run(check_case, ranks, args=(case,))


@on_ranks(8)
def test_hybrids_at_eight_ranks(comm):
    """sample x channel x height hybrids, Stationary-W with p_f = 2 among them."""
    problem = ConvProblem(N=3, C=7, F=9, H=7, W=5, Kh=3, Kw=3, stride=(1, 2), padding=(1, 1), dilation=(2, 1))
    for shape, algorithm, p_f in [
        ((2, 2, 2, 1), "stationary-x", None),
        ((2, 2, 2, 1), "stationary-y", None),
        ((2, 2, 2, 1), "stationary-w", 2),
        ((1, 4, 2, 1), "stationary-w", 2),
        ((2, 4, 1, 1), "stationary-w", 2),
        ((1, 2, 2, 2), "stationary-x", None),
        ((2, 1, 4, 1), "stationary-x", None),
    ]:
        grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
        layer = DistConv2d(problem.C, problem.F, 3, stride=problem.stride, padding=problem.padding,
                           dilation=problem.dilation, grid=grid, algorithm=algorithm, filter_groups=p_f,
                           backend="numpy", dtype=numpy.float64)
        check_layer(layer, problem)
        grid.free()


@on_ranks(1, 2, 4)
def test_grouped_convolution_sample_and_spatial(comm):
    """groups > 1 with sample and height splits (no channel split)."""
    problem = ConvProblem(N=comm.size + 1, C=4, F=6, H=6, W=5, Kh=3, Kw=3, padding=(1, 1), groups=2)
    for shape in {(comm.size, 1, 1, 1), (1, 1, comm.size, 1)}:
        grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
        layer = DistConv2d(4, 6, 3, padding=1, groups=2, grid=grid, backend="numpy", dtype=numpy.float64)
        check_layer(layer, problem)
        grid.free()


@on_ranks(4)
def test_halo_reaching_past_the_nearest_neighbour(comm):
    """Dilation 3 on 2-row blocks: a rank's window spans several neighbours' rows."""
    problem = ConvProblem(N=1, C=2, F=3, H=9, W=4, Kh=3, Kw=2, padding=(3, 0), dilation=(3, 1))
    grid = ProcessGrid(comm, height=4)
    layer = DistConv2d(2, 3, (3, 2), padding=(3, 0), dilation=(3, 1), grid=grid, backend="numpy", dtype=numpy.float64)
    layer.bind(problem.x_shape)
    window = layer._algo.halo.window
    owned = layer._algo.halo.owned
    reach = max(sum(1 for o in owned if o.intersect(win) is not None) for win in window)
    assert_all_ranks(comm, reach >= 3, f"expected a window spanning >= 3 owners, got {reach}")
    check_layer(layer, problem)
    grid.free()


@on_ranks(4)
def test_padding_modes_fill_from_the_ranks_that_own_the_copies(comm):
    """Every padding_mode on uneven row blocks (3, 2, 2, 2) and on a 2 x 2 grid, with 3 rows of
    'same' padding: rank 0 reflects rows its neighbour owns (a halo wider than its block), and
    circular padding makes the first and last ranks along an axis exchange rows."""
    for mode in ("zeros", "reflect", "replicate", "circular"):
        for shape in ((1, 1, 4, 1), (1, 1, 2, 2), (1, 2, 2, 1)):
            problem = ConvProblem(N=2, C=2, F=4, H=9, W=5, Kh=3, Kw=2, padding="same", dilation=(3, 2),
                                  padding_mode=mode)
            grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
            layer = DistConv2d(2, 4, (3, 2), padding="same", dilation=(3, 2), padding_mode=mode, grid=grid,
                               backend="numpy", dtype=numpy.float64)
            check_layer(layer, problem)
            if shape == (1, 1, 4, 1):
                # a rank's Halo keeps the pieces it sends or receives: rank 3's are every piece of its rows
                halo = layer._algo.halo
                readers_of_last = {r for (s, r) in halo.pieces if s == 3 and r != 3}
                expected = {0, 1, 2} if mode == "circular" else {1, 2}  # rank 0 wraps round to rows 6-8
                ok = readers_of_last == expected if halo.me == 3 else readers_of_last <= expected
                assert_all_ranks(comm, ok, f"{mode}: rank 3 read by {readers_of_last} (on spatial rank {halo.me})")
            grid.free()


def _equivalent(comm, case_a, case_b):
    """Same results and the same communication, kind by kind."""
    results, records = [], []
    for case in (case_a, case_b):
        layer = case_layer(comm, case)
        collectives.stats.reset()
        actual, _ = run_layer(layer, case.problem)
        results.append(actual)
        records.append(sorted((r.kind, r.comm_size, r.bytes) for r in collectives.stats.records if r.comm_size > 1))
        layer.grid.free()
    for name in ("y", "dx", "dw", "db"):
        collective_assert_close(comm, results[0][name], results[1][name], rtol=0, atol=0, name=name)
    assert_all_ranks(comm, records[0] == records[1], f"communication differs:\n{records[0]}\n{records[1]}")


@on_ranks(2, 3, 4)
@settings(max_examples=10)
@given(st.data())
def test_w_with_one_filter_group_is_x_and_with_P_c_is_y(ranks, data):
    case = data.draw(dist_conv_cases(ranks, algorithms=("stationary-x",), axes=("sample", "channel", "height")))
    P_c = case.grid_shape[1]
    W = dict(case.__dict__, algorithm="stationary-w")
    simulated.run(_equivalent, ranks, args=(case, type(case)(**dict(W, filter_groups=1))))
    simulated.run(_equivalent, ranks, args=(type(case)(**dict(case.__dict__, algorithm="stationary-y")),
                                            type(case)(**dict(W, filter_groups=P_c))))


@on_ranks(8)
def test_stationary_w_within_groups_at_eight_ranks(comm):
    """Stationary-W inside each group's ranks: groups=2 on channel=8 (q=4, p_f=2: both W
    collectives on 2 ranks), on sample=2 x channel=4 (q=2, p_f=2: Y within the group),
    groups=4 on channel=8 (q=2, p_f=1: X within the group), and groups=2 on channel=4 x
    height=2 (q=2, p_f=1, with a halo)."""
    for shape, groups, p_f in [((1, 8, 1, 1), 2, 2), ((2, 4, 1, 1), 2, 2), ((1, 8, 1, 1), 4, 1), ((1, 4, 2, 1), 2, 1)]:
        problem = ConvProblem(N=2, C=8, F=16, H=5, W=4, Kh=3, Kw=3, padding=(1, 1), groups=groups)
        grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
        layer = DistConv2d(problem.C, problem.F, 3, padding=1, groups=groups, grid=grid, algorithm="stationary-w",
                           filter_groups=p_f, backend="numpy", dtype=numpy.float64)
        assert_all_ranks(comm, layer.algorithm == "stationary-w" and layer.filter_groups == p_f, layer.algorithm)
        check_layer(layer, problem)
        grid.free()


@on_ranks(8)
@settings(max_examples=8)
@given(st.data())
def test_drawn_at_eight_ranks(ranks, data):
    """Drawn problems on 8 ranks: padding strings and modes, grouped and depthwise layers."""
    case = data.draw(dist_conv_cases(ranks, grouped_channel_split=True, max_extra=2))
    simulated.run(check_case, ranks, args=(case,))


@on_ranks(1, 2, 4)
def test_errors_are_raised_on_every_rank_at_construction(comm):
    grid = ProcessGrid(comm, channel=comm.size)
    messages = []
    for kwargs, match in [
        (dict(algorithm="stationary-z"), "algorithm: expected one of"),
        (dict(algorithm="stationary-w", filter_groups=3 * comm.size), "filter_groups: expected a divisor"),
        (dict(stride=0), "stride: expected positive"),
        (dict(input_shape=(1, 2 * comm.size + 1, 5, 5)), "input_shape: expected C = in_channels"),
        (dict(input_shape=(0, 2 * comm.size, 5, 5)), "refconv does not run empty tensors; skip the call"),
        (dict(padding="same", stride=2), "padding='same' is not supported for strided convolutions"),
        (dict(padding=5, padding_mode="reflect", input_shape=(1, 2 * comm.size, 5, 5)),
         "padding_mode='reflect' needs pads shorter than the input"),
        (dict(padding_mode="mirror"), "padding_mode: expected one of"),
    ]:
        try:
            DistConv2d(comm.size * 2, comm.size * 2, 3, grid=grid, backend="numpy", **kwargs)
            messages.append(f"no error for {kwargs}")
        except ValueError as exc:
            if match not in str(exc):
                messages.append(f"{kwargs}: {exc}")
    if comm.size > 1:  # a group would span ranks: groups not a multiple of P_c
        try:
            DistConv2d(2 * comm.size + 2, 2 * comm.size + 2, 3, groups=comm.size + 1, grid=grid, backend="numpy")
            messages.append("no error for groups not a multiple of P_c")
        except ValueError as exc:
            if "groups: a grouped convolution on a channel split needs every rank to hold whole groups" not in str(exc):
                messages.append(str(exc))
    if comm.size == 4:  # groups=2 spans 2 ranks each: W factors those 2, so p_f=4 divides P_c but not them
        try:
            DistConv2d(8, 8, 3, groups=2, grid=grid, backend="numpy", algorithm="stationary-w", filter_groups=4)
            messages.append("no error for stationary-w with p_f=4 within groups of 2 ranks")
        except ValueError as exc:
            if "filter_groups: expected a divisor of grid.P_c/groups=2 (groups=2 span the ranks) (one of [1, 2]), " \
               "got 4" not in str(exc):
                messages.append(str(exc))
    try:  # a channel block would be empty
        DistConv2d(comm.size - 1 or 1, 4, 3, grid=grid, backend="numpy")
        if comm.size > 1:
            messages.append("no error for in_channels < P_c")
    except ValueError as exc:
        if "a rank's block would be empty" not in str(exc):
            messages.append(str(exc))
    if comm.size > 1:
        sgrid = ProcessGrid(comm, height=comm.size)
        try:
            DistConv2d(2, 2, 3, grid=sgrid, backend="numpy", input_shape=(1, 2, comm.size + 1, 4))
            messages.append("no error for an empty output row block")
        except ValueError as exc:
            if "a rank's block would be empty" not in str(exc):
                messages.append(str(exc))
        sgrid.free()
    everyone = comm.allgather(messages)
    assert_all_ranks(comm, not messages, "; ".join(messages))
    assert_all_ranks(comm, all(m == everyone[0] for m in everyone), "ranks disagree")
    grid.free()


@on_ranks(1, 4)
def test_layer_binds_from_scatter_or_from_local_shapes(comm):
    """Without input_shape: scatter_input binds the layer to x's shape; so does forward."""
    P = comm.size
    grid = ProcessGrid(comm, sample=min(P, 2), channel=P // min(P, 2))
    x = numpy.random.default_rng(0).standard_normal((5, 4, 7, 6))
    ys = []
    for via_scatter in (True, False):
        layer = DistConv2d(4, 6, 3, padding=1, grid=grid, algorithm="stationary-y", dtype=numpy.float64, backend="numpy")
        if via_scatter:
            x_loc = layer.scatter_input(x if comm.rank == 0 else None)
        else:
            x_loc = Distribution.activations(grid, x.shape).extract(x, comm.rank)
        ys.append(refconv.allgather(layer.forward(x_loc), layer.output_distribution, grid))
        assert_all_ranks(comm, layer.input_distribution.global_shape == x.shape, "bound to the wrong shape")
    collective_assert_close(comm, ys[0], ys[1], rtol=0, atol=0, name="y")
    grid.free()


@on_ranks(1, 4)
def test_stationary_w_default_filter_groups_and_unbound_layout_error(comm):
    """Without filter_groups, W takes the divisor of P_c nearest sqrt(P_c) from below."""
    grid = ProcessGrid(comm, channel=comm.size)
    layer = DistConv2d(8, 8, 3, grid=grid, algorithm="stationary-w", backend="numpy")
    expected = {1: 1, 4: 2}[comm.size]
    assert_all_ranks(comm, layer.filter_groups == expected, f"filter_groups {layer.filter_groups} != {expected}")
    try:
        layer.input_distribution.local_shape(comm.rank)
        message = "no error for an unbound layout"
    except ValueError as exc:
        message = "" if "has no input shape yet" in str(exc) else str(exc)
    assert_all_ranks(comm, not message, message)
    grid.free()
