"""Exercise 8's checker: which ranks form each weight-peer group, and what each group sums."""

import dataclasses

import numpy

from refconv import collectives
from tutorials.exercises import score as scoring
from tutorials.exercises.checkers.common import blocks, grids
from tutorials.exercises.harness import Compared, Part, on_ranks

TITLE = "the segmented allreduce"
LEVEL, MINUTES = 2, 45  # difficulty 1 to 3, and a learner's time
F, C, K = 5, 3, 3  # the layer whose weight gradient is sharded: w (F, C, K, K), F split over the channel ranks


@dataclasses.dataclass(frozen=True)
class GridCase:
    grid: tuple  # (P_N, P_c, P_H, P_W)

    @property
    def ranks(self):
        return int(numpy.prod(self.grid))

    def __str__(self):
        return f"grid (P_N, P_c, P_H, P_W) = {self.grid}, {self.ranks} rank(s)"


def grid_cases():
    return grids((1, 2, 3, 4, 6, 8), 4).map(GridCase)


def channel_of(case, rank):
    return int(numpy.unravel_index(rank, case.grid)[1])


def partials(case, rank):
    """Rank ``rank``'s partial ``dw`` shard ``(F_c, C, K, K)`` and ``db`` block ``(F_c,)``."""
    f0, f1 = blocks(F, case.grid[1])[channel_of(case, rank)]
    rng = numpy.random.default_rng(rank)
    return rng.standard_normal((f1 - f0, C, K, K)), rng.standard_normal(f1 - f0)


def run_peers(module, case):
    def body(comm):
        peers = module.weight_peers(comm, case.grid)
        members = collectives.allgather_object(peers, comm.rank)  # the world ranks of the group, in its order
        peers.Free()                                           # yours, now the checker's: freed, not leaked
        return members
    got = on_ranks(body, case.ranks)
    want = [[q for q in range(case.ranks) if channel_of(case, q) == channel_of(case, r)] for r in range(case.ranks)]
    return [Compared("the world ranks of weight_peers, in its order", got, want, exact=True)]


def _reference_peers(comm, case):
    return collectives.split(comm, channel_of(case, comm.rank), comm.rank)


def run_sums(module, case):
    def body(comm):
        dw_loc, db_loc = partials(case, comm.rank)
        peers = _reference_peers(comm, case)
        sums = module.finish_gradients(peers, dw_loc, db_loc)
        peers.Free()
        return sums
    got = on_ranks(body, case.ranks)
    sums = {}
    for q in range(case.ranks):
        dw, db = partials(case, q)
        c = channel_of(case, q)
        sums[c] = (sums[c][0] + dw, sums[c][1] + db) if c in sums else (dw, db)
    want = [sums[channel_of(case, r)] for r in range(case.ranks)]
    peers = case.ranks // case.grid[1]
    return [Compared("dw", [g[0] for g in got], [w[0] for w in want], reduction=peers),
            Compared("db", [g[1] for g in got], [w[1] for w in want], reduction=peers)]


PARTS = [Part("weight_peers", grid_cases(), run_peers, str), Part("finish_gradients", grid_cases(), run_sums, str)]

SCORE_CASE = GridCase((2, 2, 2, 1))


def score(module, solution):
    def body_of(m):
        def body(comm):
            dw_loc, db_loc = partials(SCORE_CASE, comm.rank)
            scoring.given(dw_loc, db_loc)
            peers = m.weight_peers(comm, SCORE_CASE.grid)
            out = m.finish_gradients(peers, dw_loc, db_loc)
            scoring.checkpoint()
            peers.Free()
            return out
        return body
    return scoring.compare(SCORE_CASE, body_of, module, solution, SCORE_CASE.ranks)
