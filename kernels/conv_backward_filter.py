"""Convolution backward-filter, images and volumes: ``dw (F, C/groups, [Kd,] Kh, Kw)`` from
``x (N, C, [D,] H, W)`` and ``dy (N, F, [Do,] Ho, Wo)``.  One kernel per version serves both (an image is a
volume of depth 1).

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dw`` element, a loop over all ``N*Do*Ho*Wo`` output positions.
2. tiled implicit GEMM: ``dW[f, q] = sum_p dY[f, p] X[p, q]`` with ``q = (c, tap)``,
   ``p = (n, s)``, ``s`` the flat output position; the same 64 x 64 tiles, 16-deep shared-memory
   stages and 4 x 4 register micro-tiles as the forward kernel.  The reduction ``K = N*Do*Ho*Wo``
   is long and the output small, so the reduction is split across ``splits``
   blocks (split-K).  Each split writes its partial tile into its own slice of a
   workspace ``(splits, F, C/groups*Kd*Kh*Kw)``; :func:`sum_splits_kernel` then adds the
   slices in the fixed order ``0, 1, ..., splits-1``.  No atomics: the result is
   bit-identical from run to run for the same launch geometry.
3. register-tiled (float32; float64 runs version 2): the transposed GEMM
   ``dW^T[q, f] = sum_p X[p, q] dY^T[p, f]`` in the forward's version 3 loop
   (``loop_v3.gemm_loop``), with the same split-K and ordered sum.

Checked against ``refconv.reference.conv2d_backward_filter`` and ``conv3d_backward_filter`` by
``tests/cuda_kernels/test_kernels.py`` and ``tests/cuda_kernels/test_kernels3d.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools
import math

from numba import cuda

from . import tiles_v3 as v3
from .geometry import (
    MAX_GRID_YZ, TARGET_BLOCKS, THREADS, advance2, as_volume, ceil_div, check_groups, contiguous, geometry3,
    grid_1d, input_pixel, kernel_jit, split2, split3, split5, stream, tap_table, xp,
)
from .loop_v3 import gemm_loop
from .multiply_v2 import multiply_stage
from .scalars import int32, int64, uint32
from .tiles_v2 import (
    A_STAGE, B_STAGE, LOADS_A, LOADS_B, MICRO, TILE_K, TILE_M, TILE_N, gemm_grid, store_flat_tile, tiled_jit,
    zero_fill,
)
# Version 3's array shapes, by name: Numba takes a shape only from a plain global (it reads v3.TILES
# as a run-time int), and version 2's MICRO is 4
from .tiles_v3 import ALIGN, LOADS, TILES, WINDOWS, MICRO as MICRO3
from .conv_forward import check_version
from refconv import checks

# Split-K: aim for about TARGET_BLOCKS blocks in flight (geometry.py), but give every
# split at least MIN_TILES_PER_SPLIT stages of work.
MIN_TILES_PER_SPLIT = 8


@kernel_jit
def backward_filter_direct(x, dy, dw, sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, Fg):
    """Version 1.  Thread ``t`` computes ``dw.flat[t]``; no shared memory; a float64 accumulator.

    ``x (N, C, D, H, W)``, ``dy (N, F, Do, Ho, Wo)``, ``dw (F, Cg, Kd, Kh, Kw)``; ``Fg = F / groups``."""
    index = cuda.grid(1)
    if index >= dw.size:
        return
    N, C, D, H, W = x.shape
    Do, Ho, Wo = dy.shape[2], dy.shape[3], dy.shape[4]
    F, Cg, Kd, Kh, Kw = dw.shape
    f, c, a, i, j = split5(index, Cg, Kd, Kh, Kw)
    c_x = split2(f, Fg)[0] * Cg + c  # the input channel this weight reads
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
def backward_filter_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g``: ``M = F/groups`` rows ``f``, ``N_gemm = C/groups*Kd*Kh*Kw`` columns
    ``q = (c, tap)``, depth ``K = N*Do*Ho*Wo`` with ``p = (n, s)``.  ``blockIdx.z = g * splits + sl``:
    block slice ``sl`` covers depth ``[sl * k_split, (sl + 1) * k_split)``.  Shared memory per stage:
    ``a_tile[kk, ff] = dy[n, f, s]`` and ``b_tile[kk, qq] = x[n, c, od*s - p + a*d, oh*s - p + i*d,
    ow*s - p + j*d]`` (zero in the padding).  Both loaders give neighbouring threads neighbouring
    ``p`` (coalesced reads of ``dy`` and ``x``); each thread's ``p`` is carried from stage to stage and
    its position split once per stage to serve all eight of its loads, and its ``q`` columns are
    split once in all.  Thread ``(tx, ty)`` accumulates rows ``tx + 16 ii`` and columns ``ty + 16 jj``,
    and stores them into ``partial[sl, g*Fg + f, q]``: every element of the workspace has exactly one writer.
    """

    @tiled_jit
    def kernel(x, dy, taps, partial, Ho, Wo, sd, sh, sw, pd, ph, pw, Cg, Fg, k_split):
        # x: (N, C, D, H, W); dy: (N, F, S), S = Do*Ho*Wo flat; taps: (T, 6), the offsets in columns
        # 0, 2, 4 (tap_table with stride 1); partial: (splits, F, Cg*T)
        N, _, D, H, W = x.shape
        S = dy.shape[2]
        splits, _, Q = partial.shape
        T = taps.shape[0]
        K = N * S
        g, sl = split2(cuda.blockIdx.z, splits)
        k_begin = sl * k_split
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

        # Both tiles are loaded along p: thread t takes depth row kk = t % 16 of each stage,
        # so neighbouring threads read neighbouring output positions of dy and, through the
        # stride, neighbouring input positions of x (coalesced), and one p serves all 8 loads.
        kk = t % TILE_K
        col = t // TILE_K  # 0..15
        # In the x tile the thread takes the LOADS_B consecutive columns q_first, q_first + 1, ...
        # the same in every stage: split the first once and step to the next by carrying.
        q_first = q0 + col * LOADS_B
        c_first, tap_first = split2(q_first, T)
        n, s = split2(k_begin + kk, S)  # this thread's p, carried by TILE_K from stage to stage

        for tile in range((k_end - k_begin + TILE_K - 1) // TILE_K):
            live = k_begin + tile * TILE_K + kk < k_end
            od, oh, ow = split3(s, Ho, Wo)  # once per stage, for the eight loads
            for load in range(LOADS_A):
                ff = col + load * (THREADS * THREADS // TILE_K)  # the dy tile: columns col, col + 16, ...
                f = f0 + ff
                value = zero
                if live and f < Fg:
                    value = dy[n, g * Fg + f, s]
                a_tile[kk, ff] = value
            c, tap = c_first, tap_first
            for load in range(LOADS_B):
                value = zero
                if live and q_first + load < Q:
                    id_ = input_pixel(od, 0, sd, pd, 0) + taps[tap, 0]
                    ih = input_pixel(oh, 0, sh, ph, 0) + taps[tap, 2]
                    iw = input_pixel(ow, 0, sw, pw, 0) + taps[tap, 4]
                    if 0 <= id_ < D and 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, id_, ih, iw]
                b_tile[kk, q_first - q0 + load] = value
                c, tap = advance2(c, tap, 1, T)
            n, s = advance2(n, s, TILE_K, S)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        store_flat_tile(partial[sl], acc, g * Fg, Fg, f0, q0, Q, tx, ty)  # partial[sl]: (F, Q), flat in q = (c, tap)

    return kernel


@functools.cache
def backward_filter_register_tiled(dtype):
    """Version 3, compiled for ``dtype``: the transposed GEMM ``dW^T[q, f] = sum_p X[p, q] dY^T[p, f]`` in the
    forward's version 3 tiles (``loop_v3.gemm_loop``: 128 x 128 blocks, 8 x 8 register micro-tiles,
    double-buffered 8-deep stages, 32-bit indices), split-K over ``p`` as in version 2.

    A row ``q = (c, tap)`` (``Q = C/groups * taps``) is gathered from ``x``: its window (threads ``t < 128``,
    once) holds the tap's offsets, and the depth ``p = (n, od, oh, ow)`` comes from
    :func:`tiles_v3.position_table` (the output position's window corner), so the gather is the forward's.
    B is ``dy`` transposed to ``(F/groups, N*Do*Ho*Wo)`` per group and zero-padded (one copy of ``dy`` per
    call).  ``blockIdx.z = g * splits + sl``: slice ``sl`` covers ``p`` in ``[sl * k_split, (sl + 1) *
    k_split)`` and writes ``partial[sl, g*Fg + f, q]``: one writer per element, summed in order afterwards."""

    @v3.tiled_jit
    def kernel(x, dy, table, taps, partial, C, D, H, W, Cg, Fg, F, Fp, Kp, k_split, splits):
        # x: (N*C*D*H*W,) flat; dy: (groups*Fp*Kp,), per group dy as (f, p), padded with zeros to Fp columns (whole
        # tiles) and Kp depths (whole pairs of stages plus a spare one); table: (Kp, 4) int32 (v3.position_table);
        # taps: (T, 6) int32 (tap_table, stride 1: offsets in columns 0, 2, 4); partial: (splits*F*Q,) flat
        T = taps.shape[0]
        Q = int32(Cg * T)
        g, sl = split2(cuda.blockIdx.z, splits)
        k_begin = sl * k_split
        k_end = min(Kp - v3.TILE_K, k_begin + k_split)
        q0 = cuda.blockIdx.x * v3.BLOCK
        f0 = cuda.blockIdx.y * v3.BLOCK
        tx = uint32(cuda.threadIdx.x)
        ty = uint32(cuda.threadIdx.y)
        t = uint32(ty * THREADS + tx)
        zero = dtype(0)

        a_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, q), flat (2, 8, 132)
        b_tile = cuda.shared.array(TILES, dtype, alignment=ALIGN)  # two stages of (kk, f), flat (2, 8, 132)
        windows = cuda.shared.array(WINDOWS, int32, alignment=ALIGN)  # (128, 4): per A row, its tap's offsets
        acc = cuda.local.array((MICRO3, MICRO3), dtype)
        a_reg = cuda.local.array(MICRO3, dtype)
        b_reg = cuda.local.array(MICRO3, dtype)
        a_next = cuda.local.array(LOADS, dtype)  # the next stage's loads, held in registers
        b_next = cuda.local.array(LOADS, dtype)
        v3.zero_fill(acc)

        if t < v3.BLOCK:  # row t: channel c's tap, its offset from a window's corner, flat and per axis
            q = q0 + int64(t)
            c, tap = split2(min(q, Q - 1), T)
            windows[t, 1] = taps[tap, 0] if q < Q else int32(-v3.FAR)  # a row past the end reads zeros
            windows[t, 2] = taps[tap, 2]
            windows[t, 3] = taps[tap, 4]
            windows[t, 0] = int32(((g * Cg + c) * D + taps[tap, 0]) * H * W + taps[tap, 2] * W + taps[tap, 4])
        cuda.syncthreads()  # windows
        gemm_loop(x, dy, table, windows, a_tile, b_tile, acc, a_reg, b_reg, a_next, b_next, k_begin, k_end,
                  uint32(D), uint32(H), uint32(W), uint32((g * Fp + f0) * Kp), Kp, zero)

        base = uint32((sl * F + g * Fg) * Q)  # partial[sl, g*Fg, 0]
        store_columns3(partial, acc, 0, q0 + tx * v3.RUN, Q, f0 + ty * v3.RUN, Fg, base)
        store_columns3(partial, acc, v3.RUN, q0 + tx * v3.RUN + v3.HALF, Q, f0 + ty * v3.RUN, Fg, base)

    return kernel


