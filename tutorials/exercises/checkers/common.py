"""What the checkers share: drawn cases of a convolution on a world of simulated ranks, and blocks.

Sizes are at least the number of ranks that split them, so no block is empty, and uneven
blocks (``numpy.array_split``'s) arise whenever a size is not a multiple of its split: drawn
by construction, never filtered (``refconv.testing.strategies``, whose strategies these use).
"""

import dataclasses

import numpy
from hypothesis import strategies as st

from refconv.distribution import block_range
from refconv.testing.strategies import conv_problems, spatial_dim
from tutorials.exercises.score import checkpoint, given

WORLD_SIZES = (1, 2, 3, 4)
PARTIAL = "one rank's partial sum: a reduction over the channel group is missing"


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """A convolution problem on ``ranks`` simulated ranks (the channel group, unless a checker says)."""

    problem: object
    ranks: int
    seed: int = 0

    def __str__(self):
        p = self.problem
        return (f"{self.ranks} rank{'s' if self.ranks > 1 else ''}, x {p.x_shape}, w {p.w_shape}, "
                f"stride {p.stride}, padding {p.padding}, dilation {p.dilation}")


def blocks(length, parts):
    """``[(start, stop)]`` of each of ``parts`` blocks of ``length``."""
    return [block_range(length, parts, r) for r in range(parts)]


@st.composite
def channel_cases(draw, sizes=WORLD_SIZES, *, min_channels=None, min_batch=1, max_batch=2):
    """A problem whose C and F split over the drawn world size (at least ``min_channels(ranks)``
    each, default the size)."""
    ranks = draw(st.sampled_from(sizes))
    least = ranks if min_channels is None else min_channels(ranks)
    problem = draw(conv_problems(max_batch=max_batch, min_batch=min_batch, max_channels=least + 3,
                                 min_channels=least, groups=False, max_kernel=3, max_extra=3))
    return LayerCase(problem, ranks)


def geometry(problem):
    """``(stride, padding, dilation)`` of ``problem``, as the kit's convolutions take them."""
    return problem.stride, problem.padding, problem.dilation


# -- halos: the windows each rank's output block reads, by the definition --------------------------------
@dataclasses.dataclass(frozen=True)
class HaloCase:
    """A ``(n, c, *size)`` input split over a ``grid`` of ranks (row-major), and a kernel per axis."""

    grid: tuple
    size: tuple
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    n: int = 1
    c: int = 2

    @property
    def ranks(self):
        return int(numpy.prod(self.grid))

    @property
    def layer(self):
        """What the learner's functions get: the geometry alone (not this case's answers)."""
        from tutorials.exercises.kit import HaloLayer
        return HaloLayer(self.grid, self.size, self.kernel, self.stride, self.padding, self.dilation)

    @property
    def out(self):
        return tuple((L + 2 * p - d * (k - 1) - 1) // s + 1
                     for L, k, s, p, d in zip(self.size, self.kernel, self.stride, self.padding, self.dilation))

    def coords(self, rank):
        return numpy.unravel_index(rank, self.grid)

    def owned(self, rank):
        """Per axis, the input range ``[a, b)`` the rank owns."""
        return [blocks(L, P)[k] for L, P, k in zip(self.size, self.grid, self.coords(rank))]

    def window(self, rank):
        """Per axis, the input range ``[lo, hi)`` the rank's output block reads (may pass the image)."""
        out = [blocks(L, P)[k] for L, P, k in zip(self.out, self.grid, self.coords(rank))]
        return [(o0 * s - p, (o1 - 1) * s - p + d * (k - 1) + 1)
                for (o0, o1), k, s, p, d in zip(out, self.kernel, self.stride, self.padding, self.dilation)]

    def __str__(self):
        return (f"grid {self.grid} of ranks, x ({self.n}, {self.c}, {', '.join(map(str, self.size))}), kernel "
                f"{self.kernel}, stride {self.stride}, padding {self.padding}, dilation {self.dilation}")


@st.composite
def grids(draw, ranks, axes):
    """A grid of ``axes`` axes whose product is a size drawn from ``ranks``: one factor per axis."""
    grid, left = [], draw(st.sampled_from(ranks))
    for k in range(axes):
        f = left if k == axes - 1 else draw(st.sampled_from([q for q in range(1, left + 1) if left % q == 0]))
        grid.append(f)
        left //= f
    return tuple(grid)


