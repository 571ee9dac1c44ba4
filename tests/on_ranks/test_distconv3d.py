"""DistConv3d against the serial 3-D reference (refconv.reference.conv3d_*), forward,
backward-data and backward-filter, and its communication against its ``records()``.

Drawn volumes and grids ``sample x channel x depth x height x width`` at 1 to 8 simulated
ranks (refconv.simulated; every stride, padding, padding mode and dilation, uneven blocks);
every grid of 4 and of 8 ranks, each with Stationary-X, -Y and -W (every ``p_f``).  Hypothesis
draws each example in the test's thread, then every rank runs it; the checks are collective.
"""

import itertools
import shutil
import tempfile

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import checkpoint, simulated
from refconv.distribution import Distribution
from refconv.grid import ProcessGrid, axes_of
from refconv.layers import DistConv3d
from refconv.model import Model
from refconv.sharding import allgather, redistribute
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import case_layer, check_layer, check_records
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import Conv3dProblem, dist_conv3d_cases

EXAMPLES = 25


def check_calls(comm, layer, problem):
    """One forward and backward make the calls ``layer.records()`` lists: the halo exchange and
    return (faces, edges and corners: bytes and messages), the channel collectives, the
    segmented allreduce."""
    x, _, _, dy = problem.arrays(seed=3)
    x_loc = layer.input_distribution.extract(x, layer.grid.rank)
    dy_loc = layer.output_distribution.extract(dy, layer.grid.rank)
    check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), layer.records(), repr(layer))


def check_case(comm, case):
    """On every rank: the drawn case's layer against the serial reference, and its calls."""
    layer = case_layer(comm, case)
    check_layer(layer, case.problem)
    check_calls(comm, layer, case.problem)
    layer.grid.free()


@on_ranks(1, 2, 3, 4, 5, 6, 7, 8)
@settings(max_examples=EXAMPLES)
@given(st.data())
def test_drawn_volumes_and_grids(ranks, data):
    simulated.run(check_case, ranks, args=(data.draw(dist_conv3d_cases(ranks)),))


@on_ranks(4)
def test_a_corner_comes_from_the_diagonal_neighbour(comm):
    """On 2 x 2 x 1 spatial ranks (depth x height x width), the edge of a 3x3x3 window that lies
    diagonally across is owned by the rank there: one plane by one row by every column, its own
    message, besides the two face neighbours'."""
    problem = Conv3dProblem(N=1, C=2, F=3, size=(4, 5, 3), kernel=(3, 3, 3), padding=(1, 1, 1))
    grid = ProcessGrid(comm, depth=2, height=2)
    layer = DistConv3d(2, 3, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64)
    layer.bind(problem.x_shape)
    halo = layer._algo.halo
    me = halo.me
    diagonal = 3 - me  # (d, h) -> (1 - d, 1 - h)
    piece = halo.pieces.get((diagonal, me))
    assert_all_ranks(comm, piece is not None and piece.shape == (1, 1, 3) and len(halo.receives) == 3,
                     f"rank {me}: diagonal piece {piece}, {len(halo.receives)} neighbours")
    check_layer(layer, problem)
    check_calls(comm, layer, problem)
    grid.free()


def grids_of(size):
    """Every ``(P_N, P_c, P_D, P_H, P_W)`` whose product is ``size``."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    return [s for s in itertools.product(divisors, repeat=5) if numpy.prod(s) == size]


@on_ranks(4, 8)
def test_every_grid_of_four_and_of_eight_ranks_with_x_y_and_w(comm):
    """Every grid of 8 ranks (35 of them: 2x2x2 spatial, 2 channels x 2x2 spatial, 8 depth, ...),
    and of 4 ranks (15), on a layer that every one of them divides, with uneven blocks wherever an
    axis is split: Stationary-X, -Y and -W (sample/spatial where P_c = 1); the calls against
    records() on every grid with X.  8 ranks share one process, so the shapes are tiny."""
    for shape in grids_of(comm.size):
        P_N, P_c, P_D, P_H, P_W = shape
        # out = in along depth, in - 2 along height (dilation 2), about in / 2 along width (stride 2)
        problem = Conv3dProblem(N=P_N + 1, C=P_c + 1, F=P_c + 2, size=(P_D + 1, P_H + 3, 2 * P_W + 1),
                                kernel=(3, 3, 2), stride=(1, 1, 2), padding=(1, 1, 0), dilation=(1, 2, 1))
        runs = [("stationary-x", None)]
        if P_c > 1:  # W with each p_f strictly between X's (1) and Y's (P_c), else with p_f = P_c
            p_fs = [p_f for p_f in range(2, P_c) if P_c % p_f == 0] or [P_c]
            runs += [("stationary-y", None)] + [("stationary-w", p_f) for p_f in p_fs]
        grid = ProcessGrid(comm, **dict(zip(axes_of(5), shape)))
        for algorithm, p_f in runs:
            layer = DistConv3d(problem.C, problem.F, problem.kernel, stride=problem.stride, padding=problem.padding,
                               dilation=problem.dilation, grid=grid, algorithm=algorithm, filter_groups=p_f,
                               backend="numpy", dtype=numpy.float64)
            check_layer(layer, problem)
            if algorithm == "stationary-x":
                check_calls(comm, layer, problem)
        grid.free()


@on_ranks(4)
def test_redistribute_between_grids_of_volumes(comm):
    """A volume's activations moved between 3-D grids (depth x height, channel x width, sample x
    depth) and back: each rank's block is then its block of the global volume, uneven blocks too."""
    shape = (3, 5, 5, 6, 7)
    x = numpy.arange(numpy.prod(shape), dtype=numpy.float64).reshape(shape)
    grids = [(1, 1, 2, 2, 1), (1, 2, 1, 1, 2), (2, 1, 2, 1, 1)]
    dists = [Distribution.activations(g, shape) for g in grids]
    grid = ProcessGrid(comm, **dict(zip(axes_of(5), grids[0])))
    local = dists[0].extract(x, comm.rank)
    for src, dst in zip(dists, dists[1:] + dists[:1]):
        local = redistribute(local, src, dst, grid)
        assert_all_ranks(comm, numpy.array_equal(local, dst.extract(x, comm.rank)), f"{src} -> {dst}")
    grid.free()