@cuda.jit(device=True)
def store_columns3(out, acc, first, q, Q, f, Fg, base):
    """``out[base + (f + v3.micro_row(jj)) * Q + q + r] = acc[first + r, jj]`` for rows ``q + r < Q`` (``r < 4``) and
    columns ``f + v3.micro_row(jj) < Fg``: one run of a thread's transposed micro-tile, into ``partial[sl, g*Fg:]``."""
    for jj in range(MICRO3):
        if f + v3.micro_row(jj) < Fg:
            for r in range(v3.RUN):
                if q + r < Q:
                    out[uint32(base + (f + v3.micro_row(jj)) * Q + q + r)] = acc[first + r, jj]


@kernel_jit
def sum_splits_kernel(partial, dw):
    """Thread ``t`` writes ``dw[t] = partial[0, t] + partial[1, t] + ... + partial[splits-1, t]``, in that order.

    ``partial``: ``(splits, F*Cg*Kh*Kw)``, the split-K workspace; ``dw``: ``(F*Cg*Kh*Kw,)``.
    One writer per element and a fixed order of additions: deterministic.
    """
    index = cuda.grid(1)
    if index < dw.size:
        total = partial[0, index]
        for s in range(1, partial.shape[0]):
            total += partial[s, index]
        dw[index] = total


