"""3-D convolution backward-data: ``dx (N, C, D, H, W)`` from ``dy (N, F, Do, Ho, Wo)`` and
``w (F, C/groups, Kd, Kh, Kw)``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dx`` element, gathering every ``(f, a, i, j)`` whose
   output voxel reads it (no atomics: each ``dx`` has exactly one writer).
2. tiled implicit GEMM with the weights transposed:
   ``dX[m, c] = sum_k dY[m, k] W[k, c]`` with ``m = (n, d, h, w)``, ``k = (f, a, i, j)``;
   the 2-D kernel's tiles, stages and micro-tiles.

The 2-D backward-data (``conv_backward_data.py``) with a depth axis: tap ``(a, i, j)``
reaches input voxel ``(d, h, w)`` only when ``output_pixel`` finds an output voxel along
each of the three dims.  Checked against ``refconv.reference.conv3d_backward_data`` by
``tests/test_kernels3d.py``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, LOADS_B, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    check_groups, contiguous, gemm_grid, grid_1d, output_pixel, split4, split5, xp,
)
from .conv_forward import check_version
from refconv import checks


@kernel_jit
def backward_data3d_direct(dy, w, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups):
    """Version 1.  Thread ``t`` computes ``dx.flat[t]``; no shared memory; float64 accumulator."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    _, C, D, H, W = dx.shape
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    F, Cg, Kd, Kh, Kw = w.shape
    Fg = F // groups
    n, c, d, h, x_w = split5(index, C, D, H, W)
    g, c_in_group = c // Cg, c % Cg
    acc = 0.0
    for a in range(Kd):
        od = output_pixel(d, a, sd, pd, dd, Do)
        if od < 0:
            continue  # no output plane reads input plane d through tap a
        for i in range(Kh):
            oh = output_pixel(h, i, sh, ph, dh, Ho)
            if oh < 0:
                continue
            for j in range(Kw):
                ow = output_pixel(x_w, j, sw, pw, dw, Wo)
                if ow < 0:
                    continue
                for f in range(g * Fg, (g + 1) * Fg):
                    acc += dy[n, f, od, oh, ow] * w[f, c_in_group, a, i, j]
    dx[n, c, d, h, x_w] = acc


@functools.cache
def backward_data3d_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g = blockIdx.z``: ``M = N*D*H*W`` rows ``m = (n, d, h, w)``,
    ``N_gemm = C/groups`` columns ``c``, depth ``K = F/groups*Kd*Kh*Kw`` with
    ``k = (f, a, i, j)``.  Shared memory per stage: ``a_tile[kk, mm] = dy[n, f, od, oh, ow]``
    where ``(od, oh, ow)`` reads ``(d, h, w)`` through tap ``(a, i, j)`` (zero if none does),
    and ``b_tile[kk, cc] = w[f, c, a, i, j]``.
    """

    @tiled_jit
    def kernel(dy, w, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups):
        # dy: (N, F, Do, Ho, Wo); w: (F, Cg, Kd, Kh, Kw); dx: (N, C, D, H, W)
        N, C, D, H, W = dx.shape
        Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
        F, Cg, Kd, Kh, Kw = w.shape
        Fg = F // groups
        M = N * D * H * W
        K = Fg * Kd * Kh * Kw
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

        # This thread's A row (an input voxel) is fixed; decompose it once.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, d, h, x_w = split4(m, D, H, W)
        b_k = t % TILE_K
        b_c = t // TILE_K

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * (THREADS * THREADS // TILE_M)
                k = k0 + kk
                value = zero
                if m < M and k < K:
                    f, a, i, j = split4(k, Kd, Kh, Kw)
                    od = output_pixel(d, a, sd, pd, dd, Do)
                    oh = output_pixel(h, i, sh, ph, dh, Ho)
                    ow = output_pixel(x_w, j, sw, pw, dw, Wo)
                    if od >= 0 and oh >= 0 and ow >= 0:
                        value = dy[n, g * Fg + f, od, oh, ow]
                a_tile[kk, a_m] = value
            for load in range(LOADS_B):
                cc = b_c + load * (THREADS * THREADS // TILE_K)
                c = c0 + cc
                k = k0 + b_k
                value = zero
                if c < Cg and k < K:
                    f, a, i, j = split4(k, Kd, Kh, Kw)
                    value = w[g * Fg + f, c, a, i, j]
                b_tile[b_k, cc] = value
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        for ii in range(MICRO):
            m = m0 + tx + ii * THREADS
            if m < M:
                n, d, h, x_w = split4(m, D, H, W)
                for jj in range(MICRO):
                    c = c0 + ty + jj * THREADS
                    if c < Cg:
                        dx[n, g * Cg + c, d, h, x_w] = acc[ii, jj]

    return kernel


def conv3d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``dx (N, C, D, H, W) = x_shape`` from ``dy (N, F, Do, Ho, Wo)`` and ``w (F, C/g, Kd, Kh, Kw)``, on
    device arrays.  Same arguments, semantics and errors as ``refconv.reference.conv3d_backward_data``."""
    checks.array(dy, "dy", 5)
    checks.array(w, "w", 5)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape5(x_shape, "x_shape")
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw), groups, out = checks.conv_geometry(
        x_shape, w.shape, stride, padding, dilation, groups, dims=3)
    checks.dy_shape(dy, x_shape, w.shape, out)
    check_version(version)
    N, C, D, H, W = x_shape
    dy, w = contiguous(dy), contiguous(w)
    dx = xp().empty(x_shape, dtype=dy.dtype)
    if version == 1:
        blocks, threads = grid_1d(dx.size)
        backward_data3d_direct[blocks, threads, stream()](dy, w, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups)
    else:
        check_groups(groups)
        blocks, threads = gemm_grid(N * D * H * W, C // groups, groups)
        backward_data3d_tiled(dy.dtype.type)[blocks, threads, stream()](dy, w, dx, sd, sh, sw, pd, ph, pw,
                                                                        dd, dh, dw, groups)
    return dx
