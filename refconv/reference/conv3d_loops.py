"""3-D convolution, pooling and batch norm written as plain loops: slow, and obviously right.

Used only to check the vectorised 3-D reference (:mod:`refconv.reference.conv3d`,
:mod:`refconv.reference.layers3d`) on tiny shapes.  The convolution is
:mod:`refconv.reference.conv_loops`' with three spatial dims: output voxel
``(od, oh, ow)`` with kernel offset ``(a, i, j)`` reads input voxel
``(od*sd - pd + a*dd, oh*sh - ph + i*dh, ow*sw - pw + j*dw)``; reads outside the
volume are zeros, or with ``padding_mode`` the voxel that padding copies.
"""

import functools
import math

import numpy

from refconv.reference import conv_loops


conv3d_forward = functools.partial(conv_loops.forward, dims=3)
conv3d_backward_data = functools.partial(conv_loops.backward_data, dims=3)
conv3d_backward_filter = functools.partial(conv_loops.backward_filter, dims=3)


# --------------------------------------------------------------------------- pooling


def _windows(x_shape, out, kernel, stride, padding):
    """Yield ``(n, c, od, oh, ow, k, voxel)``: each window's taps in order (``k`` the flat offset
    ``(a*Kh + i)*Kw + j``), ``voxel`` the input ``(d, h, w)`` it reads or None in the padding."""
    N, C, D, H, W = x_shape
    for n in range(N):
        for c in range(C):
            for od in range(out[0]):
                for oh in range(out[1]):
                    for ow in range(out[2]):
                        for a in range(kernel[0]):
                            for i in range(kernel[1]):
                                for j in range(kernel[2]):
                                    d = od * stride[0] - padding[0] + a
                                    h = oh * stride[1] - padding[1] + i
                                    w = ow * stride[2] - padding[2] + j
                                    inside = 0 <= d < D and 0 <= h < H and 0 <= w < W
                                    k = (a * kernel[1] + i) * kernel[2] + j
                                    yield n, c, od, oh, ow, k, (d, h, w) if inside else None


def max_pool3d_forward(x, kernel, stride, padding, out):
    """``(y, argmax)``: the first maximum of each window (padding is ``-inf``), its flat offset."""
    y = numpy.full(x.shape[:2] + tuple(out), -numpy.inf, dtype=x.dtype)
    argmax = numpy.zeros(y.shape, dtype=numpy.int64)
    for n, c, od, oh, ow, k, voxel in _windows(x.shape, out, kernel, stride, padding):
        if voxel is not None and x[(n, c) + voxel] > y[n, c, od, oh, ow]:
            y[n, c, od, oh, ow] = x[(n, c) + voxel]
            argmax[n, c, od, oh, ow] = k
    return y, argmax


def avg_pool3d_forward(x, kernel, stride, padding, out):
    """The mean of each window, padding counted as zeros in the divisor."""
    y = numpy.zeros(x.shape[:2] + tuple(out), dtype=x.dtype)
    for n, c, od, oh, ow, k, voxel in _windows(x.shape, out, kernel, stride, padding):
        if voxel is not None:
            y[n, c, od, oh, ow] += x[(n, c) + voxel]
    return y / math.prod(kernel)


def avg_pool3d_backward(dy, x_shape, kernel, stride, padding, out):
    dx = numpy.zeros(tuple(x_shape), dtype=dy.dtype)
    for n, c, od, oh, ow, k, voxel in _windows(x_shape, out, kernel, stride, padding):
        if voxel is not None:
            dx[(n, c) + voxel] += dy[n, c, od, oh, ow] / math.prod(kernel)
    return dx


def max_pool3d_backward(dy, argmax, x_shape, kernel, stride, padding, out):
    dx = numpy.zeros(tuple(x_shape), dtype=dy.dtype)
    for n, c, od, oh, ow, k, voxel in _windows(x_shape, out, kernel, stride, padding):
        if voxel is not None and argmax[n, c, od, oh, ow] == k:
            dx[(n, c) + voxel] += dy[n, c, od, oh, ow]
    return dx


# ---------------------------------------------------------------- batch normalization


def batch_norm3d_forward(x, gamma, beta, eps=1e-5):
    """Per channel, over every ``(n, d, h, w)``: the mean, the biased variance, then ``y``."""
    N, C, D, H, W = x.shape
    y = numpy.zeros_like(x)
    for c in range(C):
        values = [x[n, c, d, h, w] for n in range(N) for d in range(D) for h in range(H) for w in range(W)]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        y[:, c] = (x[:, c] - mean) / math.sqrt(var + eps) * gamma[c] + beta[c]
    return y
