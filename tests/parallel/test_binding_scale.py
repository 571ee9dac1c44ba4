"""Binding costs each rank work that depends on its own part, not on the number of ranks (issue 39).

``refconv.sharding.plan_shuffle`` and ``owned_boxes`` intersect only the ranks whose blocks can meet
this rank's; the old all-ranks algorithms are kept here as slow references, and the new ones must
give the same plans on random grids and layouts.
"""

import itertools

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import halo, sharding
from refconv.distribution import Distribution, Split, block_range
from refconv.grid import axes_of


# -- the old algorithms, O(K) per rank: the references ---------------------------------------------------------------
def owned_boxes_reference(dist, rank):
    coords = dist.coords_of(rank)
    ndim = len(dist.global_shape)
    per_axis = []
    for a in range(len(dist.grid_shape)):
        dims = [d for d in range(ndim) if dist.axis_of(d) == a]
        if not dims:
            if coords[a] != 0:
                return []
            continue
        tables = {d: dist.blocks(d)[1] for d in dims}
        cells = []
        for combo in itertools.product(*[tables[d][coords[a]] for d in dims]):
            owner = min(c for c in range(dist.grid_shape[a]) if all(j in tables[d][c] for d, j in zip(dims, combo)))
            if owner == coords[a]:
                cells.append(dict(zip(dims, combo)))
        per_axis.append((dims, cells))
    segments = [{s[0]: s for s in sharding._segments(dist, coords, d)} for d in range(ndim)]
    boxes = []
    for choice in itertools.product(*[cells for _, cells in per_axis]):
        box = [None] * ndim
        for cell in choice:
            for d, j in cell.items():
                box[d] = segments[d][block_range(dist.global_shape[d], dist.blocks(d)[0], j)[0]]
        for d in range(ndim):
            if box[d] is None:
                box[d] = (0, dist.global_shape[d], 0)
        boxes.append(tuple(box))
    return boxes


def plan_shuffle_reference(src, dst, rank):
    size = int(numpy.prod(src.grid_shape))
    mine = owned_boxes_reference(src, rank)
    return ([sharding._plan(mine, dst, q) for q in range(size)],
            [sharding._plan(owned_boxes_reference(src, r), dst, rank) for r in range(size)])


# -- random layouts -----------------------------------------------------------------------------------------------------
GRIDS = [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (2, 2, 1, 1), (1, 2, 2, 1), (4, 1, 1, 1), (1, 4, 1, 1), (2, 1, 2, 2),
         (1, 1, 2, 2), (1, 8, 1, 1), (2, 4, 1, 1), (4, 2, 2, 1), (2, 2, 2, 2), (1, 4, 2, 2), (8, 2, 1, 1), (2, 4, 2, 2)]


@st.composite
def layouts(draw, size=None):
    """A Distribution of a 4-D tensor on a grid of ``size`` ranks: each dim split over an axis, replicated,
    or (the channel dim) split the Stationary-W way."""
    grid = draw(st.sampled_from([g for g in GRIDS if size is None or numpy.prod(g) == size]))
    shape = tuple(draw(st.integers(8, 13)) for _ in range(4))
    axes = list(axes_of(4))
    dims = [draw(st.sampled_from([None, axes[d]])) if grid[d] > 1 else draw(st.sampled_from([None, axes[d]]))
            for d in range(4)]
    P_c = grid[1]
    if P_c > 1 and draw(st.booleans()):
        p_f = draw(st.sampled_from([p for p in (1, 2, 4) if P_c % p == 0]))
        if draw(st.booleans()):
            dims[0], dims[1] = Split.stationary_w_filters(P_c, p_f), Split.stationary_w_channels(P_c, p_f)
        else:
            dims[1] = Split.stationary_w_channels(P_c, p_f)
    return Distribution(grid, shape, tuple(dims))


@st.composite
def pairs(draw):
    src = draw(layouts())
    dst = draw(layouts(int(numpy.prod(src.grid_shape))))
    dst = Distribution(dst.grid_shape, src.global_shape, dst.dims)
    return src, dst


@settings(max_examples=40, deadline=None)
@given(pairs())
def test_plan_shuffle_matches_the_all_ranks_reference(pair):
    src, dst = pair
    for rank in range(int(numpy.prod(src.grid_shape))):
        assert sharding.owned_boxes(src, rank) == owned_boxes_reference(src, rank)
        shuffle = sharding.plan_shuffle(src, dst, rank)
        assert ([list(p) for p in shuffle.sends], [list(p) for p in shuffle.receives]) == \
            plan_shuffle_reference(src, dst, rank)      # (an empty plan is a shared (), the reference's a [])
        assert sharding.send_counts(src, dst, rank) == [sharding._plan_size(p) for p in shuffle.sends]


