"""Convolution forward: ``y (N, F, Ho, Wo) = conv2d(x (N, C, H, W), w (F, C/groups, Kh, Kw))``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per output element, a plain loop over ``C/groups x Kh x Kw``.
2. tiled implicit GEMM: ``Y[m, f] = sum_k X[m, k] W[k, f]`` with ``m = (n, oh, ow)``,
   ``k = (c, i, j)``; 64 x 64 output tiles, 16-deep shared-memory stages of the
   im2col'd input (gathered on the fly, never materialised) and of the weights,
   and a 4 x 4 register micro-tile per thread.

Both are checked against ``refconv.reference.conv2d_forward`` by
``tests/test_kernels.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, load_weight_stage, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    advance3, check_groups, contiguous, gemm_grid, grid_1d, input_pixel, split3, split4, xp,
)
from .elementwise import bias_add
from refconv import checks


@kernel_jit
def forward_direct(x, w, y, sh, sw, ph, pw, dh, dw, groups):
    """Version 1.  Thread ``t`` computes ``y.flat[t]``; no shared memory.

    Accumulates in float64 (version 2 accumulates in the input dtype, as cuDNN does).
    """
    index = cuda.grid(1)
    if index >= y.size:
        return
    _, C, H, W = x.shape
    F, Cg, Kh, Kw = w.shape
    n, f, oh, ow = split4(index, F, y.shape[2], y.shape[3])
    c0 = (f // (F // groups)) * Cg  # first input channel of f's group
    acc = 0.0
    for c in range(Cg):
        for i in range(Kh):
            ih = input_pixel(oh, i, sh, ph, dh)
            if ih < 0 or ih >= H:
                continue  # the tap reads zero padding
            for j in range(Kw):
                iw = input_pixel(ow, j, sw, pw, dw)
                if 0 <= iw < W:
                    acc += x[n, c0 + c, ih, iw] * w[f, c, i, j]
    y[n, f, oh, ow] = acc


@functools.cache
def forward_tiled(dtype):
    """Version 2, compiled for ``dtype`` (shared and register tiles need it at compile time).

    GEMM per group ``g = blockIdx.z``: ``M = N*Ho*Wo`` rows ``m = (n, oh, ow)``,
    ``N_gemm = F/groups`` columns ``f``, depth ``K = C/groups*Kh*Kw`` with
    ``k = (c, i, j)``.  Block ``(bx, by)`` owns rows ``64 bx ..`` and columns ``64 by ..``.

    Shared memory per stage: ``a_tile[kk, mm] = x[n, c, oh*s - p + i*d, ow*s - p + j*d]``
    (zero where that pixel is padding or the row/depth is past the end) and
    ``b_tile[kk, ff] = w[f, k]``.  Thread ``(tx, ty)`` then accumulates rows
    ``tx + 16 ii`` and columns ``ty + 16 jj`` (``ii, jj < 4``) in registers, and
    finally writes them with bounds guards.
    """

    @tiled_jit
    def kernel(x, w2, y, Kh, Kw, sh, sw, ph, pw, dh, dw, groups):
        # x: (N, C, H, W); w2: (F, Cg*Kh*Kw), the weights flattened; y: (N, F, Ho, Wo)
        N, C, H, W = x.shape
        Ho, Wo = y.shape[2], y.shape[3]
        F, K = w2.shape
        Fg, Cg = F // groups, C // groups
        M = N * Ho * Wo
        g = cuda.blockIdx.z
        m0 = cuda.blockIdx.x * TILE_M
        f0 = cuda.blockIdx.y * TILE_N
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * THREADS + tx
        zero = dtype(0)

        a_tile = cuda.shared.array(A_STAGE, dtype)
        b_tile = cuda.shared.array(B_STAGE, dtype)
        acc = cuda.local.array((MICRO, MICRO), dtype)
        a_reg = cuda.local.array(MICRO, dtype)
        b_reg = cuda.local.array(MICRO, dtype)
        zero_fill(acc)

        # The A element this thread loads always sits in tile row a_m: neighbouring
        # threads take neighbouring output pixels (coalesced reads of x).  Its
        # (n, oh, ow) and the top-left input pixel are computed once, outside the K loop.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, oh, ow = split3(m, Ho, Wo)
        ih0 = input_pixel(oh, 0, sh, ph, dh)
        iw0 = input_pixel(ow, 0, sw, pw, dw)
        # The k this thread loads walks a_k, a_k + 4, a_k + 8, ... through the loads of every
        # stage in turn: split it into (c, i, j) once, then advance it by carrying.
        c, i, j = split3(a_k, Kh, Kw)

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * (THREADS * THREADS // TILE_M)
                k = k0 + kk
                value = zero
                if m < M and k < K:
                    ih = ih0 + i * dh
                    iw = iw0 + j * dw
                    if 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, ih, iw]
                a_tile[kk, a_m] = value
                c, i, j = advance3(c, i, j, THREADS * THREADS // TILE_M, Kh, Kw)
            load_weight_stage(b_tile, w2, g * Fg, Fg, f0, k0, K, t)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        n, oh, ow = split3(m0 + tx, Ho, Wo)  # this thread's rows m0 + tx + 16 ii, advanced by 16
        for ii in range(MICRO):
            if m0 + tx + ii * THREADS < M:
                for jj in range(MICRO):
                    f = f0 + ty + jj * THREADS
                    if f < Fg:
                        y[n, g * Fg + f, oh, ow] = acc[ii, jj]
            n, oh, ow = advance3(n, oh, ow, THREADS, Ho, Wo)

    return kernel


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``y = conv2d(x, w) + b`` on device arrays: ``(N, C, H, W), (F, C/g, Kh, Kw), (F,)`` -> ``(N, F, Ho, Wo)``.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_forward``.
    """
    checks.forward_arrays(x, w, b)
    (sh, sw), (ph, pw), (dh, dw), groups, (Ho, Wo) = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    check_version(version)
    N, C, H, W = x.shape
    F, Cg, Kh, Kw = w.shape
    x, w = contiguous(x), contiguous(w)
    y = xp().empty((N, F, Ho, Wo), dtype=x.dtype)
    if version == 1:
        blocks, threads = grid_1d(y.size)
        forward_direct[blocks, threads, stream()](x, w, y, sh, sw, ph, pw, dh, dw, groups)
    else:
        check_groups(groups)
        blocks, threads = gemm_grid(N * Ho * Wo, F // groups, groups)
        w2 = w.reshape(F, Cg * Kh * Kw)
        forward_tiled(x.dtype.type)[blocks, threads, stream()](x, w2, y, Kh, Kw, sh, sw, ph, pw, dh, dw, groups)
    if b is not None:
        bias_add(y, b)
    return y


def check_version(version):
    if version not in (1, 2):
        raise ValueError(f"version: expected 1 (direct) or 2 (tiled), got {version!r}")
