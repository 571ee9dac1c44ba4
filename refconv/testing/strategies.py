"""Reusable Hypothesis strategies for convolution problems.

Every strategy here builds valid cases by construction (no ``assume``), so
drawn examples are never thrown away.  Users property-testing a new
decomposition draw from the same strategies as refconv's own tests.
"""

import dataclasses

import numpy
from hypothesis import strategies as st


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
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    dtype: str = "float64"

    @property
    def x_shape(self):
        return (self.N, self.C, self.H, self.W)

    @property
    def w_shape(self):
        return (self.F, self.C // self.groups, self.Kh, self.Kw)

    @property
    def out_hw(self):
        size = lambda L, K, s, p, d: (L + 2 * p - d * (K - 1) - 1) // s + 1  # noqa: E731
        return (
            size(self.H, self.Kh, self.stride[0], self.padding[0], self.dilation[0]),
            size(self.W, self.Kw, self.stride[1], self.padding[1], self.dilation[1]),
        )

    @property
    def y_shape(self):
        return (self.N, self.F, *self.out_hw)

    @property
    def geometry(self):
        """Keyword arguments for the conv functions."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def arrays(self, seed=0):
        """Random ``(x, w, b, dy)`` of this problem's shapes and dtype."""
        rng = numpy.random.default_rng(seed)
        draw = lambda shape: rng.standard_normal(shape).astype(self.dtype)  # noqa: E731
        return draw(self.x_shape), draw(self.w_shape), draw((self.F,)), draw(self.y_shape)


@st.composite
def spatial_dim(draw, *, max_kernel=3, max_stride=2, max_padding=2, max_dilation=2, max_extra=4, min_out=1):
    """One spatial dim: ``(length, kernel, stride, padding, dilation)`` with output >= ``min_out``."""
    k = draw(st.integers(1, max_kernel))
    s = draw(st.integers(1, max_stride))
    p = draw(st.integers(0, max_padding))
    d = draw(st.integers(1, max_dilation)) if k > 1 else 1
    span = d * (k - 1) + 1
    shortest = max(1, span - 2 * p + s * (min_out - 1))
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
):
    """Draw a :class:`ConvProblem`; channel counts are multiples of the drawn groups."""
    g = draw(st.integers(1, 2)) if groups else 1
    C = g * draw(st.integers(max(1, -(-min_channels // g)), max(1, max_channels // g)))
    F = g * draw(st.integers(max(1, -(-min_channels // g)), max(1, max_channels // g)))
    H, Kh, sh, ph, dh = draw(spatial_dim(max_kernel=max_kernel, max_extra=max_extra, min_out=min_out))
    W, Kw, sw, pw, dw = draw(spatial_dim(max_kernel=max_kernel, max_extra=max_extra, min_out=min_out))
    return ConvProblem(
        N=draw(st.integers(min_batch, max_batch)), C=C, F=F, H=H, W=W, Kh=Kh, Kw=Kw,
        stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw), groups=g,
        dtype=draw(st.sampled_from(dtypes)),
    )