def choose_splits(blocks, K):
    """``(splits, k_split)``: how many slices to cut the depth ``K`` into, and each slice's depth."""
    splits = max(1, min(ceil_div(TARGET_BLOCKS, blocks), ceil_div(K, TILE_K * MIN_TILES_PER_SPLIT)))
    k_split = ceil_div(ceil_div(K, splits), TILE_K) * TILE_K
    return ceil_div(K, k_split), k_split


def split_k(blocks, K, groups, splits=None):
    """``(splits, k_split)`` for a launch of ``blocks`` tiles per group: the caller's ``splits``, or
    :func:`choose_splits`'s, each slice a whole number of stages.  Grid z holds ``groups * splits``
    slices, at most ``MAX_GRID_YZ``: a caller's ``splits`` past that is refused, naming the largest that fits."""
    check_groups(groups)
    if splits is None:
        splits, k_split = choose_splits(blocks * groups, K)
        splits = min(splits, MAX_GRID_YZ // groups)
        k_split = ceil_div(ceil_div(K, splits), TILE_K) * TILE_K
        return ceil_div(K, k_split), k_split
    if not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits: expected a positive int (or None, to choose), got {splits!r}")
    if groups * splits > MAX_GRID_YZ:
        raise ValueError(f"splits: {groups} groups x {splits} splits = {groups * splits} blocks along grid z, "
                         f"above CUDA's {MAX_GRID_YZ}; pass splits <= {MAX_GRID_YZ // groups}")
    k_split = ceil_div(ceil_div(K, splits), TILE_K) * TILE_K
    return ceil_div(K, k_split), k_split


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, version=3, splits=None):
    """``dw (F, C/g, Kh, Kw) = w_shape`` from ``x (N, C, H, W)`` and ``dy (N, F, Ho, Wo)``, on device arrays.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_backward_filter``.
    ``splits`` (version 2 only) fixes the split-K factor; by default it is chosen
    from the problem size (:func:`choose_splits`).
    """
    checked = _checked(x, dy, w_shape, stride, padding, dilation, groups, 2)
    check_version(version)
    if version >= 2:
        return sum_splits(_partials(*checked, splits, version)).reshape(checked[2])
    return _direct(*checked)


