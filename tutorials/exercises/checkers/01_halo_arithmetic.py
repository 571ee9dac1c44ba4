"""Exercise 1's checker: output and halo arithmetic on each rank, against the loops that define them."""

import dataclasses

from hypothesis import strategies as st

from refconv.testing.strategies import spatial_dim
from tutorials.exercises.checkers.common import blocks
from tutorials.exercises.harness import Compared, Part, on_ranks

TITLE = "output and halo arithmetic"
LEVEL, MINUTES = 1, 20  # difficulty 1 to 3, and a learner's time
NO_SCORE = "arithmetic only, nothing moves: an answer is right or wrong"


@dataclasses.dataclass(frozen=True)
class Rows:
    H: int
    ranks: int
    K: int
    s: int
    p: int
    d: int

    def __str__(self):
        return f"H = {self.H} rows over {self.ranks} rank(s), K = {self.K}, stride {self.s}, padding {self.p}, " \
               f"dilation {self.d}"


@st.composite
def rows_cases(draw):
    ranks = draw(st.integers(1, 5))
    H, K, s, p, d = draw(spatial_dim(max_kernel=4, max_stride=3, max_padding=3, max_dilation=3, max_extra=8,
                                     min_out=ranks, min_length=ranks))
    return Rows(H, ranks, K, s, p, d)


# -- the oracle: the definitions, as plain loops ------------------------------------------------------
def loops_output_length(c):
    """Output row o reads input rows o*s - p + d*k, k < K, of the padded image [-p, H + p)."""
    o = 0
    while o * c.s - c.p + c.d * (c.K - 1) <= c.H - 1 + c.p:
        o += 1
    return o


def loops_rows_needed(c, r):
    """``{q: (lo, hi)}``: per other rank q, the rows ``[lo, hi)`` of q's block that rank r's output
    rows read (the hull of the rows they read, cut by q's block); no entry where none."""
    Ho = loops_output_length(c)
    o0, o1 = blocks(Ho, c.ranks)[r]
    read = [o * c.s - c.p + c.d * k for o in range(o0, o1) for k in range(c.K)]
    lo, hi = min(read), max(read) + 1
    return {q: (max(lo, h0), min(hi, h1)) for q, (h0, h1) in enumerate(blocks(c.H, c.ranks))
            if q != r and max(lo, h0) < min(hi, h1)}


def as_dict(needed):
    """The learner's answer with plain ints, as the oracle's; anything but a dict of pairs as it is."""
    try:
        return {int(q): tuple(int(v) for v in pair) for q, pair in dict(needed).items()}
    except (TypeError, ValueError):
        return needed


def _per_rank(fn, c):
    return on_ranks(lambda comm: fn(comm), c.ranks)


def run_length(module, c):
    got = _per_rank(lambda comm: module.output_length(c.H, c.K, c.s, c.p, c.d), c)
    return [Compared("output_length", got, [loops_output_length(c)] * c.ranks, exact=True)]


def run_block(module, c):
    Ho = loops_output_length(c)
    got = _per_rank(lambda comm: module.output_block(Ho, comm.size, comm.rank), c)
    return [Compared("output_block", got, blocks(Ho, c.ranks), exact=True)]


def run_needed(module, c):
    got = _per_rank(lambda comm: as_dict(module.rows_needed(c.H, comm.size, comm.rank, c.K, c.s, c.p, c.d)), c)
    return [Compared("rows_needed", got, [loops_rows_needed(c, r) for r in range(c.ranks)], kind="dict",
                     note="{q: (lo, hi)}")]


PARTS = [Part("output_length", rows_cases(), run_length, str),
         Part("output_block", rows_cases(), run_block, str),
         Part("rows_needed", rows_cases(), run_needed, str)]
