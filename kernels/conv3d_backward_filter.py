"""3-D convolution backward-filter: ``dw (F, C/groups, Kd, Kh, Kw)`` from ``x (N, C, D, H, W)``
and ``dy (N, F, Do, Ho, Wo)``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dw`` element, a loop over all ``N*Do*Ho*Wo`` output voxels.
2. tiled implicit GEMM: ``dW[f, q] = sum_p dY[f, p] X[p, q]`` with ``q = (c, a, i, j)``,
   ``p = (n, od, oh, ow)``; the 2-D kernel's tiles, stages and micro-tiles, and its
   split-K (``choose_splits``): the long reduction is cut across blocks, each storing its
   partial tile into its own slice of a ``(splits, F, Q)`` workspace, which the 2-D
   ``sum_splits`` adds in the fixed order ``0, 1, ..., splits-1``: no atomics, deterministic.

The 2-D backward-filter (``conv_backward_filter.py``) with a depth axis.  Checked against
``refconv.reference.conv3d_backward_filter`` by ``tests/test_kernels3d.py``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, store_flat_tile, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, LOADS_B, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    contiguous, gemm_grid, grid_1d, input_pixel, split4, split5, xp,
)
from .conv_backward_filter import split_k, sum_splits
from .conv_forward import check_version
from refconv import checks


@kernel_jit
def backward_filter3d_direct(x, dy, dw, sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups):
    """Version 1.  Thread ``t`` computes ``dw.flat[t]``; no shared memory; float64 accumulator."""
    index = cuda.grid(1)
    if index >= dw.size:
        return
    N, C, D, H, W = x.shape
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    F, Cg, Kd, Kh, Kw = dw.shape
    f, c, a, i, j = split5(index, Cg, Kd, Kh, Kw)
    c_x = (f // (F // groups)) * Cg + c  # the input channel this weight reads
    acc = 0.0
    for n in range(N):
        for od in range(Do):
            id_ = input_pixel(od, a, sd, pd, dil_d)
            if id_ < 0 or id_ >= D:
                continue
            for oh in range(Ho):
                ih = input_pixel(oh, i, sh, ph, dil_h)
                if ih < 0 or ih >= H:
                    continue
                for ow in range(Wo):
                    iw = input_pixel(ow, j, sw, pw, dil_w)
                    if 0 <= iw < W:
                        acc += dy[n, f, od, oh, ow] * x[n, c_x, id_, ih, iw]
    dw[f, c, a, i, j] = acc


@functools.cache
def backward_filter3d_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g``: ``M = F/groups`` rows ``f``, ``N_gemm = C/groups*Kd*Kh*Kw``
    columns ``q = (c, a, i, j)``, depth ``K = N*Do*Ho*Wo`` with ``p = (n, od, oh, ow)``.
    ``blockIdx.z = g * splits + s``: slice ``s`` covers depth ``[s * k_split, (s + 1) * k_split)``.
    Shared memory per stage: ``a_tile[kk, ff] = dy[n, f, od, oh, ow]`` and
    ``b_tile[kk, qq] = x[n, c, od*s - p + a*d, oh*s - p + i*d, ow*s - p + j*d]`` (zero in the
    padding); the block stores its tile into ``partial[s]``, every element written once.
    """

    @tiled_jit
    def kernel(x, dy, partial, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups, k_split):
        # x: (N, C, D, H, W); dy: (N, F, Do, Ho, Wo); partial: (splits, F, Cg*Kd*Kh*Kw)
        N, C, D, H, W = x.shape
        Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
        splits, F, Q = partial.shape
        Fg, Cg = F // groups, C // groups
        K = N * Do * Ho * Wo
        g = cuda.blockIdx.z // splits
        s = cuda.blockIdx.z % splits
        k_begin = s * k_split
        k_end = min(K, k_begin + k_split)
        f0 = cuda.blockIdx.x * TILE_M
        q0 = cuda.blockIdx.y * TILE_N
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

        # A (dy) is contiguous along p: neighbouring threads take neighbouring p.
        a_k = t % TILE_K
        a_f = t // TILE_K
        # B (x): this thread's column q = (c, a, i, j) is fixed; decompose it once.
        b_q = t % TILE_N
        b_k = t // TILE_N
        q = q0 + b_q
        c, a, i, j = split4(q, Kd, Kh, Kw)

        for tile in range((k_end - k_begin + TILE_K - 1) // TILE_K):
            k0 = k_begin + tile * TILE_K
            for load in range(LOADS_A):
                ff = a_f + load * (THREADS * THREADS // TILE_K)
                f = f0 + ff
                p = k0 + a_k
                value = zero
                if f < Fg and p < k_end:
                    n, od, oh, ow = split4(p, Do, Ho, Wo)
                    value = dy[n, g * Fg + f, od, oh, ow]
                a_tile[a_k, ff] = value
            for load in range(LOADS_B):
                kk = b_k + load * (THREADS * THREADS // TILE_N)
                p = k0 + kk
                value = zero
                if q < Q and p < k_end:
                    n, od, oh, ow = split4(p, Do, Ho, Wo)
                    id_ = input_pixel(od, a, sd, pd, dil_d)
                    ih = input_pixel(oh, i, sh, ph, dil_h)
                    iw = input_pixel(ow, j, sw, pw, dil_w)
                    if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, id_, ih, iw]
                b_tile[kk, b_q] = value
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        store_flat_tile(partial[s], acc, g * Fg, Fg, f0, q0, Q, tx, ty)  # partial[s]: (F, Q), flat in q = (c, a, i, j)

    return kernel


def conv3d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, version=2, splits=None):
    """``dw (F, C/g, Kd, Kh, Kw) = w_shape`` from ``x (N, C, D, H, W)`` and ``dy (N, F, Do, Ho, Wo)``, on
    device arrays.  Same arguments, semantics and errors as ``refconv.reference.conv3d_backward_filter``;
    ``splits`` (version 2 only) fixes the split-K factor, as in ``conv2d_backward_filter``."""
    checks.array(x, "x", 5)
    checks.array(dy, "dy", 5)
    checks.same_dtype(x=x, dy=dy)
    w_shape = checks.shape5(w_shape, "w_shape")
    (sd, sh, sw), (pd, ph, pw), (dil_d, dil_h, dil_w), groups, out = checks.conv_geometry(
        x.shape, w_shape, stride, padding, dilation, groups, dims=3)
    checks.dy_shape(dy, x.shape, w_shape, out)
    check_version(version)
    N = x.shape[0]
    F, Cg, Kd, Kh, Kw = w_shape
    x, dy = contiguous(x), contiguous(dy)
    geometry = (sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups)
    if version == 1:
        dw = xp().empty(w_shape, dtype=x.dtype)
        blocks, threads = grid_1d(dw.size)
        backward_filter3d_direct[blocks, threads, stream()](x, dy, dw, *geometry)
        return dw
    K = N * out[0] * out[1] * out[2]
    (bx, by, _), threads = gemm_grid(F // groups, Cg * Kd * Kh * Kw)
    splits, k_split = split_k(bx * by, K, groups, splits)
    partial = xp().empty((splits, F, Cg * Kd * Kh * Kw), dtype=x.dtype)  # every element is written once
    backward_filter3d_tiled(x.dtype.type)[(bx, by, groups * splits), threads, stream()](
        x, dy, partial, Kd, Kh, Kw, *geometry, k_split)
    return sum_splits(partial).reshape(w_shape)
