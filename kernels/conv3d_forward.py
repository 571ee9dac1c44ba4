"""3-D convolution forward: ``y (N, F, Do, Ho, Wo) = conv3d(x (N, C, D, H, W), w (F, C/groups, Kd, Kh, Kw))``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per output element, a plain loop over ``C/groups x Kd x Kh x Kw``.
2. tiled implicit GEMM: ``Y[m, f] = sum_k X[m, k] W[k, f]`` with ``m = (n, od, oh, ow)``,
   ``k = (c, a, i, j)``; the 2-D kernel's 64 x 64 output tiles, 16-deep shared-memory
   stages of the vol2col'd input (gathered on the fly, never materialised) and of the
   weights, and 4 x 4 register micro-tiles (``_launch.multiply_stage``).

The 2-D forward (``conv_forward.py``) with a depth axis: each input voxel is
``input_pixel`` applied along depth, height and width.  Both are checked against
``refconv.reference.conv3d_forward`` by ``tests/test_kernels3d.py``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, load_weight_stage, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    check_groups, contiguous, gemm_grid, grid_1d, input_pixel, split4, split5, xp,
)
from .conv_forward import check_version
from .elementwise import bias_add
from refconv import checks


@kernel_jit
def forward3d_direct(x, w, y, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups):
    """Version 1.  Thread ``t`` computes ``y.flat[t]``; no shared memory; float64 accumulator."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    _, C, D, H, W = x.shape
    F, Cg, Kd, Kh, Kw = w.shape
    n, f, od, oh, ow = split5(index, F, y.shape[2], y.shape[3], y.shape[4])
    c0 = (f // (F // groups)) * Cg  # first input channel of f's group
    acc = 0.0
    for c in range(Cg):
        for a in range(Kd):
            id_ = input_pixel(od, a, sd, pd, dd)
            if id_ < 0 or id_ >= D:
                continue  # the tap reads zero padding
            for i in range(Kh):
                ih = input_pixel(oh, i, sh, ph, dh)
                if ih < 0 or ih >= H:
                    continue
                for j in range(Kw):
                    iw = input_pixel(ow, j, sw, pw, dw)
                    if 0 <= iw < W:
                        acc += x[n, c0 + c, id_, ih, iw] * w[f, c, a, i, j]
    y[n, f, od, oh, ow] = acc


@functools.cache
def forward3d_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g = blockIdx.z``: ``M = N*Do*Ho*Wo`` rows ``m = (n, od, oh, ow)``,
    ``N_gemm = F/groups`` columns ``f``, depth ``K = C/groups*Kd*Kh*Kw`` with
    ``k = (c, a, i, j)``.  Shared memory per stage: ``a_tile[kk, mm] = x[n, c, od*s - p + a*d,
    oh*s - p + i*d, ow*s - p + j*d]`` (zero in the padding or past the end) and
    ``b_tile[kk, ff] = w[f, k]``; then as the 2-D tiled forward.
    """

    @tiled_jit
    def kernel(x, w2, y, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups):
        # x: (N, C, D, H, W); w2: (F, Cg*Kd*Kh*Kw), the weights flattened; y: (N, F, Do, Ho, Wo)
        N, C, D, H, W = x.shape
        Do, Ho, Wo = y.shape[2], y.shape[3], y.shape[4]
        F, K = w2.shape
        Fg, Cg = F // groups, C // groups
        M = N * Do * Ho * Wo
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

        # This thread's A row (an output voxel) is fixed: its corner input voxel once, outside the K loop.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, od, oh, ow = split4(m, Do, Ho, Wo)
        id0 = input_pixel(od, 0, sd, pd, dd)
        ih0 = input_pixel(oh, 0, sh, ph, dh)
        iw0 = input_pixel(ow, 0, sw, pw, dw)

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * (THREADS * THREADS // TILE_M)
                k = k0 + kk
                value = zero
                if m < M and k < K:
                    c, a, i, j = split4(k, Kd, Kh, Kw)
                    id_ = id0 + a * dd
                    ih = ih0 + i * dh
                    iw = iw0 + j * dw
                    if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, id_, ih, iw]
                a_tile[kk, a_m] = value
            load_weight_stage(b_tile, w2, g * Fg, Fg, f0, k0, K, t)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        for ii in range(MICRO):
            m = m0 + tx + ii * THREADS
            if m < M:
                n, od, oh, ow = split4(m, Do, Ho, Wo)
                for jj in range(MICRO):
                    f = f0 + ty + jj * THREADS
                    if f < Fg:
                        y[n, g * Fg + f, od, oh, ow] = acc[ii, jj]

    return kernel


def conv3d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``y = conv3d(x, w) + b`` on device arrays: ``(N, C, D, H, W), (F, C/g, Kd, Kh, Kw), (F,)``
    -> ``(N, F, Do, Ho, Wo)``.  Same arguments, semantics and errors as
    ``refconv.reference.conv3d_forward`` (``padding_mode`` zeros only)."""
    checks.forward_arrays(x, w, b, dims=3)
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw), groups, out = checks.conv_geometry(
        x.shape, w.shape, stride, padding, dilation, groups, dims=3)
    check_version(version)
    N = x.shape[0]
    F, Cg, Kd, Kh, Kw = w.shape
    x, w = contiguous(x), contiguous(w)
    y = xp().empty((N, F, *out), dtype=x.dtype)
    if version == 1:
        blocks, threads = grid_1d(y.size)
        forward3d_direct[blocks, threads, stream()](x, w, y, sd, sh, sw, pd, ph, pw, dd, dh, dw, groups)
    else:
        check_groups(groups)
        blocks, threads = gemm_grid(N * out[0] * out[1] * out[2], F // groups, groups)
        w2 = w.reshape(F, Cg * Kd * Kh * Kw)
        forward3d_tiled(x.dtype.type)[blocks, threads, stream()](x, w2, y, Kd, Kh, Kw, sd, sh, sw, pd, ph, pw,
                                                                 dd, dh, dw, groups)
    if b is not None:
        bias_add(y.reshape(N, F, out[0], out[1] * out[2]), b)  # (N, F, Do, Ho*Wo): a view, added in place
    return y
