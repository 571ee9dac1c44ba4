"""Convolution backward-data, images and volumes: ``dx (N, C, [D,] H, W)`` from ``dy (N, F, [Do,] Ho, Wo)``
and ``w (F, C/groups, [Kd,] Kh, Kw)``.  One kernel per version serves both (an image is a volume of depth 1).

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dx`` element, gathering every ``(f, a, i, j)`` whose
   output position reads it (no atomics: each ``dx`` has exactly one writer).
2. tiled implicit GEMM with the weights transposed:
   ``dX[m, c] = sum_k dY[m, k] W[k, c]`` with ``m = (n, s)``, ``s`` the flat input position
   ``(d, h, w)``, and ``k = (f, tap)``; the same 64 x 64 tiles, 16-deep shared-memory stages
   and 4 x 4 register micro-tiles as the forward kernel.
3. register-tiled (float32; float64 runs version 2): the forward's version 3 loop
   (``loop_v3.gemm_loop``) on the same GEMM, with the stride's remainders folded into the
   gather's depth test (``tiles_v3.backward_data_table``).

The gather is stride- and dilation-aware: tap ``i`` contributes to input row ``h`` only when
``h + padding - i*dilation`` is a multiple of the stride; other taps read zero.  Version 2 asks
that without dividing per load: ``h + padding = qh*stride + rh`` once per thread, and
``i*dilation = qi*stride + ri`` from ``tap_table``; the tap reads output row ``qh - qi`` when
``rh == ri``.  Checked against ``refconv.reference.conv2d_backward_data`` and
``conv3d_backward_data`` by ``tests/cuda_kernels/test_kernels.py`` and ``tests/cuda_kernels/test_kernels3d.py``.
"""

import functools

from numba import cuda

from . import tiles_v3 as v3
from .geometry import (
    THREADS, advance2, as_volume, check_groups, contiguous, geometry3, grid_1d, kernel_jit, output_pixel, split2,
    split3, split5, stream, tap_table, xp,
)
from .loop_v3 import gemm_loop
from .multiply_v2 import multiply_stage
from .scalars import int32, int64, uint32
from .tiles_v2 import A_STAGE, B_STAGE, LOADS_A, LOADS_B, MICRO, TILE_K, TILE_M, TILE_N, gemm_grid, tiled_jit, zero_fill
# Version 3's array shapes, by name: Numba takes a shape only from a plain global (it reads v3.TILES
# as a run-time int), and version 2's MICRO is 4
from .tiles_v3 import ALIGN, LOADS, TILES, WINDOWS, MICRO as MICRO3
from .conv_forward import A_STEP, check_version
from refconv import checks

B_STEP = THREADS * THREADS // TILE_K  # the columns of one thread's weight loads are this many apart


