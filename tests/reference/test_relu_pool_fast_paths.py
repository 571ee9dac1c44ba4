"""The branch-free ReLU backward and max pooling of refconv.reference against plain loops.

The reference computes both without numpy.where on random masks (it mispredicts branches):
a product where dy is finite, fmax and an arithmetic argmax update in pooling.  These
oracles are written independently, element by element, and cover what the fast forms
could get wrong: an inf or NaN in dy, NaN in x, ties (the first maximum wins), padding
and overlapping windows.
"""

import itertools

import numpy
import pytest

from refconv import kernels, reference as ref
from refconv.arrays import to_host
from refconv.backend import get_backend
from refconv.testing.asserts import assert_close


def relu_backward_loop(dy, x):
    out = numpy.zeros_like(dy)
    for i in numpy.ndindex(dy.shape):
        if x[i] > 0:
            out[i] = dy[i]
    return out


def max_pool_loop(x, k, s, p):
    """(y, argmax) by scanning each window in order; padding is -inf, NaN is never a maximum."""
    N, C, H, W = x.shape
    Ho, Wo = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    y = numpy.empty((N, C, Ho, Wo), x.dtype)
    argmax = numpy.empty((N, C, Ho, Wo), numpy.int64)
    for n, c, oh, ow in itertools.product(range(N), range(C), range(Ho), range(Wo)):
        best, at = -numpy.inf, 0
        for i, j in itertools.product(range(k), range(k)):
            h, w = oh * s - p + i, ow * s - p + j
            v = x[n, c, h, w] if 0 <= h < H and 0 <= w < W else -numpy.inf
            if v > best:
                best, at = v, i * k + j
        y[n, c, oh, ow], argmax[n, c, oh, ow] = best, at
    return y, argmax


def max_pool_backward_loop(dy, argmax, x_shape, k, s, p):
    N, C, H, W = x_shape
    dx = numpy.zeros(x_shape, dy.dtype)
    for n, c, oh, ow in numpy.ndindex(dy.shape):
        i, j = divmod(int(argmax[n, c, oh, ow]), k)
        h, w = oh * s - p + i, ow * s - p + j
        if 0 <= h < H and 0 <= w < W:
            dx[n, c, h, w] += dy[n, c, oh, ow]
    return dx


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_relu_backward_zero_where_x_is_not_positive_whatever_dy(dtype):
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(dtype)
    x[0, 0, 0, :3] = [0.0, -0.0, numpy.nan]          # not > 0: the gradient is 0
    dy = rng.standard_normal(x.shape).astype(dtype)
    got = ref.relu_backward(dy, x)                      # finite: the product
    numpy.testing.assert_array_equal(got, relu_backward_loop(dy, x))
    assert (dy[x <= 0] < 0).any() and not numpy.signbit(got[x <= 0]).any()  # +0.0, as torch, never -0.0
    dy[x <= 0] = numpy.inf                              # would be NaN in a product with the mask
    dy[0, 0, 0, 2] = numpy.nan                          # at x = NaN
    dy[1, 0, 0, 0], x[1, 0, 0, 0] = numpy.nan, 1.0      # passed through where x > 0
    got = ref.relu_backward(dy, x)
    numpy.testing.assert_array_equal(got, relu_backward_loop(dy, x))
    assert got.dtype == dtype and numpy.isnan(got[1, 0, 0, 0]) and numpy.isfinite(got[x <= 0]).all()


@pytest.mark.parametrize("k, s, p", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 3, 0), (1, 1, 0)])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_max_pool_matches_the_loop(k, s, p, dtype):
    rng = numpy.random.default_rng(k * 100 + s * 10 + p)
    x = numpy.round(rng.standard_normal((2, 2, 7, 6)) * 2).astype(dtype)  # few values: ties
    x[0, 0, :2, :2] = numpy.nan                         # a window of NaN only: -inf, argmax 0
    x[1, 1, 3, 3] = numpy.nan                           # skipped, as > skips it
    y, argmax = ref.max_pool2d_forward(x, k, s, p)
    y_loop, argmax_loop = max_pool_loop(x, k, s, p)
    numpy.testing.assert_array_equal(y, y_loop)
    numpy.testing.assert_array_equal(argmax, argmax_loop)
    assert y.dtype == dtype and argmax.dtype == numpy.int64
    dy = rng.standard_normal(y.shape).astype(dtype)
    dy[0, 1, 0, 0] = numpy.inf                          # must reach its maximum only
    dx = ref.max_pool2d_backward(dy, argmax, x.shape, k, s, p)
    # overlapping windows add several dy into one cell, in another order than the loop's
    assert_close(dx, max_pool_backward_loop(dy, argmax, x.shape, k, s, p), reduction_length=k * k)


def test_the_cuda_kernels_treat_inf_and_nan_as_the_reference_does():
    """The reference's docstrings say its NaN handling is the CUDA kernels': NaN is never a
    pooling maximum (a window of NaN only gives -inf), and ReLU's gradient is 0 where x is not
    positive even where dy is inf or NaN.  Checked here on one small case each."""
    device = get_backend("cuda")  # NumPy arrays under the CUDA simulator, CuPy on a GPU
    x = numpy.arange(2 * 4 * 4, dtype=numpy.float64).reshape(1, 2, 4, 4) % 5 - 2
    x[0, 0, :2, :2] = numpy.nan                          # a window of NaN only
    x[0, 1, 2, 3] = numpy.nan                            # one NaN beside numbers
    for k, s, p in [(2, 2, 0), (3, 1, 1)]:
        y, argmax = ref.max_pool2d_forward(x, k, s, p)
        y_d, argmax_d = kernels.max_pool2d_forward(device.asarray(x), k, s, p)
        numpy.testing.assert_array_equal(to_host(y_d), y)
        numpy.testing.assert_array_equal(to_host(argmax_d), argmax)
        assert y[0, 0, 0, 0] == -numpy.inf and not numpy.isnan(y).any(), (k, s, p)  # NaN and padding only there
    dy = numpy.where(x > 0, 1.5, numpy.inf)
    dy[0, 1, 0, 0] = numpy.nan
    got = to_host(kernels.relu_backward(device.asarray(dy), device.asarray(x)))
    numpy.testing.assert_array_equal(got, ref.relu_backward(dy, x))
    assert numpy.isfinite(got).all()
