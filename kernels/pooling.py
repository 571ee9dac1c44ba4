"""Max and average pooling, forward and backward, on device arrays: images (NCHW) and volumes (NCDHW).

Versions: one each.  Forward: one thread per output element, looping over its
window.  Backward: one thread per *input* element, gathering from the outputs
whose windows cover it, so no two threads write the same ``dx`` and no atomics
are needed (the result is deterministic).  Semantics, argument checks and
errors are ``refconv.reference``'s (``pool_geometry``, ``pool3d_geometry``):
max pooling pads with ``-inf`` and records the flat offset ``(a*Kh + i)*Kw + j``
of the first maximum; average pooling counts padding in the divisor.

The kernels are written once, for volumes ``(N, C, D, H, W)``.  An image is the
volume of depth 1 (a view, ``(N, C, 1, H, W)``) pooled with kernel 1, stride 1 and
no padding along depth, so its argmax offset is ``i*Kw + j``, the 2-D reference's.
Benchmark: ``python -m refconv.bench kernels``.
"""

import math

import numpy
from numba import cuda

from .geometry import as_volume, contiguous, grid_1d, input_pixel, kernel_jit, split5, stream, xp
from refconv import checks
from refconv.reference import pool_geometry, pool3d_geometry


@cuda.jit(device=True)
def covering_outputs(inp, kernel, stride, padding, size_out):
    """The range ``[first, last)`` of outputs whose window (kernel ``kernel``) covers input ``inp``.

    Output ``o`` covers ``inp`` when ``o*stride <= inp + padding < o*stride + kernel``.  One divide finds
    the last window that starts at or before ``inp``; the first is found by stepping back while the window
    before still reaches ``inp`` (at most ``kernel / stride`` steps), where a second divide, of a
    numerator that may be negative, cost two more divide instructions per axis."""
    shifted = inp + padding  # >= 0
    last = shifted // stride
    first = last + 1
    while first > 0 and (first - 1) * stride + kernel > shifted:
        first -= 1
    return first, min(size_out, last + 1)


@kernel_jit
def max_pool_forward_kernel(x, y, argmax, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw):
    """Thread ``t`` scans the window of ``y.flat[t]``; strict ``>`` keeps the first maximum."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    n, c, od, oh, ow = split5(index, y.shape[1], y.shape[2], y.shape[3], y.shape[4])
    best = -math.inf
    best_at = 0
    for a in range(Kd):
        id_ = input_pixel(od, a, sd, pd, 1)
        for i in range(Kh):
            ih = input_pixel(oh, i, sh, ph, 1)
            for j in range(Kw):
                iw = input_pixel(ow, j, sw, pw, 1)
                v = -math.inf  # padding
                if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                    v = x[n, c, id_, ih, iw]
                if v > best:
                    best = v
                    best_at = (a * Kh + i) * Kw + j
    y[n, c, od, oh, ow] = best
    argmax[n, c, od, oh, ow] = best_at


@kernel_jit
def max_pool_backward_kernel(dy, argmax, dx, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw):
    """Thread ``t`` sums the ``dy`` of every covering window whose argmax is ``x.flat[t]``."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    n, c, d, h, w = split5(index, dx.shape[1], dx.shape[2], dx.shape[3], dx.shape[4])
    od_first, od_last = covering_outputs(d, Kd, sd, pd, Do)
    oh_first, oh_last = covering_outputs(h, Kh, sh, ph, Ho)
    ow_first, ow_last = covering_outputs(w, Kw, sw, pw, Wo)
    acc = 0.0
    for od in range(od_first, od_last):
        a = d + pd - od * sd  # the window offsets (a, i, j) at which output (od, oh, ow) reads (d, h, w)
        for oh in range(oh_first, oh_last):
            i = h + ph - oh * sh
            for ow in range(ow_first, ow_last):
                j = w + pw - ow * sw
                if argmax[n, c, od, oh, ow] == (a * Kh + i) * Kw + j:
                    acc += dy[n, c, od, oh, ow]
    dx[n, c, d, h, w] = acc


@kernel_jit
def avg_pool_forward_kernel(x, y, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw):
    """Thread ``t`` averages the window of ``y.flat[t]``, padding counted as zeros."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    n, c, od, oh, ow = split5(index, y.shape[1], y.shape[2], y.shape[3], y.shape[4])
    acc = 0.0
    for a in range(Kd):
        id_ = input_pixel(od, a, sd, pd, 1)
        for i in range(Kh):
            ih = input_pixel(oh, i, sh, ph, 1)
            for j in range(Kw):
                iw = input_pixel(ow, j, sw, pw, 1)
                if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                    acc += x[n, c, id_, ih, iw]
    y[n, c, od, oh, ow] = acc / (Kd * Kh * Kw)


@kernel_jit
def avg_pool_backward_kernel(dy, dx, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw):
    """Thread ``t`` gathers ``dy / (Kd*Kh*Kw)`` from every window covering ``x.flat[t]``."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    n, c, d, h, w = split5(index, dx.shape[1], dx.shape[2], dx.shape[3], dx.shape[4])
    od_first, od_last = covering_outputs(d, Kd, sd, pd, Do)
    oh_first, oh_last = covering_outputs(h, Kh, sh, ph, Ho)
    ow_first, ow_last = covering_outputs(w, Kw, sw, pw, Wo)
    acc = 0.0
    for od in range(od_first, od_last):
        for oh in range(oh_first, oh_last):
            for ow in range(ow_first, ow_last):
                acc += dy[n, c, od, oh, ow]
    dx[n, c, d, h, w] = acc / (Kd * Kh * Kw)


