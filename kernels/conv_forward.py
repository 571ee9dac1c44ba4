"""Convolution forward, images and volumes: ``y (N, F, [Do,] Ho, Wo) = conv(x (N, C, [D,] H, W), w (F, C/groups, [Kd,] Kh, Kw))``.

One kernel per version serves both: an image is a volume of depth 1 (``_launch.as_volume``).

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per output element, a plain loop over ``C/groups x Kd x Kh x Kw``.
2. tiled implicit GEMM: ``Y[m, f] = sum_k X[m, k] W[k, f]`` with ``m = (n, s)``, ``s`` the flat
   output position ``(od, oh, ow)``, and ``k = (c, tap)``, ``tap = (a, i, j)``; 64 x 64 output
   tiles, 16-deep shared-memory stages of the im2col'd input (gathered on the fly, never
   materialised) and of the weights, and a 4 x 4 register micro-tile per thread.  The loader
   carries ``(c, tap)`` from load to load and reads each tap's offsets from ``tap_table``: no
   divide per load.

Both are checked against ``refconv.reference.conv2d_forward`` and ``conv3d_forward`` by
``tests/test_kernels.py`` and ``tests/test_kernels3d.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, load_weight_stage, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, MICRO, THREADS, TILE_K, TILE_M, TILE_N,
    advance2, as_volume, check_groups, contiguous, gemm_grid, geometry3, grid_1d, input_pixel, split2, split3,
    split5, tap_table, xp,
)
from .elementwise import bias_add
from refconv import checks

A_STEP = THREADS * THREADS // TILE_M  # a thread's loads of one stage are this many k apart


@kernel_jit
def forward_direct(x, w, y, sd, sh, sw, pd, ph, pw, dd, dh, dw, Fg):
    """Version 1.  Thread ``t`` computes ``y.flat[t]``; no shared memory; a float64 accumulator.

    ``x (N, C, D, H, W)``, ``w (F, Cg, Kd, Kh, Kw)``, ``y (N, F, Do, Ho, Wo)``; ``Fg = F / groups``."""
    index = cuda.grid(1)
    if index >= y.size:
        return
    _, C, D, H, W = x.shape
    F, Cg, Kd, Kh, Kw = w.shape
    n, f, od, oh, ow = split5(index, F, y.shape[2], y.shape[3], y.shape[4])
    c0 = split2(f, Fg)[0] * Cg  # first input channel of f's group
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
def forward_tiled(dtype):
    """Version 2, compiled for ``dtype`` (shared and register tiles need it at compile time).

    GEMM per group ``g = blockIdx.z``: ``M = N*Do*Ho*Wo`` rows ``m = (n, s)``, ``N_gemm = F/groups``
    columns ``f``, depth ``K = C/groups*Kd*Kh*Kw`` with ``k = (c, tap)``.  Block ``(bx, by)`` owns
    rows ``64 bx ..`` and columns ``64 by ..``.

    Shared memory per stage: ``a_tile[kk, mm] = x[n, c, od*s - p + a*d, oh*s - p + i*d, ow*s - p + j*d]``
    (zero where that voxel is padding or the row/depth is past the end) and ``b_tile[kk, ff] = w[f, k]``.
    Thread ``(tx, ty)`` then accumulates rows ``tx + 16 ii`` and columns ``ty + 16 jj`` (``ii, jj < 4``)
    in registers, and finally writes them with bounds guards.
    """

    @tiled_jit
    def kernel(x, w2, taps, y, Ho, Wo, sd, sh, sw, pd, ph, pw, Cg, Fg):
        # x: (N, C, D, H, W); w2: (F, Cg*T), the weights flattened; taps: (T, 6), the offsets in columns
        # 0, 2, 4 (tap_table with stride 1); y: (N, F, S), S = Do*Ho*Wo flat
        N, _, D, H, W = x.shape
        S = y.shape[2]
        K = w2.shape[1]
        T = taps.shape[0]
        M = N * S
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

        # The A element this thread loads always sits in tile row a_m: neighbouring threads take
        # neighbouring output positions (coalesced reads of x).  Its (n, od, oh, ow) and the corner
        # of its window are computed once, outside the K loop.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, s = split2(m, S)
        od, oh, ow = split3(s, Ho, Wo)
        id0 = input_pixel(od, 0, sd, pd, 0)
        ih0 = input_pixel(oh, 0, sh, ph, 0)
        iw0 = input_pixel(ow, 0, sw, pw, 0)
        # The k this thread loads walks a_k, a_k + 4, a_k + 8, ... through every stage in turn:
        # k = c*T + tap, carried from (0, 0) without dividing.
        c, tap = advance2(0, 0, a_k, T)

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * A_STEP
                value = zero
                if m < M and k0 + kk < K:
                    id_ = id0 + taps[tap, 0]
                    ih = ih0 + taps[tap, 2]
                    iw = iw0 + taps[tap, 4]
                    if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, id_, ih, iw]
                a_tile[kk, a_m] = value
                c, tap = advance2(c, tap, A_STEP, T)
            load_weight_stage(b_tile, w2, g * Fg, Fg, f0, k0, K, t)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        n, s = split2(m0 + tx, S)  # this thread's rows m0 + tx + 16 ii, advanced by 16
        for ii in range(MICRO):
            if m0 + tx + ii * THREADS < M:
                for jj in range(MICRO):
                    f = f0 + ty + jj * THREADS
                    if f < Fg:
                        y[n, g * Fg + f, s] = acc[ii, jj]
            n, s = advance2(n, s, THREADS, S)

    return kernel


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``y = conv2d(x, w) + b`` on device arrays: ``(N, C, H, W), (F, C/g, Kh, Kw), (F,)`` -> ``(N, F, Ho, Wo)``.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_forward``.
    """
    checks.forward_arrays(x, w, b)
    geometry = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    check_version(version)
    return _forward(x, w, b, geometry, 2, version)