@kernel_jit
def backward_data_direct(dy, w, dx, sd, sh, sw, pd, ph, pw, dd, dh, dw, Fg):
    """Version 1.  Thread ``t`` computes ``dx.flat[t]``; no shared memory; a float64 accumulator.

    ``dy (N, F, Do, Ho, Wo)``, ``w (F, Cg, Kd, Kh, Kw)``, ``dx (N, C, D, H, W)``; ``Fg = F / groups``."""
    index = cuda.grid(1)
    if index >= dx.size:
        return
    _, C, D, H, W = dx.shape
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    F, Cg, Kd, Kh, Kw = w.shape
    n, c, d, h, x_w = split5(index, C, D, H, W)
    g, c_in_group = split2(c, Cg)
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
def backward_data_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g = blockIdx.z``: ``M = N*D*H*W`` rows ``m = (n, s)``, ``N_gemm = C/groups``
    columns ``c``, depth ``K = F/groups*Kd*Kh*Kw`` with ``k = (f, tap)``.  Shared memory per stage:
    ``a_tile[kk, mm] = dy[n, f, od, oh, ow]`` where ``(od, oh, ow)`` is the output position that reads
    ``s`` through ``tap`` (zero if none does), and ``b_tile[kk, cc] = w[f, c, tap]``.  Thread
    ``(tx, ty)`` accumulates rows ``tx + 16 ii`` and columns ``ty + 16 jj``.
    """

    @tiled_jit
    def kernel(dy, w3, taps, dx, H, W, sd, sh, sw, pd, ph, pw, Fg):
        # dy: (N, F, Do, Ho, Wo); w3: (F, Cg, T); taps: (T, 6), each tap's offsets divided by the stride
        # (tap_table); dx: (N, C, S), S = D*H*W flat
        N, _, Do, Ho, Wo = dy.shape
        Cg = w3.shape[1]
        S = dx.shape[2]
        T = taps.shape[0]
        M = N * S
        K = Fg * T
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

        # This thread's A row (an input position) is fixed: its coordinates plus padding, divided by
        # the stride, once.
        a_m = t % TILE_M
        a_k = t // TILE_M
        m = m0 + a_m
        n, s = split2(m, S)
        d, h, x_w = split3(s, H, W)
        qd, rd = split2(d + pd, sd)
        qh, rh = split2(h + ph, sh)
        qw, rw = split2(x_w + pw, sw)
        f, tap = advance2(0, 0, a_k, T)  # k = f*T + tap, carried from load to load
        # The B element: neighbouring threads take neighbouring k (coalesced reads of w); its k is
        # the same for the four loads of a stage and advances by TILE_K per stage.
        b_k = t % TILE_K
        b_c = t // TILE_K
        fb, tapb = advance2(0, 0, b_k, T)

        for tile in range((K + TILE_K - 1) // TILE_K):
            k0 = tile * TILE_K
            for load in range(LOADS_A):
                kk = a_k + load * A_STEP
                value = zero
                if m < M and k0 + kk < K and rd == taps[tap, 1] and rh == taps[tap, 3] and rw == taps[tap, 5]:
                    od = qd - taps[tap, 0]  # the output position that reads s through this tap
                    oh = qh - taps[tap, 2]
                    ow = qw - taps[tap, 4]
                    if 0 <= od < Do and 0 <= oh < Ho and 0 <= ow < Wo:
                        value = dy[n, g * Fg + f, od, oh, ow]
                a_tile[kk, a_m] = value
                f, tap = advance2(f, tap, A_STEP, T)
            for load in range(LOADS_B):
                cc = b_c + load * B_STEP
                c = c0 + cc
                value = zero
                if c < Cg and k0 + b_k < K:
                    value = w3[g * Fg + fb, c, tapb]
                b_tile[b_k, cc] = value
            fb, tapb = advance2(fb, tapb, TILE_K, T)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        n, s = split2(m0 + tx, S)  # this thread's rows m0 + tx + 16 ii, advanced by 16
        for ii in range(MICRO):
            if m0 + tx + ii * THREADS < M:
                for jj in range(MICRO):
                    c = c0 + ty + jj * THREADS
                    if c < Cg:
                        dx[n, g * Cg + c, s] = acc[ii, jj]
            n, s = advance2(n, s, THREADS, S)

    return kernel


@functools.cache
def backward_data_register_tiled(dtype):
    """Version 3, compiled for ``dtype``: version 2's GEMM (``dX[m, c] = sum_k dY[m, k] W[k, c]``) in the
    forward's version 3 tiles (``loop_v3.gemm_loop``: 128 x 128 blocks, 8 x 8 register micro-tiles,
    double-buffered 8-deep stages, 32-bit indices).

    A row ``m = (n, s)`` is an input position ``(d, h, w)``; its window in ``dy`` is ``(qd, qh, qw)`` with
    ``d + pd = qd*sd + rd`` (and so on), divided once per row by threads ``t < 128``, and its remainders
    ``(rd, rh, rw)`` are folded into the depth coordinate (:func:`tiles_v3.backward_data_table`): a tap that
    does not land on an output position fails the bounds test, so the gather has no other test.  B is the
    weights transposed to ``(C/groups, F/groups * taps)`` per group and zero-padded (one copy per call)."""

    @v3.tiled_jit
    def kernel(dy, w, table, dx, N, F, Do, Ho, Wo, S, H, W, sd, sh, sw, pd, ph, pw, Cg, Fg, C, Cp, Kp):
        # dy: (N*F*Do*Ho*Wo,) flat; w: (groups*Cp*Kp,), per group the weights as (c, k = (f, tap)), padded with
        # zeros to Cp columns (whole tiles) and Kp depths (whole pairs of stages plus a spare one); table: (Kp, 4)
        # int32 (v3.backward_data_table); dx: (N*C*S,) flat, S = D*H*W
        M = int32(N * S)
        g = cuda.blockIdx.z
        m0 = cuda.blockIdx.x * v3.BLOCK
        c0 = cuda.blockIdx.y * v3.BLOCK
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        t = uint32(ty * THREADS + tx)
        zero = dtype(0)

        a_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, m), flat (2, 8, 132)
        b_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, c), flat (2, 8, 132)
        windows = cuda.shared.array(WINDOWS, int32, alignment=ALIGN)  # (128, 4): per A row, its window in dy
        acc = cuda.local.array((MICRO3, MICRO3), dtype)
        a_reg = cuda.local.array(MICRO3, dtype)
        b_reg = cuda.local.array(MICRO3, dtype)
        a_next = cuda.local.array(LOADS, dtype)  # the next stage's loads, held in registers
        b_next = cuda.local.array(LOADS, dtype)
        v3.zero_fill(acc)

        if t < v3.BLOCK:  # row t's window: its corner in dy, flat and (qd + v3.REMAINDER * remainders, qh, qw)
            m = m0 + int64(t)
            n, s = split2(min(m, M - 1), S)
            d, h, x_w = split3(s, H, W)
            qd, rd = split2(d + pd, sd)
            qh, rh = split2(h + ph, sh)
            qw, rw = split2(x_w + pw, sw)
            windows[t, 1] = int32(qd + v3.REMAINDER * ((rd * sh + rh) * sw + rw)) if m < M else int32(-v3.FAR)
            windows[t, 2] = int32(qh)
            windows[t, 3] = int32(qw)
            windows[t, 0] = int32((((n * F + g * Fg) * Do + qd) * Ho + qh) * Wo + qw)
        cuda.syncthreads()  # windows
        gemm_loop(dy, w, table, windows, a_tile, b_tile, acc, a_reg, b_reg, a_next, b_next, 0, Kp - v3.TILE_K,
                  uint32(Do), uint32(Ho), uint32(Wo), uint32((g * Cp + c0) * Kp), Kp, zero)

        ra = tx * v3.RUN
        rb = ty * v3.RUN
        v3.store_rows(dx, acc, 0, m0 + ra, M, S, C, g * Cg, c0 + rb, Cg)
        v3.store_rows(dx, acc, v3.RUN, m0 + ra + v3.HALF, M, S, C, g * Cg, c0 + rb, Cg)

    return kernel


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, version=3):
    """``dx (N, C, H, W) = x_shape`` from ``dy (N, F, Ho, Wo)`` and ``w (F, C/g, Kh, Kw)``, on device arrays.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_backward_data``.
    """
    checks.array(dy, "dy", 4)
    checks.array(w, "w", 4)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape4(x_shape, "x_shape")
    geometry = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x_shape, w.shape, geometry[-1])
    check_version(version)
    return _backward_data(dy, w, x_shape, geometry, 2, version)


def conv3d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, version=3):
    """``dx (N, C, D, H, W) = x_shape`` from ``dy (N, F, Do, Ho, Wo)`` and ``w (F, C/g, Kd, Kh, Kw)``, on
    device arrays.  Same arguments, semantics and errors as ``refconv.reference.conv3d_backward_data``."""
    checks.array(dy, "dy", 5)
    checks.array(w, "w", 5)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape5(x_shape, "x_shape")
    geometry = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups, dims=3)
    checks.dy_shape(dy, x_shape, w.shape, geometry[-1])
    check_version(version)
    return _backward_data(dy, w, x_shape, geometry, 3, version)


def _backward_data(dy, w, x_shape, geometry, dims, version):
    """Both versions on the volume views of ``dy``, ``w`` and ``dx``; returns ``dx`` of ``x_shape``."""
    stride, padding, dilation, groups, _ = geometry
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = (geometry3(v, dims, f) for v, f in ((stride, 1), (padding, 0),
                                                                                    (dilation, 1)))
    N, C = x_shape[:2]
    D, H, W = geometry3(x_shape[2:], dims, 1)
    F = w.shape[0]
    dy5, w5 = as_volume(contiguous(dy)), as_volume(contiguous(w))
    dx = xp().empty(x_shape, dtype=dy.dtype)
    check_groups(groups)
    if version == 3 and dy.dtype == "float32":
        Cg, Kd, Kh, Kw = w5.shape[1:]
        Do, Ho, Wo = dy5.shape[2:]
        v3.check_int32(dy=dy5, dx=dx)
        v3.check_remainders((sd, sh, sw), (Do, Ho, Wo))
        Fg, T = F // groups, Kd * Kh * Kw
        blocks, threads = v3.gemm_grid(N * D * H * W, Cg, groups)
        table = v3.backward_data_table(Fg, (Do, Ho, Wo), (Kd, Kh, Kw), (dd, dh, dw), (sd, sh, sw))
        Cp, Kp = blocks[1] * v3.BLOCK, table.shape[0]
        w_t = w5.reshape(groups, Fg, Cg, T).transpose(0, 2, 1, 3)  # per group (c, f, tap)
        w_padded = v3.padded_operand(w_t, groups, Cg, Fg * T, Cp, Kp)
        v3.check_int32(w=w_padded)
        backward_data_register_tiled(dy.dtype.type)[blocks, threads, stream()](
            dy5.reshape(-1), w_padded.reshape(-1), table, dx.reshape(-1), N, F, Do, Ho, Wo, D * H * W, H, W,
            sd, sh, sw, pd, ph, pw, Cg, Fg, C, Cp, Kp)
    elif version == 1:
        blocks, threads = grid_1d(dx.size)
        backward_data_direct[blocks, threads, stream()](dy5, w5, as_volume(dx), sd, sh, sw, pd, ph, pw,
                                                        dd, dh, dw, F // groups)
    else:  # version 2 (and 3 in float64: see register_tiled_dtype)
        Cg, Kd, Kh, Kw = w5.shape[1:]
        blocks, threads = gemm_grid(N * D * H * W, C // groups, groups)
        taps = tap_table((Kd, Kh, Kw), (dd, dh, dw), (sd, sh, sw))
        backward_data_tiled(dy.dtype.type)[blocks, threads, stream()](
            dy5, w5.reshape(F, Cg, Kd * Kh * Kw), taps, dx.reshape(N, C, D * H * W), H, W, sd, sh, sw, pd, ph, pw,
            F // groups)
    return dx
