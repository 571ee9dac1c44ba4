"""Convolution backward-data: ``dx (N, C, H, W)`` from ``dy (N, F, Ho, Wo)`` and ``w (F, C/groups, Kh, Kw)``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dx`` element, gathering every ``(f, i, j)`` whose
   output pixel reads it (no atomics: each ``dx`` has exactly one writer).
2. tiled implicit GEMM with the weights transposed:
   ``dX[m, c] = sum_k dY[m, k] W[k, c]`` with ``m = (n, h, w)``, ``k = (f, i, j)``,
   the same 64 x 64 tiles, 16-deep shared-memory stages and 4 x 4 register
   micro-tiles as the forward kernel.

The gather is stride- and dilation-aware: tap ``(i, j)`` contributes to input
pixel ``h`` only when ``h + padding - i*dilation`` is a multiple of the stride;
other taps read zero.  Checked against ``refconv.reference.conv2d_backward_data``
by ``tests/test_kernels.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, LOADS_B, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    advance3, check_groups, contiguous, gemm_grid, grid_1d, output_pixel, split3, split4, xp,
)
from .conv_forward import check_version
from refconv import checks


@kernel_jit
def backward_data_direct(dy, w, dx, sh, sw, ph, pw, dh, dw, groups):
    """Version 1.  Thread ``t`` computes ``dx.flat[t]``; no shared memory; float64 accumulator."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    _, C, H, W = dx.shape
    Ho, Wo = dy.shape[2], dy.shape[3]
    F, Cg, Kh, Kw = w.shape
    Fg = F // groups
    n, c, h, x_w = split4(index, C, H, W)
    g, c_in_group = c // Cg, c % Cg
    acc = 0.0
    for i in range(Kh):
        oh = output_pixel(h, i, sh, ph, dh, Ho)
        if oh < 0:
            continue  # no output row reads input row h through tap i
        for j in range(Kw):
            ow = output_pixel(x_w, j, sw, pw, dw, Wo)
            if ow < 0:
                continue
            for f in range(g * Fg, (g + 1) * Fg):
                acc += dy[n, f, oh, ow] * w[f, c_in_group, i, j]
    dx[n, c, h, x_w] = acc


@functools.cache
def backward_data_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g = blockIdx.z``: ``M = N*H*W`` rows ``m = (n, h, w)``,
    ``N_gemm = C/groups`` columns ``c``, depth ``K = F/groups*Kh*Kw`` with
    ``k = (f, i, j)``.  Shared memory per stage: ``a_tile[kk, mm] = dy[n, f, oh, ow]``
    where ``(oh, ow)`` is the output pixel that reads ``(h, w)`` through tap
    ``(i, j)`` (zero if none does), and ``b_tile[kk, cc] = w[f, c, i, j]``.
    Thread ``(tx, ty)`` accumulates rows ``tx + 16 ii`` and columns ``ty + 16 jj``.
    """

    @tiled_jit
    def kernel(dy, w, dx, sh, sw, ph, pw, dh, dw, groups):
        # dy: (N, F, Ho, Wo); w: (F, Cg, Kh, Kw); dx: (N, C, H, W)
        N, C, H, W = dx.shape
        Ho, Wo = dy.shape[2], dy.shape[3]
        F, Cg, Kh, Kw = w.shape
        Fg = F // groups
        M = N * H * W
        K = Fg * Kh * Kw
        g = cuda.blockIdx.z
        m0 = cuda.blockIdx.x * TILE_M
        c0 = cuda.blockIdx.y * TILE_N
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

        # This thread's A row (an input pixel) is fixed; decompose it once.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, h, x_w = split3(m, H, W)
        # The B element: neighbouring threads take neighbouring k (coalesced reads of w); its k
        # is the same for the four loads of a stage and advances by TILE_K per stage.
        b_k = t % TILE_K
        b_c = t // TILE_K
        fb, ib, jb = split3(b_k, Kh, Kw)

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * (THREADS * THREADS // TILE_M)
                k = k0 + kk
                value = zero
                if m < M and k < K:
                    # Split per load: a running (f, i, j), as the forward loader keeps, cost this
                    # kernel 12 more registers (142 in float64: one block per SM instead of two).
                    f, i, j = split3(k, Kh, Kw)
                    oh = output_pixel(h, i, sh, ph, dh, Ho)
                    ow = output_pixel(x_w, j, sw, pw, dw, Wo)
                    if oh >= 0 and ow >= 0:
                        value = dy[n, g * Fg + f, oh, ow]
                a_tile[kk, a_m] = value
            for load in range(LOADS_B):
                cc = b_c + load * (THREADS * THREADS // TILE_K)
                c = c0 + cc
                k = k0 + b_k
                value = zero
                if c < Cg and k < K:
                    value = w[g * Fg + fb, c, ib, jb]
                b_tile[b_k, cc] = value
            fb, ib, jb = advance3(fb, ib, jb, TILE_K, Kh, Kw)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        n, h, x_w = split3(m0 + tx, H, W)  # this thread's rows m0 + tx + 16 ii, advanced by 16
        for ii in range(MICRO):
            if m0 + tx + ii * THREADS < M:
                for jj in range(MICRO):
                    c = c0 + ty + jj * THREADS
                    if c < Cg:
                        dx[n, g * Cg + c, h, x_w] = acc[ii, jj]
            n, h, x_w = advance3(n, h, x_w, THREADS, H, W)

    return kernel


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``dx (N, C, H, W) = x_shape`` from ``dy (N, F, Ho, Wo)`` and ``w (F, C/g, Kh, Kw)``, on device arrays.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_backward_data``.
    """
    checks.array(dy, "dy", 4)
    checks.array(w, "w", 4)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape4(x_shape, "x_shape")
    (sh, sw), (ph, pw), (dh, dw), groups, out_hw = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x_shape, w.shape, out_hw)
    check_version(version)
    N, C, H, W = x_shape
    dy, w = contiguous(dy), contiguous(w)
    dx = xp().empty(x_shape, dtype=dy.dtype)
    if version == 1:
        blocks, threads = grid_1d(dx.size)
        backward_data_direct[blocks, threads, stream()](dy, w, dx, sh, sw, ph, pw, dh, dw, groups)
    else:
        check_groups(groups)
        blocks, threads = gemm_grid(N * H * W, C // groups, groups)
        backward_data_tiled(dy.dtype.type)[blocks, threads, stream()](dy, w, dx, sh, sw, ph, pw, dh, dw, groups)
    return dx