def conv3d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, version=3, splits=None):
    """``dw (F, C/g, Kd, Kh, Kw) = w_shape`` from ``x (N, C, D, H, W)`` and ``dy (N, F, Do, Ho, Wo)``, on
    device arrays.  Same arguments, semantics and errors as ``refconv.reference.conv3d_backward_filter``;
    ``splits`` (version 2 only) fixes the split-K factor, as in :func:`conv2d_backward_filter`."""
    checked = _checked(x, dy, w_shape, stride, padding, dilation, groups, 3)
    check_version(version)
    if version >= 2:
        return sum_splits(_partials(*checked, splits, version)).reshape(checked[2])
    return _direct(*checked)


def backward_filter_partials(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, splits=None):
    """Version 2's first step: the split-K workspace ``partial (splits, F, C/g*Kh*Kw)`` (``*Kd`` for volumes).

    ``partial[s]`` is the filter gradient summed over the depth slice
    ``[s * k_split, (s + 1) * k_split)`` of the output positions ``p = (n, s)``;
    :func:`sum_splits` adds the slices.  Same arguments as :func:`conv2d_backward_filter`, for images
    or volumes (by ``x``'s number of dims).
    """
    dims = 3 if getattr(x, "ndim", 0) == 5 else 2
    return _partials(*_checked(x, dy, w_shape, stride, padding, dilation, groups, dims), splits)


