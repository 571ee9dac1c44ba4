"""Reusable Hypothesis strategies for convolution problems.

Every strategy here builds valid cases by construction (no ``assume``), so
drawn examples are never thrown away.  Users property-testing a new
decomposition draw from the same strategies as refconv's own tests.
"""

import dataclasses
import math

import numpy
from hypothesis import strategies as st

from refconv import checks
from refconv.grid import AXES, DEPTH, axes_of


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """One convolution: shapes, geometry and dtype (NCHW, weights ``F x C/groups x Kh x Kw``)."""

    N: int
    C: int
    F: int
    H: int
    W: int
    Kh: int
    Kw: int
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)  # or "same" / "valid"
    dilation: tuple = (1, 1)
    groups: int = 1
    dtype: str = "float64"
    padding_mode: str = "zeros"  # or "reflect", "replicate", "circular"

    @property
    def x_shape(self):
        return (self.N, self.C, self.H, self.W)

    @property
    def w_shape(self):
        return (self.F, self.C // self.groups, self.Kh, self.Kw)

    @property
    def out_hw(self):
        return checks.conv_geometry(self.x_shape, self.w_shape, self.stride, self.padding, self.dilation,
                                    self.groups)[4]

    @property
    def y_shape(self):
        return (self.N, self.F, *self.out_hw)

    @property
    def geometry(self):
        """Keyword arguments for the conv functions; ``padding_mode`` only where it is not zeros (the
        reference and DistConv2d take it, torch.nn.functional.conv2d and the kernels do not)."""
        mode = {} if self.padding_mode == "zeros" else dict(padding_mode=self.padding_mode)
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups, **mode)

    def arrays(self, seed=0):
        """Random ``(x, w, b, dy)`` of this problem's shapes and dtype."""
        rng = numpy.random.default_rng(seed)
        draw = lambda shape: rng.standard_normal(shape).astype(self.dtype)  # noqa: E731
        return draw(self.x_shape), draw(self.w_shape), draw((self.F,)), draw(self.y_shape)


