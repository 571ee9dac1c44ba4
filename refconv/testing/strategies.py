"""Hypothesis strategies that draw valid problems, reusable outside refconv's tests.

Every strategy builds a valid problem by construction (no ``assume``): the
spatial size is drawn *after* the kernel, dilation and padding, starting from
the smallest input the dilated kernel fits in, so the output is never empty.

    >>> from hypothesis import given
    >>> @given(conv_problems(), dtypes())
    ... def test_something(problem, dtype): ...
"""

from dataclasses import dataclass

import numpy
from hypothesis import strategies as st


@dataclass(frozen=True)
class ConvProblem:
    """One 2-D convolution: ``x (N, C, H, W)``, ``w (F, C/groups, Kh, Kw)``."""

    x_shape: tuple
    w_shape: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def kwargs(self):
        """The keyword arguments every conv2d function takes."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    @property
    def out_hw(self):
        """``(Ho, Wo)`` as torch.nn.functional.conv2d computes it."""
        return tuple(
            (self.x_shape[2 + a] + 2 * self.padding[a] - self.dilation[a] * (self.w_shape[2 + a] - 1) - 1)
            // self.stride[a] + 1
            for a in range(2)
        )

    @property
    def y_shape(self):
        return (self.x_shape[0], self.w_shape[0], *self.out_hw)


def dtypes():
    """float32 or float64."""
    return st.sampled_from([numpy.dtype(numpy.float32), numpy.dtype(numpy.float64)])


@st.composite
def conv_problems(draw, *, max_batch=2, max_group_channels=3, max_groups=2, max_kernel=3,
                  max_stride=2, max_dilation=2, max_padding=2, max_extra=4):
    """A valid convolution; each spatial size is the smallest that fits plus up to ``max_extra``."""
    groups = draw(st.integers(1, max_groups))
    Cg = draw(st.integers(1, max_group_channels))
    Fg = draw(st.integers(1, max_group_channels))
    N = draw(st.integers(1, max_batch))
    kernel, stride, padding, dilation, size = [], [], [], [], []
    for _ in range(2):  # H, then W
        k = draw(st.integers(1, max_kernel))
        d = draw(st.integers(1, max_dilation))
        p = draw(st.integers(0, max_padding))
        s = draw(st.integers(1, max_stride))
        smallest = max(1, d * (k - 1) + 1 - 2 * p)
        kernel.append(k)
        dilation.append(d)
        padding.append(p)
        stride.append(s)
        size.append(draw(st.integers(smallest, smallest + max_extra)))
    return ConvProblem(
        x_shape=(N, groups * Cg, size[0], size[1]),
        w_shape=(groups * Fg, Cg, kernel[0], kernel[1]),
        stride=tuple(stride),
        padding=tuple(padding),
        dilation=tuple(dilation),
        groups=groups,
    )


@dataclass(frozen=True)
class PoolProblem:
    """One 2-D pooling: ``x (N, C, H, W)`` with a ``kernel`` window."""

    x_shape: tuple
    kernel: tuple
    stride: tuple
    padding: tuple


@st.composite
def pool_problems(draw, *, max_batch=2, max_channels=3, max_kernel=3, max_stride=3, max_extra=4):
    """A valid pooling; padding is at most half the kernel, as PyTorch requires."""
    N = draw(st.integers(1, max_batch))
    C = draw(st.integers(1, max_channels))
    kernel, stride, padding, size = [], [], [], []
    for _ in range(2):
        k = draw(st.integers(1, max_kernel))
        p = draw(st.integers(0, k // 2))
        kernel.append(k)
        padding.append(p)
        stride.append(draw(st.integers(1, max_stride)))
        size.append(draw(st.integers(max(1, k - 2 * p), max(1, k - 2 * p) + max_extra)))
    return PoolProblem((N, C, size[0], size[1]), tuple(kernel), tuple(stride), tuple(padding))


def arrays(shape, dtype, seed):
    """A reproducible standard-normal array (Hypothesis draws the seed, NumPy the values)."""
    return numpy.random.default_rng(seed).standard_normal(shape).astype(dtype)


def seeds():
    return st.integers(0, 2**32 - 1)