@st.composite
def halo_cases(draw, dims, ranks=WORLD_SIZES, *, max_stride=2):
    grid = draw(grids(ranks, dims))
    axes = [draw(spatial_dim(max_kernel=3, max_stride=max_stride, max_padding=2, max_dilation=2, max_extra=3,
                             min_out=g, min_length=g)) for g in grid]
    size, kernel, stride, padding, dilation = (tuple(col) for col in zip(*axes))
    return HaloCase(tuple(grid), size, kernel, stride, padding, dilation)


def window_of(global_x, box):
    """The cells ``box`` (per axis ``[lo, hi)``) of ``global_x (n, c, *size)``, zeros outside it."""
    out = numpy.zeros(global_x.shape[:2] + tuple(hi - lo for lo, hi in box), dtype=global_x.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for (lo, hi), L in zip(box, global_x.shape[2:]):
        a, b = max(lo, 0), min(hi, L)
        if a >= b:
            return out
        src.append(slice(a, b))
        dst.append(slice(a - lo, b - lo))
    out[tuple(dst)] = global_x[tuple(src)]
    return out


def add_window(global_dx, box, values):
    """The adjoint of :func:`window_of`: add ``values`` into the cells of ``box`` inside the image."""
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for (lo, hi), L in zip(box, global_dx.shape[2:]):
        a, b = max(lo, 0), min(hi, L)
        if a >= b:
            return
        dst.append(slice(a, b))
        src.append(slice(a - lo, b - lo))
    global_dx[tuple(dst)] += values[tuple(src)]


def halo_parts(exchange_name, return_name):
    """The two parts of a halo exercise: the exchange (``x_win``) and its adjoint (``dx_loc``)."""
    from tutorials.exercises.harness import Compared, on_ranks

    def arrays(case):
        rng = numpy.random.default_rng(0)
        x = rng.standard_normal((case.n, case.c) + case.size)
        wins = [rng.standard_normal((case.n, case.c) + tuple(hi - lo for lo, hi in case.window(r)))
                for r in range(case.ranks)]
        return x, wins

    def local(x, box):
        return numpy.ascontiguousarray(x[(slice(None), slice(None)) + tuple(slice(a, b) for a, b in box)])

    def run_exchange(module, case):
        x, _ = arrays(case)

        def body(comm):
            x_loc = local(x, case.owned(comm.rank))
            given(x_loc)
            return getattr(module, exchange_name)(comm, x_loc, case.layer)
        got = on_ranks(body, case.ranks)
        return [Compared("x_win", got, [window_of(x, case.window(r)) for r in range(case.ranks)],
                         edges=halo_widths(case))]

    def run_return(module, case):
        x, wins = arrays(case)
        dx = numpy.zeros_like(x)
        for r in range(case.ranks):
            add_window(dx, case.window(r), wins[r])

        def body(comm):
            dx_win = wins[comm.rank].copy()
            given(dx_win)
            return getattr(module, return_name)(comm, dx_win, case.layer)
        got = on_ranks(body, case.ranks)
        return [Compared("dx_loc", got, [local(dx, case.owned(r)) for r in range(case.ranks)], reduction=case.ranks,
                         edges=halo_widths(case))]
    return run_exchange, run_return


def halo_widths(case):
    """Per spatial axis, how far from a block's edge the halo reaches: the padding, or the kernel's reach."""
    return tuple(max(p, d * (k - 1)) for k, p, d in zip(case.kernel, case.padding, case.dilation))


def halo_score(exchange_name, return_name, case):
    """The score of a halo exercise: one exchange and one return on ``case``."""
    from tutorials.exercises import score as scoring

    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((case.n, case.c) + case.size)
    wins = [rng.standard_normal((case.n, case.c) + tuple(hi - lo for lo, hi in case.window(r)))
            for r in range(case.ranks)]

    def body_of(module):
        def body(comm):
            box = case.owned(comm.rank)
            x_loc = numpy.ascontiguousarray(x[(slice(None), slice(None)) + tuple(slice(a, b) for a, b in box)])
            dx_win = wins[comm.rank].copy()
            given(x_loc, dx_win)
            x_win = getattr(module, exchange_name)(comm, x_loc, case.layer)
            checkpoint()
            del x_win
            dx_loc = getattr(module, return_name)(comm, dx_win, case.layer)
            checkpoint()
            return dx_loc
        return body

    def score(module, solution):
        return scoring.compare(case, body_of, module, solution, case.ranks)
    return score


# -- the channel algorithms: each rank's blocks, by the layouts of docs/algorithms.md section 4 ----------
@dataclasses.dataclass(frozen=True)
class ChannelCase(LayerCase):
    """A layer on a channel group of ``ranks``; ``p_f``: Stationary-W's factor (None for X and Y)."""

    p_f: int = None
    counts: tuple = None  # (c_counts, f_counts) as drawn; None: numpy.array_split's

    def __str__(self):
        drawn = f", c_counts {list(self.counts[0])}, f_counts {list(self.counts[1])}" if self.counts else ""
        return super().__str__() + (f", p_f = {self.p_f}" if self.p_f else "") + drawn


def counts_of(case, axis):
    """The sizes of the ranks' blocks of ``axis`` ("C" or "F") in rank order: the case's own, if it drew
    them, else ``numpy.array_split``'s."""
    drawn = getattr(case, "counts", None)
    length = case.problem.C if axis == "C" else case.problem.F
    if drawn:
        return list(drawn[0] if axis == "C" else drawn[1])
    return [b - a for a, b in blocks(length, case.ranks)]


@st.composite
def composition_cases(draw, sizes=WORLD_SIZES):
    """A channel case whose blocks of C and F are any sizes of at least 1 (not array_split's): each split
    drawn as its cut points."""
    case = draw(channel_cases(sizes))

    def composition(length):
        cuts = sorted(draw(st.lists(st.integers(1, length - 1), unique=True, min_size=case.ranks - 1,
                                    max_size=case.ranks - 1))) if case.ranks > 1 else []
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, length]))
    return ChannelCase(case.problem, case.ranks, counts=(composition(case.problem.C), composition(case.problem.F)))