def conv3d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=2):
    """``y = conv3d(x, w) + b`` on device arrays: ``(N, C, D, H, W), (F, C/g, Kd, Kh, Kw), (F,)``
    -> ``(N, F, Do, Ho, Wo)``.  Same arguments, semantics and errors as
    ``refconv.reference.conv3d_forward`` (``padding_mode`` zeros only)."""
    checks.forward_arrays(x, w, b, dims=3)
    geometry = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups, dims=3)
    check_version(version)
    return _forward(x, w, b, geometry, 3, version)


def _forward(x, w, b, geometry, dims, version):
    """Both versions on the volume views of ``x`` and ``w``; returns ``y`` in ``x``'s number of dims."""
    stride, padding, dilation, groups, out = geometry
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = (geometry3(v, dims, f) for v, f in ((stride, 1), (padding, 0),
                                                                                    (dilation, 1)))
    N, F = x.shape[0], w.shape[0]
    x5, w5 = as_volume(contiguous(x)), as_volume(contiguous(w))
    Do, Ho, Wo = geometry3(out, dims, 1)
    y = xp().empty((N, F, *out), dtype=x.dtype)
    check_groups(groups)
    if version == 1:
        blocks, threads = grid_1d(y.size)
        forward_direct[blocks, threads, stream()](x5, w5, as_volume(y), sd, sh, sw, pd, ph, pw, dd, dh, dw,
                                                  F // groups)
    else:
        Cg, Kd, Kh, Kw = w5.shape[1:]
        blocks, threads = gemm_grid(N * Do * Ho * Wo, F // groups, groups)
        taps = tap_table((Kd, Kh, Kw), (dd, dh, dw), (1, 1, 1))
        forward_tiled(x.dtype.type)[blocks, threads, stream()](
            x5, w5.reshape(F, Cg * Kd * Kh * Kw), taps, y.reshape(N, F, Do * Ho * Wo), Ho, Wo,
            sd, sh, sw, pd, ph, pw, Cg, F // groups)
    if b is not None:
        bias_add(y.reshape(N, F, Do * Ho, Wo), b)  # (N, F, Do*Ho, Wo): a view, added in place
    return y


def check_version(version):
    if version not in (1, 2):
        raise ValueError(f"version: expected 1 (direct) or 2 (tiled), got {version!r}")
