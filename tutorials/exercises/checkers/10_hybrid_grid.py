"""Exercise 10's checker: Stationary-X on a sample x channel x height grid, against the serial reference."""

import dataclasses

import numpy
from hypothesis import strategies as st

from refconv import collectives
from refconv import reference as ref
from refconv.testing.strategies import ConvProblem, conv_problems
from tutorials.exercises import score as scoring
from tutorials.exercises.checkers.common import blocks, grids
from tutorials.exercises.harness import Compared, Part, on_ranks
from tutorials.exercises.kit import HybridLayer

TITLE = "a hybrid grid (sample x channel x height)"
LEVEL, MINUTES = 3, 60  # difficulty 1 to 3, and a learner's time


@dataclasses.dataclass(frozen=True)
class HybridCase:
    problem: object
    grid: tuple  # (P_N, P_c, P_H)

    @property
    def ranks(self):
        return int(numpy.prod(self.grid))

    def coords(self, rank):
        return tuple(int(k) for k in numpy.unravel_index(rank, self.grid))

    def __str__(self):
        p = self.problem
        return (f"grid (P_N, P_c, P_H) = {self.grid}, x {p.x_shape}, w {p.w_shape}, stride {p.stride}, "
                f"padding {p.padding}, dilation {p.dilation}")


@st.composite
def hybrid_cases(draw):
    grid = draw(grids((1, 2, 3, 4, 6, 8), 3))
    P_N, P_c, P_H = grid
    problem = draw(conv_problems(max_batch=P_N + 1, min_batch=P_N, max_channels=P_c + 2, min_channels=P_c,
                                 groups=False, min_hw=(P_H, 1), max_extra=3))
    return HybridCase(problem, grid)


def peers_of(case, rank, axes):
    """The world ranks that share ``rank``'s coordinates on every axis but ``axes``, in rank order."""
    me = case.coords(rank)
    return [q for q in range(case.ranks)
            if all(a == b for k, (a, b) in enumerate(zip(case.coords(q), me)) if k not in axes)]


def run_comms(module, case):
    def body(comm):
        made = module.communicators(comm, case.grid)
        members = [collectives.allgather_object(c, comm.rank) for c in made]
        free(made)
        return members
    got = on_ranks(body, case.ranks)
    want = {"channel_comm": (1,), "spatial_comm": (2,), "peers": (0, 2)}
    return [Compared(f"the world ranks of {name}", [g[k] for g in got],
                     [peers_of(case, r, axes) for r in range(case.ranks)], exact=True)
            for k, (name, axes) in enumerate(want.items())]


def _slices(case, rank):
    """``(n, c_x, f_y, h_x, h_y)``: the rank's slices of the samples, C, F, and input and output rows."""
    p, (n, c, h) = case.problem, case.coords(rank)
    P_N, P_c, P_H = case.grid
    cut = lambda L, P, k: slice(*blocks(L, P)[k])  # noqa: E731
    return cut(p.N, P_N, n), cut(p.C, P_c, c), cut(p.F, P_c, c), cut(p.H, P_H, h), cut(p.y_shape[2], P_H, h)


def body_of(module, backward):
    def body(comm, case, x, w, b, dy):
        p = case.problem
        n, c, f, h, ho = _slices(case, comm.rank)
        layer = HybridLayer(case.grid, (p.H, p.W), p.y_shape[2:], (p.Kh, p.Kw), C=p.C, F=p.F,
                            c_counts=[b - a for a, b in blocks(p.C, case.grid[1])],
                            f_counts=[b - a for a, b in blocks(p.F, case.grid[1])], stride=p.stride,
                            padding=p.padding, dilation=p.dilation)
        x_loc, w_loc = numpy.ascontiguousarray(x[n, c, h]), numpy.ascontiguousarray(w[:, c])
        b_loc, dy_loc = b[f].copy(), numpy.ascontiguousarray(dy[n, f, ho])
        scoring.given(x_loc, w_loc, b_loc, dy_loc)
        comms = module.communicators(comm, case.grid)
        y_loc = module.forward(comms, x_loc, w_loc, b_loc, layer)
        scoring.checkpoint()
        if not backward:
            free(comms)
            return y_loc
        grads = module.backward(comms, dy_loc, w_loc, layer)
        scoring.checkpoint()
        free(comms)
        return grads
    return body


def free(comms):
    """Free the communicators your ``communicators`` made (each once: two names may hold one)."""
    for c in {id(c): c for c in comms}.values():
        c.Free()


def _want(case):
    p = case.problem
    x, w, b, dy = p.arrays(0)
    g = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
    return (x, w, b, dy), dict(y=ref.conv2d_forward(x, w, b, **g), dx=ref.conv2d_backward_data(dy, w, x.shape, **g),
                               dw=ref.conv2d_backward_filter(x, dy, w.shape, **g), db=ref.conv2d_backward_bias(dy))


def run_forward(module, case):
    arrays, want = _want(case)
    got = on_ranks(body_of(module, False), case.ranks, case, *arrays)
    p, cuts = case.problem, [_slices(case, r) for r in range(case.ranks)]
    return [Compared("y_loc", got, [want["y"][n, f, ho] for n, c, f, h, ho in cuts], reduction=p.C * p.Kh * p.Kw)]


def run_backward(module, case):
    arrays, want = _want(case)
    got = on_ranks(body_of(module, True), case.ranks, case, *arrays)
    p, cuts = case.problem, [_slices(case, r) for r in range(case.ranks)]
    cells = p.N * p.y_shape[2] * p.y_shape[3]
    return [Compared("dx_loc", [g[0] for g in got], [want["dx"][n, c, h] for n, c, f, h, ho in cuts],
                     reduction=p.F * p.Kh * p.Kw),
            Compared("dw_loc", [g[1] for g in got], [want["dw"][:, c] for n, c, f, h, ho in cuts], reduction=cells),
            Compared("db_loc", [g[2] for g in got], [want["db"][f] for n, c, f, h, ho in cuts], reduction=cells)]


PARTS = [Part("communicators", hybrid_cases(), run_comms, str), Part("forward", hybrid_cases(), run_forward, str),
         Part("backward", hybrid_cases(), run_backward, str)]

SCORE_CASE = HybridCase(ConvProblem(N=2, C=4, F=4, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), (2, 2, 2))


def score(module, solution):
    arrays, _ = _want(SCORE_CASE)
    return scoring.compare(SCORE_CASE, lambda m: body_of(m, True), module, solution, SCORE_CASE.ranks, SCORE_CASE,
                           *arrays)
