"""Exercise 11's checker: the detective's three functions against the definitions, and your suspects.

``BUGS`` is the one list of the planted bugs: for each, the part that catches it, the line as the
reference solution has it (fixed) and as the skeleton has it (planted).  tests/docs_and_tutorials/test_exercises.py
plants each back into the solution and checks that its part fails.
"""

import numpy
from hypothesis import strategies as st

from refconv import reference as ref
from tutorials.exercises.checkers.common import HaloCase, channel_cases, indices, window_of
from tutorials.exercises.harness import Compared, Part, on_ranks
from tutorials.exercises.kit import Layer

TITLE = "the detective: three planted bugs"
NO_SCORE = "a fix is right or wrong; the fixed code moves what the reference moves"

BUGS = {
    "stride 2, uneven shards": (
        "halo_exchange",
        "o0, o1 = block(Ho, P, r)  # the output rows are split on their own",
        "o0, o1 = ((a + s - 1) // s for a in block(H, P, r))  # the output rows under the input rows"),
    "a corner in 3-D": (
        "halo_exchange_3d",
        "        if not any(offset):\n            continue  # myself",
        "        if not any(offset) or all(offset):\n            continue  # myself"),
    "the bias": (
        "forward",
        "    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W')\n"
        "    f0 = sum(layer.f_counts[:comm.rank])\n"
        "    return y_loc + b[f0:f0 + y_loc.shape[1]].reshape(1, -1, 1, 1)  # once, after the sum",
        "    y_part += b.reshape(1, -1, 1, 1)\n"
        "    return collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W')"),
}
SUSPECTS = {"stride 2, uneven shards": "halo_window", "a corner in 3-D": "halo_pieces", "the bias": "forward"}


@st.composite
def same_padding_rows(draw):
    """A 1-D halo of "same" padding (odd kernel), stride 2 or 1, over 2 to 5 ranks."""
    P, s, K, d = (draw(st.integers(2, 5)), draw(st.sampled_from((2, 1))), draw(st.sampled_from((3, 1))),
                  draw(st.integers(1, 2)))
    H = draw(st.integers(P * s, P * s + 6))  # at least one output row a rank
    return HaloCase((P,), (H,), (K,), (s,), (d * (K - 1) // 2,), (d,))


@st.composite
def corner_volumes(draw):
    """A volume on a 2 x 2 x 2 grid whose windows reach one cell past each block: every rank reads a
    corner of the rank diagonally across."""
    size = tuple(draw(st.integers(2, 5)) for _ in range(3))
    return HaloCase((2, 2, 2), size, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))


def _exchange(name):
    def run(module, case):
        rng = numpy.random.default_rng(0)
        x = rng.standard_normal((case.n, case.c) + case.size)

        def body(comm):
            box = case.owned(comm.rank)
            x_loc = numpy.ascontiguousarray(x[(slice(None),) * 2 + tuple(slice(a, b) for a, b in box)])
            return getattr(module, name)(comm, x_loc, case.layer)
        got = on_ranks(body, case.ranks)
        return [Compared("x_win", got, [window_of(x, case.window(r)) for r in range(case.ranks)])]
    return run


def run_forward(module, case):
    p, P = case.problem, case.ranks
    x, w, b, _ = p.arrays(case.seed)
    y = ref.conv2d_forward(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation)

    def body(comm):
        c_i = indices(p.C, P, [comm.rank])
        layer = Layer(p.C, p.F, [len(i) for i in numpy.array_split(range(p.C), P)],
                      [len(i) for i in numpy.array_split(range(p.F), P)], p.stride, p.padding, p.dilation)
        return module.forward(comm, numpy.ascontiguousarray(x[:, c_i]), numpy.ascontiguousarray(w[:, c_i]), b.copy(),
                              layer)
    got = on_ranks(body, P)
    return [Compared("y_loc", got, [y[:, indices(p.F, P, [r])] for r in range(P)], reduction=p.C * p.Kh * p.Kw)]


def run_suspects(module, case):
    named = dict(module.suspects())
    return [Compared(f"the function that held the bug of {bug!r}", [named.get(bug, "")], [where], exact=True)
            for bug, where in SUSPECTS.items()]


PARTS = [Part("halo_exchange", same_padding_rows(), _exchange("halo_exchange"), str),
         Part("halo_exchange_3d", corner_volumes(), _exchange("halo_exchange_3d"), str),
         Part("forward", channel_cases(), run_forward, str),
         Part("suspects", st.just(None), run_suspects, lambda case: "your suspects")]