def _direct(x5, dy5, w_shape, geometry, dims, K):
    sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups = geometry
    dw = xp().empty(w_shape, dtype=x5.dtype)
    blocks, threads = grid_1d(dw.size)
    backward_filter_direct[blocks, threads, stream()](x5, dy5, as_volume(dw), sd, sh, sw, pd, ph, pw,
                                                      dil_d, dil_h, dil_w, w_shape[0] // groups)
    return dw


def _partials(x5, dy5, w_shape, geometry, dims, K, splits, version=2):
    sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups = geometry
    F, Cg = w_shape[:2]
    Kd, Kh, Kw = geometry3(w_shape[2:], dims, 1)
    N, _, Do, Ho, Wo = dy5.shape
    if version == 3 and x5.dtype == "float32":  # float64: version 2 (64 accumulators would fill 128 registers)
        return _partials3(x5, dy5, F, Cg, (Kd, Kh, Kw), geometry, K, splits)
    (bx, by, _), threads = gemm_grid(F // groups, Cg * Kd * Kh * Kw)
    splits, k_split = split_k(bx * by, K, groups, splits)
    partial = xp().empty((splits, F, Cg * Kd * Kh * Kw), dtype=x5.dtype)  # every element is written once
    taps = tap_table((Kd, Kh, Kw), (dil_d, dil_h, dil_w), (1, 1, 1))
    backward_filter_tiled(x5.dtype.type)[(bx, by, groups * splits), threads, stream()](
        x5, dy5.reshape(N, F, Do * Ho * Wo), taps, partial, Ho, Wo, sd, sh, sw, pd, ph, pw, Cg, F // groups, k_split)
    return partial


def _partials3(x5, dy5, F, Cg, kernel, geometry, K, splits):
    """Version 3's split-K partials ``(splits, F, Cg*Kd*Kh*Kw)``: :func:`backward_filter_register_tiled`."""
    sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups = geometry
    N, C, D, H, W = x5.shape
    Fg, T = F // groups, math.prod(kernel)
    v3.check_int32(x=x5, dy=dy5)
    (bx, by, _), threads = v3.gemm_grid(Cg * T, Fg)
    splits, k_split = split_k(bx * by, K, groups, splits)
    k_split = ceil_div(k_split, 2 * v3.TILE_K) * 2 * v3.TILE_K  # whole pairs of stages (gemm_loop)
    splits = ceil_div(K, k_split)
    table = v3.position_table(N, C, (D, H, W), dy5.shape[2:], (sd, sh, sw), (pd, ph, pw))
    Fp, Kp = by * v3.BLOCK, table.shape[0]
    dy_t = dy5.reshape(N, groups, Fg, -1).transpose(1, 2, 0, 3)  # per group (f, n, s): p = (n, s)
    dy_padded = v3.padded_operand(dy_t, groups, Fg, K, Fp, Kp)
    partial = xp().empty((splits, F, Cg * T), dtype=x5.dtype)  # every element is written once
    v3.check_int32(dy=dy_padded, partial=partial)
    taps = tap_table(kernel, (dil_d, dil_h, dil_w), (1, 1, 1))
    backward_filter_register_tiled(x5.dtype.type)[(bx, by, groups * splits), threads, stream()](
        x5.reshape(-1), dy_padded.reshape(-1), table, taps, partial.reshape(-1), C, D, H, W, Cg, Fg, F, Fp, Kp,
        k_split, splits)
    return partial


def sum_splits(partial):
    """``partial (splits, F, Q)`` -> ``(F, Q)``: the slices added in the fixed order ``0, 1, ..., splits-1``."""
    splits, F, Q = partial.shape
    if splits == 1:
        return partial[0]
    out = xp().empty((F, Q), dtype=partial.dtype)
    blocks, threads = grid_1d(out.size)
    sum_splits_kernel[blocks, threads, stream()](partial.reshape(splits, F * Q), out.reshape(F * Q))
    return out


def _checked(x, dy, w_shape, stride, padding, dilation, groups, dims):
    """The reference's argument checks; returns the volume views of contiguous ``x, dy``, ``w_shape``, the
    geometry ``(sd, sh, sw, pd, ph, pw, dil_d, dil_h, dil_w, groups)``, ``dims`` and ``K = N*Do*Ho*Wo``."""
    checks.array(x, "x", dims + 2)
    checks.array(dy, "dy", dims + 2)
    checks.same_dtype(x=x, dy=dy)
    w_shape = (checks.shape4 if dims == 2 else checks.shape5)(w_shape, "w_shape")
    stride, padding, dilation, groups, out = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation,
                                                                  groups, dims=dims)
    checks.dy_shape(dy, x.shape, w_shape, out)
    geometry = (*geometry3(stride, dims, 1), *geometry3(padding, dims, 0), *geometry3(dilation, dims, 1), groups)
    K = x.shape[0] * math.prod(out)
    return as_volume(contiguous(x)), as_volume(contiguous(dy)), w_shape, geometry, dims, K
