"""Convolution forward, images and volumes: ``y (N, F, [Do,] Ho, Wo) = conv(x (N, C, [D,] H, W), w (F, C/groups, [Kd,] Kh, Kw))``.

One kernel per version serves both: an image is a volume of depth 1 (``geometry.as_volume``).

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per output element, a plain loop over ``C/groups x Kd x Kh x Kw``.
2. tiled implicit GEMM: ``Y[m, f] = sum_k X[m, k] W[k, f]`` with ``m = (n, s)``, ``s`` the flat
   output position ``(od, oh, ow)``, and ``k = (c, tap)``, ``tap = (a, i, j)``; 64 x 64 output
   tiles, 16-deep shared-memory stages of the im2col'd input (gathered on the fly, never
   materialised) and of the weights, and a 4 x 4 register micro-tile per thread.  The loader
   carries ``(c, tap)`` from load to load and reads each tap's offsets from ``tap_table``: no
   divide per load.
3. register-tiled (float32; float64 runs version 2): the same GEMM in 128 x 128 tiles with 8 x 8
   register micro-tiles, two 8-deep shared stages (the next one's global loads in registers while
   this one is multiplied), a gather through per-row windows and a per-depth table, and 32-bit
   indices (``loop_v3.gemm_loop``).

All three are checked against ``refconv.reference.conv2d_forward`` and ``conv3d_forward`` by
``tests/cuda_kernels/test_kernels.py`` and ``tests/cuda_kernels/test_kernels3d.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools

from numba import cuda

from . import tiles_v3 as v3
from .geometry import (
    THREADS, advance2, as_volume, check_groups, contiguous, geometry3, grid_1d, input_pixel, kernel_jit, split2,
    split3, split5, stream, tap_table, xp,
)
from .loop_v3 import gemm_loop
from .multiply_v2 import multiply_stage
from .scalars import int32, int64, uint32
from .tiles_v2 import (
    A_STAGE, B_STAGE, LOADS_A, MICRO, TILE_K, TILE_M, TILE_N, gemm_grid, load_weight_stage, tiled_jit, zero_fill,
)
# Version 3's array shapes, by name: Numba takes a shape only from a plain global (it reads v3.TILES
# as a run-time int), and version 2's MICRO is 4
from .tiles_v3 import ALIGN, LOADS, TILES, WINDOWS, MICRO as MICRO3
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


@functools.cache
def forward_register_tiled(dtype):
    """Version 3, compiled for ``dtype`` (float32): version 2's GEMM in 128 x 128 block tiles with 8 x 8 register
    micro-tiles, 8-deep double-buffered stages and 32-bit indices (``loop_v3.gemm_loop``, docs/kernels.md).

    Per group ``g = blockIdx.z``, rows ``m = (n, s)``, columns ``f``, depth ``k = (c, tap)``, as version 2.
    Threads ``t < 128`` first write the window corner of row ``m0 + t`` (flat, and ``(od*sd - pd, oh*sh - ph,
    ow*sw - pw)``) into shared memory, once; the gather adds a depth's offset from :func:`tiles_v3.offset_table`.  B is
    the weights, zero-padded per group to whole tiles and stages (``v3.padded_operand``).
    """

    @v3.tiled_jit
    def kernel(x, w, table, y, N, C, D, H, W, S, Ho, Wo, sd, sh, sw, pd, ph, pw, Cg, Fg, F, Fp, Kp):
        # x: (N*C*D*H*W,) flat; w: (groups*Fp*Kp,), the weights per group padded with zeros to Fp filters (whole
        # tiles) of Kp (whole stages, an even number, plus a spare one); table: (Kp, 4) int32 (v3.offset_table);
        # y: (N*F*S,) flat, S = Do*Ho*Wo
        M = int32(N * S)
        g = cuda.blockIdx.z
        m0 = cuda.blockIdx.x * v3.BLOCK
        f0 = cuda.blockIdx.y * v3.BLOCK
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        t = uint32(ty * THREADS + tx)
        zero = dtype(0)

        a_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, m), flat (2, 8, 132)
        b_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, f), flat (2, 8, 132)
        acc = cuda.local.array((MICRO3, MICRO3), dtype)
        a_reg = cuda.local.array(MICRO3, dtype)
        b_reg = cuda.local.array(MICRO3, dtype)
        a_next = cuda.local.array(LOADS, dtype)  # the next stage's loads, held in registers
        b_next = cuda.local.array(LOADS, dtype)
        windows = cuda.shared.array(WINDOWS, int32, alignment=ALIGN)  # (128, 4): per A row, its window's corner
        v3.zero_fill(acc)

        # A: the corner of each row's window, flat and per axis, once for the whole kernel (thread t < 128: row t)
        if t < v3.BLOCK:
            m = m0 + int64(t)  # signed 64-bit here: a padded corner is negative
            n, s = split2(min(m, M - 1), S)
            od, oh, ow = split3(s, Ho, Wo)
            windows[t, 1] = int32(od * sd - pd) if m < M else int32(-v3.FAR)  # a row past the end reads zeros
            windows[t, 2] = int32(oh * sh - ph)
            windows[t, 3] = int32(ow * sw - pw)
            windows[t, 0] = int32((((n * C + g * Cg) * D + od * sd - pd) * H + oh * sh - ph) * W + ow * sw - pw)
        cuda.syncthreads()  # windows
        gemm_loop(x, w, table, windows, a_tile, b_tile, acc, a_reg, b_reg, a_next, b_next, 0, Kp - v3.TILE_K,
                  uint32(D), uint32(H), uint32(W), uint32((g * Fp + f0) * Kp), Kp, zero)

        ra = tx * v3.RUN
        rb = ty * v3.RUN
        v3.store_rows(y, acc, 0, m0 + ra, M, S, F, g * Fg, f0 + rb, Fg)
        v3.store_rows(y, acc, v3.RUN, m0 + ra + v3.HALF, M, S, F, g * Fg, f0 + rb, Fg)

    return kernel


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=3):
    """``y = conv2d(x, w) + b`` on device arrays: ``(N, C, H, W), (F, C/g, Kh, Kw), (F,)`` -> ``(N, F, Ho, Wo)``.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_forward``.
    """
    checks.forward_arrays(x, w, b)
    geometry = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    check_version(version)
    return _forward(x, w, b, geometry, 2, version)


def conv3d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, version=3):
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
    if version == 3 and x.dtype == "float32":  # float64: version 2 (64 accumulators would fill 128 registers)
        Cg, Kd, Kh, Kw = w5.shape[1:]
        v3.check_int32(x=x5, w=w5, y=y)
        blocks, threads = v3.gemm_grid(N * Do * Ho * Wo, F // groups, groups)
        table = v3.offset_table(Cg, x5.shape[2:], (Kd, Kh, Kw), (dd, dh, dw))
        Fg, K, Kp = F // groups, Cg * Kd * Kh * Kw, table.shape[0]
        Fp = blocks[1] * v3.BLOCK
        w_padded = v3.padded_operand(w5, groups, Fg, K, Fp, Kp)  # whole tiles: the B loads need no test
        v3.check_int32(w=w_padded)
        forward_register_tiled(x.dtype.type)[blocks, threads, stream()](
            x5.reshape(-1), w_padded.reshape(-1), table, y.reshape(-1), N, x5.shape[1], *x5.shape[2:],
            Do * Ho * Wo, Ho, Wo, sd, sh, sw, pd, ph, pw, Cg, Fg, F, Fp, Kp)
    elif version == 1:
        blocks, threads = grid_1d(y.size)
        forward_direct[blocks, threads, stream()](x5, w5, as_volume(y), sd, sh, sw, pd, ph, pw, dd, dh, dw,
                                                  F // groups)
    else:  # version 2, and version 3 in float64
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
    if version not in (1, 2, 3):
        raise ValueError(f"version: expected 1 (direct), 2 (tiled) or 3 (register-tiled), got {version!r}")