@st.composite
def w_cases(draw, sizes=(1, 2, 3, 4, 6)):
    case = draw(channel_cases(sizes))
    return ChannelCase(case.problem, case.ranks, p_f=draw(st.sampled_from(
        [q for q in range(1, case.ranks + 1) if case.ranks % q == 0])))


def indices(length, parts, which, counts=None):
    """The indices of blocks ``which`` (in that order) of ``length`` split ``parts`` ways (into blocks of
    ``counts``, if given, else numpy.array_split's)."""
    ends = numpy.cumsum([0, *counts]) if counts is not None else None
    bounds = blocks(length, parts) if counts is None else list(zip(ends[:-1], ends[1:]))
    return numpy.concatenate([numpy.arange(*bounds[k]) for k in which]).astype(int)


def weight_blocks(algorithm, case, rank):
    """``(f_idx, c_idx)``: the rows and columns of ``w`` the rank holds under ``algorithm``."""
    p, P = case.problem, case.ranks
    everything_f, everything_c = numpy.arange(p.F), numpy.arange(p.C)
    if algorithm == "x":
        return everything_f, indices(p.C, P, [rank], counts_of(case, "C"))
    if algorithm == "y":
        return indices(p.F, P, [rank], counts_of(case, "F")), everything_c
    p_c = P // case.p_f  # W: rank i = a p_c' + b holds w[F_a, C_b]
    a, b = divmod(rank, p_c)
    return indices(p.F, P, [a * p_c + j for j in range(p_c)]), indices(p.C, P, [k * p_c + b for k in range(case.p_f)])


def own(case, axis, rank):
    """The indices of ``axis`` ("C" or "F") that ``rank`` owns in ``case``."""
    length = case.problem.C if axis == "C" else case.problem.F
    return indices(length, case.ranks, [rank], counts_of(case, axis))


def free_saved(layer, comm):
    """Free the communicators your code kept in ``layer.saved`` (Stationary-W's ``groups``): the checker's once
    the pass is over, and a communicator never freed is a leak that simulated ranks report."""
    kept = [c for value in layer.saved.values() for c in (value if isinstance(value, (tuple, list)) else (value,))]
    for c in {id(c): c for c in kept if getattr(c, "simulated", False) and c is not comm}.values():
        c.Free()


