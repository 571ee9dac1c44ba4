"""Max and average pooling, forward and backward, on device arrays (NCHW).

Versions: one each.  Forward: one thread per output element, looping over its
window.  Backward: one thread per *input* element, gathering from the outputs
whose windows cover it, so no two threads write the same ``dx`` and no atomics
are needed (the result is deterministic).  Semantics, argument checks and
errors are ``refconv.reference``'s (``pool_geometry``): max pooling pads with
``-inf`` and records the flat offset ``i*Kw + j`` of the first maximum;
average pooling counts padding in the divisor.  Benchmark:
``python -m refconv.bench kernels``.
"""

import math

import numpy
from numba import cuda

from ._launch import contiguous, grid_1d, input_pixel, split4, xp, stream, kernel_jit
from refconv import checks
from refconv.reference import pool_geometry


@cuda.jit(device=True)
def covering_outputs(inp, kernel, stride, padding, size_out):
    """The range ``[first, last)`` of outputs whose window (kernel ``kernel``) covers input ``inp``."""
    # output o covers inp when o*stride - padding <= inp < o*stride - padding + kernel
    first = max(0, (inp + padding - kernel + stride) // stride)
    last = min(size_out, (inp + padding) // stride + 1)
    return first, last


@kernel_jit
def max_pool_forward_kernel(x, y, argmax, Kh, Kw, sh, sw, ph, pw):
    """Thread ``t`` scans the window of ``y.flat[t]``; strict ``>`` keeps the first maximum."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    H, W = x.shape[2], x.shape[3]
    n, c, oh, ow = split4(index, y.shape[1], y.shape[2], y.shape[3])
    best = -math.inf
    best_at = 0
    for i in range(Kh):
        for j in range(Kw):
            ih = input_pixel(oh, i, sh, ph, 1)
            iw = input_pixel(ow, j, sw, pw, 1)
            v = -math.inf  # padding
            if 0 <= ih < H and 0 <= iw < W:
                v = x[n, c, ih, iw]
            if v > best:
                best = v
                best_at = i * Kw + j
    y[n, c, oh, ow] = best
    argmax[n, c, oh, ow] = best_at


@kernel_jit
def max_pool_backward_kernel(dy, argmax, dx, Kh, Kw, sh, sw, ph, pw):
    """Thread ``t`` sums the ``dy`` of every covering window whose argmax is ``x.flat[t]``."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    Ho, Wo = dy.shape[2], dy.shape[3]
    n, c, h, w = split4(index, dx.shape[1], dx.shape[2], dx.shape[3])
    oh_first, oh_last = covering_outputs(h, Kh, sh, ph, Ho)
    ow_first, ow_last = covering_outputs(w, Kw, sw, pw, Wo)
    acc = 0.0
    for oh in range(oh_first, oh_last):
        for ow in range(ow_first, ow_last):
            tap = (h + ph - oh * sh) * Kw + (w + pw - ow * sw)
            if argmax[n, c, oh, ow] == tap:
                acc += dy[n, c, oh, ow]
    dx[n, c, h, w] = acc


@kernel_jit
def avg_pool_forward_kernel(x, y, Kh, Kw, sh, sw, ph, pw):
    """Thread ``t`` averages the window of ``y.flat[t]``, padding counted as zeros."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    H, W = x.shape[2], x.shape[3]
    n, c, oh, ow = split4(index, y.shape[1], y.shape[2], y.shape[3])
    acc = 0.0
    for i in range(Kh):
        ih = input_pixel(oh, i, sh, ph, 1)
        for j in range(Kw):
            iw = input_pixel(ow, j, sw, pw, 1)
            if 0 <= ih < H and 0 <= iw < W:
                acc += x[n, c, ih, iw]
    y[n, c, oh, ow] = acc / (Kh * Kw)


@kernel_jit
def avg_pool_backward_kernel(dy, dx, Kh, Kw, sh, sw, ph, pw):
    """Thread ``t`` gathers ``dy / (Kh*Kw)`` from every window covering ``x.flat[t]``."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    Ho, Wo = dy.shape[2], dy.shape[3]
    n, c, h, w = split4(index, dx.shape[1], dx.shape[2], dx.shape[3])
    oh_first, oh_last = covering_outputs(h, Kh, sh, ph, Ho)
    ow_first, ow_last = covering_outputs(w, Kw, sw, pw, Wo)
    acc = 0.0
    for oh in range(oh_first, oh_last):
        for ow in range(ow_first, ow_last):
            acc += dy[n, c, oh, ow]
    dx[n, c, h, w] = acc / (Kh * Kw)


def _geometry(x_shape, kernel_size, stride, padding):
    (Kh, Kw), (sh, sw), (ph, pw), out = pool_geometry(x_shape, kernel_size, stride, padding)
    return (Kh, Kw, sh, sw, ph, pw), out


def _check_dy(dy, x_shape, out):
    expected = (x_shape[0], x_shape[1], *out)
    if tuple(dy.shape) != expected:
        raise ValueError(f"dy: expected shape {expected} (N, C, Ho, Wo), got {tuple(dy.shape)}")


def max_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Max pooling of ``x (N, C, H, W)``: returns ``(y (N, C, Ho, Wo), argmax (N, C, Ho, Wo) int64)``."""
    checks.array(x, "x", 4)
    params, out = _geometry(x.shape, kernel_size, stride, padding)
    y = xp().empty(x.shape[:2] + out, dtype=x.dtype)
    argmax = xp().empty(y.shape, dtype=numpy.int64)
    blocks, threads = grid_1d(y.size)
    max_pool_forward_kernel[blocks, threads, stream()](contiguous(x), y, argmax, *params)
    return y, argmax


def max_pool2d_backward(dy, argmax, x_shape, kernel_size, stride=None, padding=0):
    """Route each ``dy`` to the window's maximum recorded in ``argmax``: returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 4)
    x_shape = checks.shape4(x_shape, "x_shape")
    params, out = _geometry(x_shape, kernel_size, stride, padding)
    _check_dy(dy, x_shape, out)
    if tuple(argmax.shape) != tuple(dy.shape):
        raise ValueError(f"argmax: expected the shape of dy {tuple(dy.shape)}, got {tuple(argmax.shape)}")
    dx = xp().empty(x_shape, dtype=dy.dtype)
    blocks, threads = grid_1d(dx.size)
    max_pool_backward_kernel[blocks, threads, stream()](contiguous(dy), contiguous(argmax), dx, *params)
    return dx


def avg_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Average pooling (``count_include_pad=True``): ``(N, C, H, W)`` -> ``(N, C, Ho, Wo)``."""
    checks.array(x, "x", 4)
    params, out = _geometry(x.shape, kernel_size, stride, padding)
    y = xp().empty(x.shape[:2] + out, dtype=x.dtype)
    blocks, threads = grid_1d(y.size)
    avg_pool_forward_kernel[blocks, threads, stream()](contiguous(x), y, *params)
    return y


def avg_pool2d_backward(dy, x_shape, kernel_size, stride=None, padding=0):
    """Spread each ``dy`` evenly over its window (padding included): returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 4)
    x_shape = checks.shape4(x_shape, "x_shape")
    params, out = _geometry(x_shape, kernel_size, stride, padding)
    _check_dy(dy, x_shape, out)
    dx = xp().empty(x_shape, dtype=dy.dtype)
    blocks, threads = grid_1d(dx.size)
    avg_pool_backward_kernel[blocks, threads, stream()](contiguous(dy), dx, *params)
    return dx