@on_ranks(4)
def test_sharded_checkpoint_of_a_volume_layer_loads_on_another_grid(comm):
    """A DistConv3d saved from a depth x height grid (Stationary-X) and loaded into one on a
    channel x width grid (Stationary-W): every rank then holds its shard of the same global
    weight and bias."""
    rng = numpy.random.default_rng(4)
    w, b = rng.standard_normal((6, 4, 3, 2, 3)), rng.standard_normal(6)
    saved = DistConv3d(4, 6, (3, 2, 3), grid=ProcessGrid(comm, depth=2, height=2), backend="numpy",
                       dtype=numpy.float64)
    saved.set_global_parameters(w, b)
    loaded = DistConv3d(4, 6, (3, 2, 3), grid=ProcessGrid(comm, channel=2, width=2), algorithm="stationary-w",
                        filter_groups=2 if comm.size > 2 else 1, backend="numpy", dtype=numpy.float64, seed=1)
    directory = comm.bcast(tempfile.mkdtemp(prefix="refconv-ck3d-") if comm.rank == 0 else None, root=0)
    checkpoint.save(directory, Model([saved]), step=3)
    step, _ = checkpoint.load(directory, Model([loaded]))
    weight = allgather(loaded.weight, loaded.weight_distribution, loaded.grid)
    bias = allgather(loaded.bias.reshape(-1, 1, 1, 1), loaded.bias_distribution, loaded.grid).reshape(-1)
    assert_all_ranks(comm, step == 3 and numpy.array_equal(weight, w) and numpy.array_equal(bias, b),
                     "the loaded shards are not the saved layer's")
    comm.Barrier()  # every rank has loaded before rank 0 removes the files
    if comm.rank == 0:
        shutil.rmtree(directory)
    saved.grid.free(), loaded.grid.free()


@on_ranks(4)
def test_grouped_volumes_on_a_channel_split(comm):
    """Grouped 3-D convolutions where channels are split: whole groups per rank ("grouped", with a
    depth split too), and groups spanning ranks (X, Y and W within each group's ranks)."""
    for groups, algorithm, p_f, sizes in [(4, "stationary-x", None, dict(channel=2, depth=2)),
                                          (2, "stationary-x", None, dict(channel=4)),
                                          (2, "stationary-y", None, dict(channel=4)),
                                          (2, "stationary-w", 2, dict(channel=4))]:
        problem = Conv3dProblem(N=2, C=8, F=8, size=(4, 3, 5), kernel=(3, 1, 3), padding=(1, 0, 1), groups=groups)
        grid = ProcessGrid(comm, **sizes)
        layer = DistConv3d(8, 8, problem.kernel, padding=problem.padding, groups=groups, grid=grid, algorithm=algorithm,
                           filter_groups=p_f, backend="numpy", dtype=numpy.float64)
        check_layer(layer, problem)
        check_calls(comm, layer, problem)
        grid.free()


@on_ranks(4)
def test_auto_chooses_among_x_y_and_w_with_the_planner_and_runs_its_choice(comm):
    """``algorithm='auto'`` on ``channel=2 x depth=2``: bound, the layer prices X, Y and W on the
    five-axis grid (the chooser's table names each), runs the cheapest, and matches the serial
    reference and its records."""
    problem = Conv3dProblem(N=2, C=4, F=6, size=(4, 3, 3), kernel=(3, 3, 3), padding=(1, 1, 1))
    grid = ProcessGrid(comm, channel=2, depth=2)
    layer = DistConv3d(4, 6, 3, padding=1, grid=grid, algorithm="auto", machine="v100-edr", backend="numpy",
                       dtype=numpy.float64)
    layer.bind(problem.x_shape)
    priced = {algorithm for algorithm, _ in layer.cost_estimates}
    cheapest = min(layer.cost_estimates, key=layer.cost_estimates.get)
    assert_all_ranks(comm, priced >= {"stationary-x", "stationary-y"} and layer.algorithm == cheapest[0]
                     and layer.filter_groups == cheapest[1], f"{layer.cost_estimates} -> {layer.algorithm}")
    check_layer(layer, problem)
    check_calls(comm, layer, problem)
    grid.free()