def test_block_of_inverts_block_range():
    for length in range(1, 30):
        for parts in range(1, length + 1):
            for j in range(parts):
                s, e = block_range(length, parts, j)
                assert all(sharding.block_of(length, parts, x) == j for x in range(s, e))


def test_plan_shuffle_work_is_local(monkeypatch):
    """Weak scaling (the same per-rank block): rank 5 plans as many pieces at 256 ranks as at 64."""
    calls = []
    plan = sharding._plan
    monkeypatch.setattr(sharding, "_plan", lambda boxes, dst, q: calls.append(q) or plan(boxes, dst, q))
    counted = []
    for K in (64, 256):
        src = Distribution((K, 1, 1, 1), (2 * K, 32, 16, 16), ("sample", "channel", "height", "width"))
        dst = Distribution((K // 16, 4, 2, 2), (2 * K, 32, 16, 16), ("sample", "channel", "height", "width"))
        calls.clear()
        shuffle = sharding.plan_shuffle(src, dst, 5)
        nonempty = sum(bool(p) for p in shuffle.sends) + sum(bool(p) for p in shuffle.receives)
        counted.append(len(calls))
        assert len(calls) <= 2 * nonempty, (K, len(calls), nonempty)
    assert counted[0] == counted[1], counted


@st.composite
def halo_geometries(draw):
    """A spatial grid of 2 or 3 axes and a convolution whose output has a row per rank at least."""
    ndim = draw(st.sampled_from([2, 3]))
    grid = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    kernel = tuple(draw(st.integers(1, 5)) for _ in range(ndim))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(ndim))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(ndim))
    padding = tuple(draw(st.integers(0, 3)) for _ in range(ndim))
    size = tuple(draw(st.integers(max(4, d * (k - 1) + 1), 14)) for k, d in zip(kernel, dilation))
    out = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in zip(size, padding, dilation, kernel, stride))
    grid = tuple(min(g, o, n) for g, o, n in zip(grid, out, size))
    mode = draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
    return grid, size, out, kernel, stride, padding, dilation, mode


def _same_piece(a, b):
    return a.shape == b.shape and all(
        (x == y) if isinstance(x, slice) and isinstance(y, slice) else
        (not isinstance(x, slice) and not isinstance(y, slice) and numpy.array_equal(x, y))
        for x, y in zip(a.win + a.own, b.win + b.own))


@settings(max_examples=30, deadline=None)
@given(halo_geometries())
def test_halo_pieces_of_a_rank_match_the_all_pairs_plan(geometry):
    grid, size, out, kernel, stride, padding, dilation, mode = geometry
    if mode == "reflect" and any(p >= n for p, n in zip(padding, size)):
        padding = tuple(min(p, n - 1) for p, n in zip(padding, size))
    _, _, pieces = halo.halo_plan(grid, size, out, kernel, stride, padding, dilation, mode)
    for me in range(int(numpy.prod(grid))):
        mine = halo.halo_pieces_of(me, grid, size, out, kernel, stride, padding, dilation, mode)
        expected = {k: p for k, p in pieces.items() if me in k}
        assert list(mine) == list(expected)                        # the same pairs, in the same order
        assert all(_same_piece(mine[k], expected[k]) for k in expected)
        for new, old in zip(halo.exchanges(mine, me), halo.exchanges(pieces, me)):
            assert list(new) == list(old)


def test_the_stationary_w_splits_are_tabulated_once_per_process():
    """Their tables have one entry per channel coordinate (P_c): made per layer on every rank, they cost
    O(P_c) a layer on each of K ranks (1.4 s of model building a rank at 1024 ranks); shared, once."""
    for make in (Split.stationary_w_filters, Split.stationary_w_channels):
        first, again = make(64, 4), make(64, 4)
        assert first is again and first.table(64) == make(64, 4).table(64)
        assert make(64, 2) is not first and make(64, 2).table(64) != first.table(64)
    filters, channels = Split.stationary_w_filters(8, 2).table(8)[1], Split.stationary_w_channels(8, 2).table(8)[1]
    assert filters[5] == (4, 5, 6, 7) and channels[5] == (1, 5)   # c = a p_c' + b with p_c' = 4: a = 1, b = 1