def channel_parts(algorithm):
    """The forward and backward parts of exercise 5, 6 or 7 (``algorithm`` "x", "y" or "w")."""
    from refconv import reference as ref
    from tutorials.exercises.harness import Compared, on_ranks
    from tutorials.exercises.kit import Layer

    def setup(case):
        p = case.problem
        x, w, b, dy = p.arrays(case.seed)
        g = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
        want = {"y": ref.conv2d_forward(x, w, b, **g), "dx": ref.conv2d_backward_data(dy, w, x.shape, **g),
                "dw": ref.conv2d_backward_filter(x, dy, w.shape, **g), "db": ref.conv2d_backward_bias(dy)}
        return (x, w, b, dy), want

    def body_of(module, backward):
        def body(comm, case, x, w, b, dy):
            p, r = case.problem, comm.rank
            c_i, f_i = own(case, "C", r), own(case, "F", r)
            f_w, c_w = weight_blocks(algorithm, case, r)
            layer = Layer(p.C, p.F, counts_of(case, "C"), counts_of(case, "F"), p.stride, p.padding,
                          p.dilation, getattr(case, "p_f", None))
            # x_loc (n, C_i, H, W), the weight shard, b_loc (F_i,), dy_loc (n, F_i, H', W'): the rank's inputs
            x_loc, w_loc = numpy.ascontiguousarray(x[:, c_i]), numpy.ascontiguousarray(w[f_w][:, c_w])
            b_loc, dy_loc = b[f_i].copy(), numpy.ascontiguousarray(dy[:, f_i])
            given(x_loc, w_loc, b_loc, dy_loc)
            y_loc = module.forward(comm, x_loc, w_loc, b_loc, layer)
            checkpoint()
            if not backward:
                free_saved(layer, comm)
                return y_loc
            grads = module.backward(comm, dy_loc, w_loc, layer)
            checkpoint()
            free_saved(layer, comm)
            return grads
        return body

    def partials(case, x, w, b, dy, want):
        """``{tensor: [(what, per-rank arrays)]}``: the wrong answers a missing reduction gives (with the bias
        or without)."""
        p, P = case.problem, case.ranks
        g = dict(stride=p.stride, padding=p.padding, dilation=p.dilation)
        held = [weight_blocks(algorithm, case, r) for r in range(P)]
        f_r, c_r = ([own(case, axis, r) for r in range(P)] for axis in "FC")
        y_part = [ref.conv2d_forward(x[:, c], w[:, c], **g)[:, f_r[r]] for r, (_, c) in enumerate(held)]
        dx_part = [ref.conv2d_backward_data(dy[:, f], w[f], x.shape, **g)[:, c_r[r]] for r, (f, _) in enumerate(held)]
        return {"y": [(PARTIAL, y_part), (PARTIAL, [y + b[f_r[r]].reshape(1, -1, 1, 1) for r, y in enumerate(y_part)])],
                "dx": [(PARTIAL, dx_part)]}

    def run_forward(module, case):
        (x, w, b, dy), want = setup(case)
        got = on_ranks(body_of(module, False), case.ranks, case, x, w, b, dy)
        p = case.problem
        return [Compared("y_loc", got, [want["y"][:, own(case, "F", r)] for r in range(case.ranks)],
                         reduction=p.C * p.Kh * p.Kw, lookalikes=lambda: partials(case, x, w, b, dy, want)["y"])]

    def run_backward(module, case):
        (x, w, b, dy), want = setup(case)
        got = on_ranks(body_of(module, True), case.ranks, case, x, w, b, dy)
        p, P = case.problem, case.ranks
        cells = p.N * p.y_shape[2] * p.y_shape[3]
        mine = [weight_blocks(algorithm, case, r) for r in range(P)]
        return [Compared("dx_loc", [g[0] for g in got], [want["dx"][:, own(case, "C", r)] for r in range(P)],
                         reduction=p.F * p.Kh * p.Kw, lookalikes=lambda: partials(case, x, w, b, dy, want)["dx"]),
                Compared("dw_loc", [g[1] for g in got], [want["dw"][f][:, c] for f, c in mine], reduction=cells),
                Compared("db_loc", [g[2] for g in got], [want["db"][own(case, "F", r)] for r in range(P)],
                         reduction=cells)]

    def score_of(case):
        from tutorials.exercises import score as scoring

        def score(module, solution):
            (x, w, b, dy), _ = setup(case)
            return scoring.compare(case, lambda m: body_of(m, True), module, solution, case.ranks, case, x, w, b, dy)
        return score

    return run_forward, run_backward, score_of