@st.composite
def spatial_dim(draw, *, max_kernel=3, max_stride=2, max_padding=2, max_dilation=2, max_extra=4, min_out=1,
                min_length=1, padding="ints", padding_mode="zeros"):
    """One spatial dim: ``(length, kernel, stride, padding, dilation)`` with output >= ``min_out``
    and length >= ``min_length`` (so that a split over that many ranks leaves no block empty).
    ``padding="same"`` draws stride 1 (the output is as long as the input), ``"valid"`` no
    padding; both return padding 0 for the caller to replace by the string.  The length also
    fits ``padding_mode`` as torch requires (reflect: longer than a pad; circular: no shorter)."""
    k = draw(st.integers(1, max_kernel))
    s = 1 if padding == "same" else draw(st.integers(1, max_stride))
    p = draw(st.integers(0, max_padding)) if padding == "ints" else 0
    d = draw(st.integers(1, max_dilation)) if k > 1 else 1
    span = d * (k - 1) + 1
    if padding == "same":
        shortest = max(min_length, min_out)
    else:
        shortest = max(min_length, span - 2 * p + s * (min_out - 1))
    widest_pad = -(-(span - 1) // 2) if padding == "same" else p
    shortest = max(shortest, {"reflect": widest_pad + 1, "circular": widest_pad}.get(padding_mode, 0))
    length = draw(st.integers(shortest, shortest + max_extra))
    return length, k, s, p, d


@st.composite
def conv_problems(
    draw,
    *,
    max_batch=2,
    max_channels=4,
    max_kernel=3,
    max_extra=4,
    groups=True,
    dtypes=("float64",),
    min_out=1,
    min_batch=1,
    min_channels=1,
    min_hw=(1, 1),
    padding_strings=False,
    padding_modes=("zeros",),
    channel_multiple=1,
):
    """Draw a :class:`ConvProblem`; channel counts are multiples of the drawn groups.

    ``min_batch``, ``min_channels`` and ``min_hw`` (for input and output alike) let a
    caller ask for sizes that split over a grid without empty blocks.
    ``padding_strings=True`` also draws ``padding='same'`` and ``'valid'``; ``padding_modes``
    lists the ``padding_mode`` values to draw from; ``C`` and ``F`` are multiples of
    ``channel_multiple`` (and of the groups).  ``groups``: True
    (1 or 2), False (1), or a tuple of the group counts to draw from; a group may have one
    input channel (depthwise).
    """
    kind = draw(st.sampled_from(("ints", "same", "valid"))) if padding_strings else "ints"
    mode = draw(st.sampled_from(tuple(padding_modes)))
    g = draw(st.sampled_from((1, 2) if groups is True else tuple(groups) if groups else (1,)))
    unit = math.lcm(g, channel_multiple)  # C and F are multiples of it
    C = unit * draw(st.integers(max(1, -(-min_channels // unit)), max(1, max_channels // unit)))
    F = unit * draw(st.integers(max(1, -(-min_channels // unit)), max(1, max_channels // unit)))
    H, Kh, sh, ph, dh = draw(spatial_dim(max_kernel=max_kernel, max_extra=max_extra,
                                         min_out=max(min_out, min_hw[0]), min_length=min_hw[0], padding=kind,
                                         padding_mode=mode))
    W, Kw, sw, pw, dw = draw(spatial_dim(max_kernel=max_kernel, max_extra=max_extra,
                                         min_out=max(min_out, min_hw[1]), min_length=min_hw[1], padding=kind,
                                         padding_mode=mode))
    return ConvProblem(
        N=draw(st.integers(min_batch, max(min_batch, max_batch))), C=C, F=F, H=H, W=W, Kh=Kh, Kw=Kw,
        stride=(sh, sw), padding=(ph, pw) if kind == "ints" else kind, dilation=(dh, dw), groups=g,
        dtype=draw(st.sampled_from(dtypes)), padding_mode=mode,
    )


@dataclasses.dataclass(frozen=True)
class Conv3dProblem:
    """One 3-D convolution: NCDHW, weights ``F x C/groups x Kd x Kh x Kw``; every spatial
    tuple is ``(d, h, w)``."""

    N: int
    C: int
    F: int
    size: tuple  # (D, H, W)
    kernel: tuple  # (Kd, Kh, Kw)
    stride: tuple = (1, 1, 1)
    padding: tuple = (0, 0, 0)  # or "same" / "valid"
    dilation: tuple = (1, 1, 1)
    groups: int = 1
    dtype: str = "float64"
    padding_mode: str = "zeros"  # or "reflect", "replicate", "circular"

    @property
    def x_shape(self):
        return (self.N, self.C, *self.size)

    @property
    def w_shape(self):
        return (self.F, self.C // self.groups, *self.kernel)

    @property
    def out(self):
        """``(Do, Ho, Wo)``."""
        return checks.conv_geometry(self.x_shape, self.w_shape, self.stride, self.padding, self.dilation,
                                    self.groups, dims=3)[4]

    @property
    def y_shape(self):
        return (self.N, self.F, *self.out)

    geometry = ConvProblem.geometry
    arrays = ConvProblem.arrays


@st.composite
def conv3d_problems(draw, *, max_batch=2, max_channels=3, max_kernel=3, max_extra=2, groups=True,
                    dtypes=("float64",), padding_strings=False, padding_modes=("zeros",), min_batch=1,
                    min_channels=1, min_size=(1, 1, 1)):
    """Draw a :class:`Conv3dProblem`: each of depth, height and width is a :func:`spatial_dim`,
    so every stride, padding and dilation is drawn per dim; sizes stay small (the loop oracle
    visits every tap of every output voxel).  ``min_batch``, ``min_channels`` and ``min_size``
    (``(d, h, w)``, for input and output alike) ask for sizes that split over a grid without
    empty blocks, as in :func:`conv_problems`."""
    kind = draw(st.sampled_from(("ints", "same", "valid"))) if padding_strings else "ints"
    mode = draw(st.sampled_from(tuple(padding_modes)))
    g = draw(st.sampled_from((1, 2) if groups is True else tuple(groups) if groups else (1,)))
    C = g * draw(st.integers(max(1, -(-min_channels // g)), max(1, max_channels // g)))
    F = g * draw(st.integers(max(1, -(-min_channels // g)), max(1, max_channels // g)))
    dims = [draw(spatial_dim(max_kernel=max_kernel, max_extra=max_extra, padding=kind, padding_mode=mode,
                             min_out=least, min_length=least)) for least in min_size]
    size, kernel, stride, padding, dilation = (tuple(column) for column in zip(*dims))
    return Conv3dProblem(
        N=draw(st.integers(min_batch, max(min_batch, max_batch))), C=C, F=F, size=size, kernel=kernel, stride=stride,
        padding=padding if kind == "ints" else kind, dilation=dilation, groups=g,
        dtype=draw(st.sampled_from(dtypes)), padding_mode=mode,
    )


# ------------------------------------------------------------------ grids and distributed cases

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
ALGORITHMS = ("stationary-x", "stationary-y", "stationary-w")


@st.composite
def grid_shapes(draw, world_size, *, axes=AXES):
    """A factorization ``(P_N, P_c, P_H, P_W)`` of ``world_size``; axes not in ``axes`` stay 1.
    With ``"depth"`` among ``axes``, a grid for volumes: ``(P_N, P_c, P_D, P_H, P_W)``."""
    grid_axes = axes_of(5) if DEPTH in axes else AXES
    shape, left = [], world_size
    for k, axis in enumerate(grid_axes):
        if axis not in axes:
            shape.append(1)
            continue
        later = [a for a in grid_axes[k + 1:] if a in axes]
        p = left if not later else draw(st.sampled_from(checks.divisors(left)))
        shape.append(p)
        left //= p
    if left != 1:  # the last allowed axis took the rest above unless none was allowed
        raise ValueError(f"grid_shapes: axes {axes} cannot factor {world_size}")
    return tuple(shape)


@dataclasses.dataclass(frozen=True)
class DistConvCase:
    """A convolution problem, a grid shape and a channel algorithm that fit together."""

    problem: ConvProblem
    grid_shape: tuple
    algorithm: str
    filter_groups: int = None

    def grid_kwargs(self):
        return dict(zip(axes_of(self.grid_shape), self.grid_shape))

    def layer_kwargs(self):
        """Keyword arguments of :class:`refconv.DistConv2d` (or DistConv3d, for a
        :class:`Conv3dProblem`) for this case (without ``grid``)."""
        p = self.problem
        return dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups,
                    padding_mode=p.padding_mode,
                    algorithm=self.algorithm, filter_groups=self.filter_groups, dtype=p.dtype)


@st.composite
def dist_conv_cases(draw, world_size, *, algorithms=ALGORITHMS, axes=AXES, dtypes=("float64",),
                    max_channels=5, max_extra=3, grid_shape=None, padding_strings=True, grouped_channel_split=False,
                    padding_modes=PADDING_MODES):
    """Draw a :class:`DistConvCase` for ``world_size`` ranks.

    Sizes are at least the number of ranks along their axis, so no block is empty,
    and uneven blocks arise whenever a size is not a multiple of its split.
    Grouped convolutions are drawn when channels are not split, and with
    ``grouped_channel_split=True`` also when they are: groups a multiple of ``P_c``
    (the "grouped" algorithm runs them, whatever ``algorithm`` says; depthwise ones
    among them), or groups that span ranks (a divisor of ``P_c`` between 1 and ``P_c``,
    with ``C`` and ``F`` multiples of ``P_c``: "grouped-x", "grouped-y", and
    "stationary-w" within each group, its ``p_f`` a divisor of ``P_c/groups``).
    """
    shape = grid_shape or draw(grid_shapes(world_size, axes=axes))
    P_N, P_c, P_H, P_W = shape
    algorithm = draw(st.sampled_from(algorithms))
    spanning = [d for d in checks.divisors(P_c)[1:-1] if grouped_channel_split]
    if spanning and draw(st.booleans()):
        groups, multiple = tuple(spanning), P_c
    else:
        groups, multiple = P_c == 1 or ((1, P_c, 2 * P_c) if grouped_channel_split else False), 1
    problem = draw(conv_problems(
        max_batch=P_N + 1, min_batch=P_N, max_channels=max(max_channels, P_c + 1), min_channels=P_c,
        groups=groups, channel_multiple=multiple, dtypes=dtypes,
        padding_modes=padding_modes, min_hw=(P_H, P_W), max_extra=max_extra, padding_strings=padding_strings,
    ))
    # the ranks W factors: a spanned group's, or the channel group (on a layer of whole groups per
    # rank, any p_f is accepted and the layer runs 'grouped': drawn too, so that stays tested)
    q = P_c if problem.groups % P_c == 0 else P_c // math.gcd(P_c, problem.groups)
    filter_groups = draw(st.sampled_from(checks.divisors(q))) if algorithm == "stationary-w" else None
    return DistConvCase(problem, shape, algorithm, filter_groups)


@st.composite
def dist_conv3d_cases(draw, world_size, *, algorithms=ALGORITHMS, dtypes=("float64",), max_channels=4, max_extra=2,
                      grid_shape=None, padding_strings=True, padding_modes=PADDING_MODES, max_kernel=3):
    """Draw a :class:`DistConvCase` of a :class:`Conv3dProblem` for ``world_size`` ranks: a grid
    ``(P_N, P_c, P_D, P_H, P_W)`` (or ``grid_shape``), and sizes at least the number of ranks
    along their axis (input and output), so no block is empty and uneven blocks arise whenever
    a size is not a multiple of its split.  Grouped convolutions are drawn when channels are
    not split; ``filter_groups`` for "stationary-w" is any divisor of ``P_c``."""
    shape = tuple(grid_shape or draw(grid_shapes(world_size, axes=axes_of(5))))
    P_N, P_c, P_D, P_H, P_W = shape
    algorithm = draw(st.sampled_from(algorithms))
    problem = draw(conv3d_problems(
        max_batch=P_N + 1, min_batch=P_N, max_channels=max(max_channels, P_c + 1), min_channels=P_c,
        groups=P_c == 1, dtypes=dtypes, padding_strings=padding_strings, padding_modes=padding_modes,
        min_size=(P_D, P_H, P_W), max_extra=max_extra, max_kernel=max_kernel,
    ))
    filter_groups = draw(st.sampled_from(checks.divisors(P_c))) if algorithm == "stationary-w" else None
    return DistConvCase(problem, shape, algorithm, filter_groups)