# ------------------------------------------------------------------ host side, images and volumes
def _geometry(x_shape, kernel_size, stride, padding):
    """``((Kd, Kh, Kw, sd, sh, sw, pd, ph, pw), out)`` for pooling ``x_shape`` (4-D or 5-D), checked by the
    reference's geometry; an image gets kernel 1, stride 1 and padding 0 along its depth of 1."""
    if len(x_shape) == 4:
        kernel, stride, padding, out = pool_geometry(x_shape, kernel_size, stride, padding)
        kernel, stride, padding = (1, *kernel), (1, *stride), (0, *padding)
    else:
        kernel, stride, padding, out = pool3d_geometry(x_shape, kernel_size, stride, padding)
    return (*kernel, *stride, *padding), out


def _check_dy(dy, x_shape, out):
    expected = (x_shape[0], x_shape[1], *out)
    if tuple(dy.shape) != expected:
        names = "(N, C, Ho, Wo)" if len(out) == 2 else "(N, C, Do, Ho, Wo)"
        raise ValueError(f"dy: expected shape {expected} {names}, got {tuple(dy.shape)}")


def _max_pool_forward(x, kernel_size, stride, padding):
    params, out = _geometry(x.shape, kernel_size, stride, padding)
    y = xp().empty(x.shape[:2] + out, dtype=x.dtype)
    argmax = xp().empty(y.shape, dtype=numpy.int64)
    blocks, threads = grid_1d(y.size)
    max_pool_forward_kernel[blocks, threads, stream()](as_volume(contiguous(x)), as_volume(y), as_volume(argmax),
                                                       *params)
    return y, argmax


def _max_pool_backward(dy, argmax, x_shape, kernel_size, stride, padding):
    params, out = _geometry(x_shape, kernel_size, stride, padding)
    _check_dy(dy, x_shape, out)
    if tuple(argmax.shape) != tuple(dy.shape):
        raise ValueError(f"argmax: expected the shape of dy {tuple(dy.shape)}, got {tuple(argmax.shape)}")
    dx = xp().empty(x_shape, dtype=dy.dtype)
    blocks, threads = grid_1d(dx.size)
    max_pool_backward_kernel[blocks, threads, stream()](as_volume(contiguous(dy)), as_volume(contiguous(argmax)),
                                                        as_volume(dx), *params)
    return dx


def _avg_pool_forward(x, kernel_size, stride, padding):
    params, out = _geometry(x.shape, kernel_size, stride, padding)
    y = xp().empty(x.shape[:2] + out, dtype=x.dtype)
    blocks, threads = grid_1d(y.size)
    avg_pool_forward_kernel[blocks, threads, stream()](as_volume(contiguous(x)), as_volume(y), *params)
    return y


def _avg_pool_backward(dy, x_shape, kernel_size, stride, padding):
    params, out = _geometry(x_shape, kernel_size, stride, padding)
    _check_dy(dy, x_shape, out)
    dx = xp().empty(x_shape, dtype=dy.dtype)
    blocks, threads = grid_1d(dx.size)
    avg_pool_backward_kernel[blocks, threads, stream()](as_volume(contiguous(dy)), as_volume(dx), *params)
    return dx


# ------------------------------------------------------------------ the public functions
def max_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Max pooling of ``x (N, C, H, W)``: returns ``(y (N, C, Ho, Wo), argmax (N, C, Ho, Wo) int64)``."""
    checks.array(x, "x", 4)
    return _max_pool_forward(x, kernel_size, stride, padding)


def max_pool2d_backward(dy, argmax, x_shape, kernel_size, stride=None, padding=0):
    """Route each ``dy`` to the window's maximum recorded in ``argmax``: returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 4)
    return _max_pool_backward(dy, argmax, checks.shape4(x_shape, "x_shape"), kernel_size, stride, padding)


def avg_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Average pooling (``count_include_pad=True``): ``(N, C, H, W)`` -> ``(N, C, Ho, Wo)``."""
    checks.array(x, "x", 4)
    return _avg_pool_forward(x, kernel_size, stride, padding)


def avg_pool2d_backward(dy, x_shape, kernel_size, stride=None, padding=0):
    """Spread each ``dy`` evenly over its window (padding included): returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 4)
    return _avg_pool_backward(dy, checks.shape4(x_shape, "x_shape"), kernel_size, stride, padding)


def max_pool3d_forward(x, kernel_size, stride=None, padding=0):
    """Max pooling of ``x (N, C, D, H, W)``: returns ``(y (N, C, Do, Ho, Wo), argmax int64)``,
    ``argmax`` the flat offset ``(a*Kh + i)*Kw + j`` of each window's first maximum."""
    checks.array(x, "x", 5)
    return _max_pool_forward(x, kernel_size, stride, padding)


def max_pool3d_backward(dy, argmax, x_shape, kernel_size, stride=None, padding=0):
    """Route each ``dy (N, C, Do, Ho, Wo)`` to its window's maximum: returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 5)
    return _max_pool_backward(dy, argmax, checks.shape5(x_shape, "x_shape"), kernel_size, stride, padding)


def avg_pool3d_forward(x, kernel_size, stride=None, padding=0):
    """Average pooling of volumes (``count_include_pad=True``): ``(N, C, D, H, W)`` -> ``(N, C, Do, Ho, Wo)``."""
    checks.array(x, "x", 5)
    return _avg_pool_forward(x, kernel_size, stride, padding)


def avg_pool3d_backward(dy, x_shape, kernel_size, stride=None, padding=0):
    """Spread each ``dy`` evenly over its window (padding included): returns ``dx`` of ``x_shape``."""
    checks.array(dy, "dy", 5)
    return _avg_pool_backward(dy, checks.shape5(x_shape, "x_shape"), kernel_size, stride, padding)
