"""Convolution backward-filter: ``dw (F, C/groups, Kh, Kw)`` from ``x (N, C, H, W)`` and ``dy (N, F, Ho, Wo)``.

Versions (same arguments; select with ``version=``; they agree to rounding: version 1
accumulates in float64, version 2 in the input dtype, as cuDNN does):

1. direct: one thread per ``dw`` element, a loop over all ``N*Ho*Wo`` output pixels.
2. tiled implicit GEMM: ``dW[f, q] = sum_p dY[f, p] X[p, q]`` with ``q = (c, i, j)``,
   ``p = (n, oh, ow)``; the same 64 x 64 tiles, 16-deep shared-memory stages and
   4 x 4 register micro-tiles as the forward kernel.  The reduction ``K = N*Ho*Wo``
   is long and the output small, so the reduction is split across ``splits``
   blocks (split-K).  Each split writes its partial tile into its own slice of a
   workspace ``(splits, F, C/groups*Kh*Kw)``; :func:`sum_splits_kernel` then adds the
   slices in the fixed order ``0, 1, ..., splits-1``.  No atomics: the result is
   bit-identical from run to run for the same launch geometry.

Checked against ``refconv.reference.conv2d_backward_filter`` by
``tests/test_kernels.py``.  Benchmark: ``python -m refconv.bench kernels``.
"""

import functools

from numba import cuda

from ._launch import (
    kernel_jit,
    multiply_stage, stream, tiled_jit, store_flat_tile, zero_fill,
    A_STAGE, B_STAGE, LOADS_A, LOADS_B, MAX_GRID_YZ, MICRO, TARGET_BLOCKS, THREADS, TILE_K, TILE_M, TILE_N,
    advance3, ceil_div, check_groups, contiguous, gemm_grid, grid_1d, input_pixel, split3, split4, xp,
)
from .conv_forward import check_version
from refconv import checks

# Split-K: aim for about TARGET_BLOCKS blocks in flight (_launch.py), but give every
# split at least MIN_TILES_PER_SPLIT stages of work.
MIN_TILES_PER_SPLIT = 8


