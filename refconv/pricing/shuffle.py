"""The price of the shuffle between two grids: ``refconv.sharding.redistribute``, an uneven all-to-all,
forward and reverse, between consecutive stages of a plan on different grids (the planner's
``shuffle[g, g']``, :class:`refconv.pricing.search.Planner`)."""

import math

import numpy

from refconv.distribution import block_size
from refconv.pricing.perf import ITEMSIZE


def _first_block_peers(L, p_src, p_dst):
    """(rows of block 0 under p_src, blocks of p_dst that block 0 of p_src meets)."""
    e = block_size(L, p_src, 0)
    base, extra = divmod(L, p_dst)
    meets = sum(1 for j in range(p_dst) if j * base + min(j, extra) < e)
    return e, meets


def shuffle_matrix(shape, grid_list, machine):
    """``(G, G)`` seconds of moving an activation of global ``shape`` from grid i to grid j
    and back (forward all-to-all, backward the reverse), on rank 0.

    Rank 0 has coordinate 0 on both grids, so its source and destination blocks both
    start at element 0 of every dim: it keeps ``prod(min(block_src, block_dst))``,
    sends the rest of its block and receives the rest of its new one, to and from
    the ranks whose destination blocks meet its source block.  (The exact per-rank
    counts come from ``refconv.sharding``; tests check this against them.)
    """
    P = math.prod(grid_list[0])
    g = numpy.array(grid_list)  # (G, 4)
    size = numpy.ones((len(grid_list), 1))
    keep = numpy.ones((len(grid_list), len(grid_list)))
    peers = numpy.ones_like(keep)
    for d, L in enumerate(shape):
        parts = sorted(set(g[:, d]))
        index = {p: i for i, p in enumerate(parts)}
        rows = numpy.array([block_size(L, p, 0) for p in parts], float)
        meets = numpy.array([[_first_block_peers(L, a, b)[1] for b in parts] for a in parts], float)
        ia = numpy.array([index[p] for p in g[:, d]])
        size = size * rows[ia][:, None]
        keep = keep * numpy.minimum(rows[ia][:, None], rows[ia][None, :])
        peers = peers * meets[ia][:, ia]
    sent = (size - keep) * ITEMSIZE  # (G, G): rows are sources
    received = (size.T - keep) * ITEMSIZE
    peers = peers - 1
    intra = P <= machine.ranks_per_node
    a = machine.comm_seconds("alltoallv", P, 0, 1, intra=intra)
    b = machine.comm_seconds("alltoallv", P, 1, 0, intra=intra)
    pack = machine.compute["pack"]
    moved = sent + received
    one_way = peers * a + numpy.maximum(sent, received) * b + numpy.where(moved > 0, pack.t0 + moved / pack.rate, 0)
    out = 2 * one_way
    numpy.fill_diagonal(out, 0.0)
    return out
