"""scatter / gather / allgather / redistribute for drawn grids and distributions, on 1 to 8
simulated ranks (refconv.simulated).

Hypothesis draws each grid, shape and pair of distributions in the test's thread; then every
rank runs the example; checks are collective.
"""

import numpy
from hypothesis import given, settings, strategies as st

import refconv.sharding as sc
from refconv.distribution import Distribution, Split
from refconv.grid import AXES, ProcessGrid
from refconv.testing.asserts import assert_all_ranks
from refconv import simulated
from refconv.testing.ranks import on_ranks

from .test_grid import factorizations

SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
EXAMPLES = 25


@st.composite
def dim_specs(draw, grid_shape):
    """Four per-dim specs: each grid axis splits at most one dim, except that the
    channel axis may split two dims the Stationary-W way (F contiguous, C strided)."""
    slots = draw(st.permutations(list(AXES) + [None] * 4))[:4]
    specs = list(slots)
    P_c = grid_shape[1]
    if "channel" in specs:
        i = specs.index("channel")
        p_f = draw(st.sampled_from([d for d in range(1, P_c + 1) if P_c % d == 0]))
        mode = draw(st.sampled_from(["block", "w_channels", "w_pair"]))
        if mode == "w_channels":
            specs[i] = Split.stationary_w_channels(P_c, p_f)
        elif mode == "w_pair" and None in specs:
            specs[i] = Split.stationary_w_filters(P_c, p_f)
            specs[specs.index(None)] = Split.stationary_w_channels(P_c, p_f)
    return tuple(specs)


def _nblocks(spec, grid_shape):
    if spec is None:
        return 1
    if isinstance(spec, str):
        return grid_shape[AXES.index(spec)]
    return spec.nblocks


@st.composite
def distribution_pairs(draw, size):
    """(src, dst): two distributions of one global shape, blocks uneven by construction."""
    grid_shape = draw(st.sampled_from(factorizations(size)))
    src, dst = draw(dim_specs(grid_shape)), draw(dim_specs(grid_shape))
    shape = tuple(max(_nblocks(a, grid_shape), _nblocks(b, grid_shape))
                  + draw(st.integers(0, 3)) for a, b in zip(src, dst))
    return (Distribution(grid_shape, shape, src), Distribution(grid_shape, shape, dst))


def _global(dist, dtype):
    """0, 1, 2, ... laid out in ``dist``'s global shape: every element tells where it came from."""
    return numpy.arange(numpy.prod(dist.global_shape), dtype=dtype).reshape(dist.global_shape)


def _grid(comm, dist):
    return ProcessGrid(comm, **dict(zip(AXES, dist.grid_shape)))


def _roundtrip(comm, dist):
    grid, x = _grid(comm, dist), _global(dist, numpy.float64)
    loc = sc.scatter(x if grid.rank == 0 else None, dist, grid)
    assert_all_ranks(comm, numpy.array_equal(loc, dist.extract(x, grid.rank)),
                     f"scatter wrong under {dist}")
    back = sc.gather(loc, dist, grid)
    assert_all_ranks(comm, numpy.array_equal(back, x) if grid.rank == 0 else back is None,
                     f"gather wrong under {dist}")
    every = sc.allgather(loc, dist, grid)
    assert_all_ranks(comm, numpy.array_equal(every, x), f"allgather wrong under {dist}")
    grid.free()


@on_ranks(*SIZES)
@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_scatter_gather_allgather_roundtrip(ranks, data):
    dist, _ = data.draw(distribution_pairs(ranks))
    simulated.run(_roundtrip, ranks, args=(dist,))


def _redistribute(comm, src, dst):
    grid, x = _grid(comm, src), _global(src, numpy.float32)
    out = sc.redistribute(src.extract(x, grid.rank), src, dst, grid)
    assert_all_ranks(grid.comm, numpy.array_equal(out, dst.extract(x, grid.rank)),
                     f"redistribute {src} -> {dst} wrong")
    grid.free()


@on_ranks(*SIZES)
@settings(max_examples=EXAMPLES)
@given(data=st.data())
def test_redistribute_matches_extract(ranks, data):
    simulated.run(_redistribute, ranks, args=data.draw(distribution_pairs(ranks)))


@on_ranks(1, 2, 3, 4, 8)
def test_stationary_w_weight_layout(comm):
    """P_c = 4 (or the world size), p_f = 2: rank (a, b) holds w[F_a, C_b], C_b non-contiguous."""
    P_c = comm.size if comm.size < 4 else 4
    p_f = 2 if P_c % 2 == 0 else 1
    grid = ProcessGrid(comm, sample=comm.size // P_c, channel=P_c)
    F, C = 2 * P_c + 1, 2 * P_c + 3
    wdist = Distribution(grid, (F, C, 3, 3), (Split.stationary_w_filters(P_c, p_f),
                                              Split.stationary_w_channels(P_c, p_f), None, None),
                         names=("F", "C", "Kh", "Kw"))
    w = numpy.random.default_rng(0).standard_normal((F, C, 3, 3))
    w_loc = sc.scatter(w if grid.rank == 0 else None, wdist, grid)
    p_cp = P_c // p_f
    a, b = divmod(grid.coords[1], p_cp)
    f_blocks = numpy.array_split(numpy.arange(F), P_c)
    c_blocks = numpy.array_split(numpy.arange(C), P_c)
    F_a = numpy.concatenate([f_blocks[a * p_cp + j] for j in range(p_cp)])
    C_b = numpy.concatenate([c_blocks[k * p_cp + b] for k in range(p_f)])
    assert_all_ranks(comm, numpy.array_equal(w_loc, w[numpy.ix_(F_a, C_b)]),
                     "stationary-W weight block wrong")
    assert_all_ranks(comm, numpy.array_equal(sc.allgather(w_loc, wdist, grid), w), "allgather")
    # the shuffle between Stationary-X weights (C split) and Stationary-W weights, both ways
    xdist = Distribution(grid, (F, C, 3, 3), (None, "channel", None, None))
    to_x = sc.redistribute(w_loc, wdist, xdist, grid)
    assert_all_ranks(comm, numpy.array_equal(to_x, xdist.extract(w, grid.rank)), "W -> X")
    back = sc.redistribute(to_x, xdist, wdist, grid)
    assert_all_ranks(comm, numpy.array_equal(back, w_loc), "X -> W")
    grid.free()