@kernel_jit
def backward_filter_direct(x, dy, dw, sh, sw, ph, pw, dil_h, dil_w, groups):
    """Version 1.  Thread ``t`` computes ``dw.flat[t]``; no shared memory; float64 accumulator."""
    index = cuda.grid(1)
    if index >= dw.size:
        return
    N, C, H, W = x.shape
    Ho, Wo = dy.shape[2], dy.shape[3]
    F, Cg, Kh, Kw = dw.shape
    f, c, i, j = split4(index, Cg, Kh, Kw)
    c_x = (f // (F // groups)) * Cg + c  # the input channel this weight reads
    acc = 0.0
    for n in range(N):
        for oh in range(Ho):
            ih = input_pixel(oh, i, sh, ph, dil_h)
            if ih < 0 or ih >= H:
                continue
            for ow in range(Wo):
                iw = input_pixel(ow, j, sw, pw, dil_w)
                if 0 <= iw < W:
                    acc += dy[n, f, oh, ow] * x[n, c_x, ih, iw]
    dw[f, c, i, j] = acc


@functools.cache
def backward_filter_tiled(dtype):
    """Version 2, compiled for ``dtype``.

    GEMM per group ``g``: ``M = F/groups`` rows ``f``, ``N_gemm = C/groups*Kh*Kw``
    columns ``q = (c, i, j)``, depth ``K = N*Ho*Wo`` with ``p = (n, oh, ow)``.
    ``blockIdx.z = g * splits + s``: block slice ``s`` covers depth
    ``[s * k_split, (s + 1) * k_split)``.  Shared memory per stage:
    ``a_tile[kk, ff] = dy[n, f, oh, ow]`` (neighbouring threads read neighbouring
    ``p``) and ``b_tile[kk, qq] = x[n, c, oh*s - p + i*d, ow*s - p + j*d]`` (zero
    in the padding).  Both loaders give neighbouring threads neighbouring ``p``
    (coalesced reads of ``dy`` and ``x``); each thread's ``p`` is decomposed once
    per stage and serves all eight of its loads, and its ``q`` columns once in all.  Thread ``(tx, ty)`` accumulates rows ``tx + 16 ii`` and
    columns ``ty + 16 jj``, and stores them into ``partial[s, g*Fg + f, q]``: every
    element of the workspace has exactly one writer.
    """

    @tiled_jit
    def kernel(x, dy, partial, Kh, Kw, sh, sw, ph, pw, dil_h, dil_w, groups, k_split):
        # x: (N, C, H, W); dy: (N, F, Ho, Wo); partial: (splits, F, Cg*Kh*Kw)
        N, C, H, W = x.shape
        Ho, Wo = dy.shape[2], dy.shape[3]
        splits, F, Q = partial.shape
        Fg, Cg = F // groups, C // groups
        K = N * Ho * Wo
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

        # Both tiles are loaded along p: thread t takes depth row kk = t % 16 of each stage,
        # so neighbouring threads read neighbouring output pixels of dy and, through the
        # stride, neighbouring input pixels of x (coalesced), and one p serves all 8 loads.
        kk = t % TILE_K
        col = t // TILE_K  # 0..15
        # In the x tile the thread takes the LOADS_B consecutive columns q_first, q_first + 1, ...
        # the same in every stage: decompose the first once and step to the next by carrying.
        q_first = q0 + col * LOADS_B
        c_first, i_first, j_first = split3(q_first, Kh, Kw)

        for tile in range((k_end - k_begin + TILE_K - 1) // TILE_K):
            # This thread's row p = (n, oh, ow), split once per stage (two divides).  Advancing it
            # by carrying instead, as the loaders of x's taps do, cost 24 more registers.
            p = k_begin + tile * TILE_K + kk
            live = p < k_end
            n, oh, ow = split3(p, Ho, Wo)
            for load in range(LOADS_A):
                ff = col + load * (THREADS * THREADS // TILE_K)  # the dy tile: columns col, col + 16, ...
                f = f0 + ff
                value = zero
                if live and f < Fg:
                    value = dy[n, g * Fg + f, oh, ow]
                a_tile[kk, ff] = value
            c, i, j = c_first, i_first, j_first
            for load in range(LOADS_B):
                value = zero
                if live and q_first + load < Q:
                    ih = input_pixel(oh, i, sh, ph, dil_h)
                    iw = input_pixel(ow, j, sw, pw, dil_w)
                    if 0 <= ih < H and 0 <= iw < W:
                        value = x[n, g * Cg + c, ih, iw]
                b_tile[kk, q_first - q0 + load] = value
                c, i, j = advance3(c, i, j, 1, Kh, Kw)
            cuda.syncthreads()

            multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty)
            cuda.syncthreads()

        store_flat_tile(partial[s], acc, g * Fg, Fg, f0, q0, Q, tx, ty)  # partial[s]: (F, Q), flat in q = (c, i, j)

    return kernel


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


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, version=2, splits=None):
    """``dw (F, C/g, Kh, Kw) = w_shape`` from ``x (N, C, H, W)`` and ``dy (N, F, Ho, Wo)``, on device arrays.

    Same arguments, semantics and errors as ``refconv.reference.conv2d_backward_filter``.
    ``splits`` (version 2 only) fixes the split-K factor; by default it is chosen
    from the problem size (:func:`choose_splits`).
    """
    checked = _checked(x, dy, w_shape, stride, padding, dilation, groups)
    check_version(version)
    if version == 2:
        return sum_splits(_partials(*checked, splits)).reshape(checked[2])
    x, dy, w_shape, (sh, sw, ph, pw, dil_h, dil_w, groups), _ = checked
    dw = xp().empty(w_shape, dtype=x.dtype)
    blocks, threads = grid_1d(dw.size)
    backward_filter_direct[blocks, threads, stream()](x, dy, dw, sh, sw, ph, pw, dil_h, dil_w, groups)
    return dw


def backward_filter_partials(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, splits=None):
    """Version 2's first step: the split-K workspace ``partial (splits, F, C/g*Kh*Kw)``.

    ``partial[s]`` is the filter gradient summed over the depth slice
    ``[s * k_split, (s + 1) * k_split)`` of the pixels ``p = (n, oh, ow)``;
    :func:`sum_splits` adds the slices.  Same arguments as :func:`conv2d_backward_filter`.
    """
    return _partials(*_checked(x, dy, w_shape, stride, padding, dilation, groups), splits)


def _partials(x, dy, w_shape, geometry, K, splits):
    sh, sw, ph, pw, dil_h, dil_w, groups = geometry
    F, Cg, Kh, Kw = w_shape
    (bx, by, _), threads = gemm_grid(F // groups, Cg * Kh * Kw)
    splits, k_split = split_k(bx * by, K, groups, splits)
    partial = xp().empty((splits, F, Cg * Kh * Kw), dtype=x.dtype)  # every element is written once
    backward_filter_tiled(x.dtype.type)[(bx, by, groups * splits), threads, stream()](
        x, dy, partial, Kh, Kw, sh, sw, ph, pw, dil_h, dil_w, groups, k_split)
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


def _checked(x, dy, w_shape, stride, padding, dilation, groups):
    """The reference's argument checks; returns contiguous ``x, dy``, ``w_shape``, the geometry and ``K = N*Ho*Wo``."""
    checks.array(x, "x", 4)
    checks.array(dy, "dy", 4)
    checks.same_dtype(x=x, dy=dy)
    w_shape = checks.shape4(w_shape, "w_shape")
    (sh, sw), (ph, pw), (dil_h, dil_w), groups, out_hw = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x.shape, w_shape, out_hw)
    K = x.shape[0] * out_hw[0] * out_hw[1]
    return contiguous(x), contiguous(dy), w_shape, (sh, sw, ph, pw, dil_h, dil_w, groups), K
