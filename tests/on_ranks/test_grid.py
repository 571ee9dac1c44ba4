"""ProcessGrid on every factorization of the world size: coords, sub-communicators, errors,
on 1 to 8 simulated ranks (refconv.simulated)."""

import itertools

from refconv.grid import AXES, ProcessGrid
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks

SIZES = (1, 2, 3, 4, 5, 6, 7, 8)


def factorizations(p):
    """Every (P_N, P_c, P_H, P_W) with product p."""
    divs = [d for d in range(1, p + 1) if p % d == 0]
    return [s for s in itertools.product(divs, repeat=4)
            if s[0] * s[1] * s[2] * s[3] == p]


def _members(grid, sub):
    """World ranks of ``sub``'s members, in sub-rank order."""
    return sub.allgather(grid.rank)


def _expected(grid, vary):
    """World ranks differing from this one only on ``vary`` axes, row-major order."""
    ranges = [range(grid.shape[i]) if AXES[i] in vary else [grid.coords[i]] for i in range(4)]
    return [grid.rank_of(c) for c in itertools.product(*ranges)]


@on_ranks(*SIZES)
def test_coords_and_sub_communicators(comm):
    for shape in factorizations(comm.size):
        with ProcessGrid(comm, **dict(zip(AXES, shape))) as g:
            ok = (g.shape == shape and (g.P_N, g.P_c, g.P_H, g.P_W) == shape
                  and g.rank_of(g.coords) == g.rank == comm.rank
                  and all(g.rank_of(g.coords_of(r)) == r for r in range(g.size)))
            assert_all_ranks(comm, ok, f"coords wrong on {shape}")
            checks = [(g.channel_comm, ("channel",)),
                      (g.weight_peers_comm, ("sample", "height", "width")),
                      (g.sub_comm(("width", "sample")), ("sample", "width"))]
            checks += [(g.axis_comm(a), (a,)) for a in AXES]
            for sub, vary in checks:
                got = _members(g, sub)
                assert_all_ranks(comm, got == _expected(g, vary),
                                 f"{shape} {vary}: members {got} != {_expected(g, vary)}")
            assert_all_ranks(comm, g.channel_comm.rank == g.coords[1], "channel rank")
            assert_all_ranks(comm, g.sub_comm(("channel",)) is g.channel_comm, "not cached")
            for p_f in [d for d in range(1, g.P_c + 1) if g.P_c % d == 0]:
                p_cp = g.P_c // p_f
                a, b = divmod(g.coords[1], p_cp)
                comm_f, comm_c = g.stationary_w_comms(p_f)
                n, _, h, w = g.coords
                exp_f = [g.rank_of((n, k * p_cp + b, h, w)) for k in range(p_f)]
                exp_c = [g.rank_of((n, a * p_cp + j, h, w)) for j in range(p_cp)]
                assert_all_ranks(comm, _members(g, comm_f) == exp_f and comm_f.rank == a
                                 and _members(g, comm_c) == exp_c and comm_c.rank == b,
                                 f"{shape} p_f={p_f}: stationary-W groups wrong")
        g.free()                                  # second free is harmless


@on_ranks(*SIZES)
def test_bad_grids_raise_identically(comm):
    p = comm.size
    cases = [dict(sample=p + 1), dict(channel=0), dict(height=1.5), dict(width=True)]
    for kwargs in cases:
        try:
            ProcessGrid(comm, **kwargs)
            msg = "no error"
        except ValueError as exc:
            msg = str(exc)
        everyone = comm.allgather(msg)
        name = next(iter(kwargs))
        assert_all_ranks(comm, len(set(everyone)) == 1 and msg != "no error" and name in msg,
                         f"{kwargs}: {everyone}")
    try:
        ProcessGrid(comm, channel=p).stationary_w_comms(p + 1)
        msg = "no error"
    except ValueError as exc:
        msg = str(exc)
    assert_all_ranks(comm, "filter_groups" in msg and len(set(comm.allgather(msg))) == 1, msg)
