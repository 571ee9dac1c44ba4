"""The pieces of the register-tiled, double-buffered (version 3) convolution kernels: tile constants,
``tiled_jit``, the grid and the 32-bit checks, the gather tables, and the device steps around the main loop.

The main loop, ``gemm_loop``, is ``loop_v3.py``; the half-stage multiply it calls, ``multiply_half``, is
generated source checked in as ``multiply_v3.py`` (written by ``generate.py``).  Version 2's pieces:
``tiles_v2.py``; the launch geometry and index helpers both share: ``geometry.py``.
"""

import math

import numpy
from numba import config, cuda

from . import geometry
from .geometry import THREADS, ceil_div, kernel_jit, split2, xp
from .scalars import uint32

# Version 3 computes a BLOCK x BLOCK tile of C per block of THREADS x THREADS threads; each thread owns
# a MICRO x MICRO register micro-tile: rows ra + {0..3} and ra + HALF + {0..3} with ra = 4 tx, columns
# rb + {0..3} and rb + HALF + {0..3} with rb = 4 ty.  Each run of four is contiguous in shared memory, so a
# thread reads its 8 values of A (and of B) for one kk as two 16-byte loads, and the 16 threads of a
# half-warp read 16 neighbouring 16-byte runs (no bank conflict).  The stage is TILE_K deep, and there are
# two of them in shared memory: while the threads multiply one, their registers hold the next one's
# global loads, which they store into the other (one barrier per stage).
MICRO = 8
RUN = 4  # a micro-tile's rows (and columns) come in two contiguous runs of four
BLOCK = THREADS * MICRO  # 128 rows and 128 columns of C per block
HALF = BLOCK // 2  # the second run of a thread's rows starts 64 rows after the first
TILE_K = 8
# Four padding columns: a B tile written down its columns (neighbouring threads, neighbouring kk) then
# spreads a warp over all 32 banks, and every row still starts on a 16-byte boundary.
PAD = 4
# Shared tiles start on a 16-byte boundary, so that LLVM can merge four neighbouring loads into one 16-byte
# load; the simulator takes no alignment (and needs none).
ALIGN = None if config.ENABLE_CUDASIM else 16
ROW = BLOCK + PAD  # 132: the elements of one kk's row in a stage
STAGE = TILE_K * ROW  # one stage of one tile, flat: element (kk, r) at kk * ROW + r
TILES = 2 * STAGE  # the shared array of one operand: two stages (buffers), flat
LOADS = TILE_K * BLOCK // (THREADS * THREADS)  # 4 elements of A and 4 of B per thread and stage
WINDOWS = (BLOCK, 4)  # per row of a block's A tile: its window's corner, flat and (d, h, w), in shared memory
A_STEP = THREADS * THREADS // TILE_K  # 32: a thread's four A loads of a stage are rows t % 32 + 32 l
INT32_MAX = 2 ** 31 - 1


def tiled_jit(kernel):
    """``cuda.jit`` for a version 3 kernel: blocks of ``THREADS**2`` threads, at least 2 resident per SM.

    The second bound caps the registers at 65536 / (2 * 256) = 128 per thread (issue 34's ceiling): without it
    ptxas gave the forward kernel 141, one block per SM."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(kernel)
    return kernel_jit(kernel, launch_bounds=(THREADS * THREADS, 2))


def gemm_grid(M, N, depth=1):
    """``(blocks, threads)`` of version 3: :func:`geometry.gemm_grid` with ``BLOCK x BLOCK`` tiles."""
    return geometry.gemm_grid(M, N, depth, BLOCK)


def check_int32(**arrays):
    """Version 3 indexes with 32-bit integers: every array (or size) must have fewer than 2**31 elements.

    Raises ``ValueError`` naming the first that does not, and what to use instead."""
    for name, a in arrays.items():
        size = a if isinstance(a, int) else a.size
        if size > INT32_MAX:
            raise ValueError(f"{name}: {size} elements, more than version 3's 32-bit indices reach "
                             f"({INT32_MAX}); use version=2 (64-bit indices) or a smaller batch")


@cuda.jit(device=True)
def zero_fill(acc):
    """``acc[:, :] = 0``: the ``MICRO x MICRO`` micro-tile of version 3."""
    for ii in range(MICRO):
        for jj in range(MICRO):
            acc[ii, jj] = 0


@cuda.jit(device=True)
def store_stage(tile, buf, regs, at, step):
    """A stage's loads, from registers into shared buffer ``buf``: ``regs[l]`` (``l < 4``) at flat ``at + l * step``
    of the stage: ``at = kk * ROW + col`` and ``step = 32`` for a thread loading columns ``col + 32 l`` of row
    ``kk`` (a warp writes 32 neighbouring elements of one row), or ``step = ROW`` for rows ``kk + l`` of column
    ``col``."""
    for l in range(LOADS):
        tile[buf * STAGE + at + l * step] = regs[l]


@cuda.jit(device=True)
def micro_row(r):
    """Offset of a thread's micro-tile row (or column) ``r`` (0..7) from its first: ``0..3, 64..67``."""
    return r % RUN + (r // RUN) * HALF


@cuda.jit(device=True)
def gather_loads(x, table, windows, a_next, k, kk_a, a_col, D, H, W, zero):
    """A stage's A loads into registers: ``a_next[l] = A[m_l, k + kk_a]`` for this thread's four rows
    ``m_l = a_col + 32 l`` of the block, gathered from ``x`` (flat) as the sum of two halves: the row's, from
    ``windows[m_l] = (flat, d, h, w)`` (the corner of its window), and the depth's, from ``table[k] = (flat, d,
    h, w)`` (an offset within the window).  The element is ``x[flat + flat']``, or zero unless
    ``0 <= d + d' < D``, ``0 <= h + h' < H`` and ``0 <= w + w' < W``, tested as unsigned (a negative
    coordinate fails too).  One table row serves all four loads."""
    row = uint32(k + kk_a)
    offset, dd, dh, dw = table[row, 0], table[row, 1], table[row, 2], table[row, 3]
    for l in range(LOADS):
        mm = a_col + l * A_STEP
        inside = ((uint32(windows[mm, 1] + dd) < D) & (uint32(windows[mm, 2] + dh) < H)
                  & (uint32(windows[mm, 3] + dw) < W))
        a_next[l] = x[uint32(windows[mm, 0] + offset)] if inside else zero  # one test, no branch


@cuda.jit(device=True)
def padded_loads(w, b_next, w_at):
    """A stage's B loads into registers from zero-padded operands (no test): ``b_next[l] = w[w_at + l]``, four
    neighbouring elements (one address, four constant offsets)."""
    for l in range(LOADS):
        b_next[l] = w[uint32(w_at + l)]



# Table rows past the depth K read as padding: an offset this far off is outside every volume.
FAR = 2 ** 30
# Backward-data's tables fold the stride's remainders into the depth coordinate, REMAINDER apart (see
# backward_data_table); the sizes that leaves room for are checked at launch (check_remainders).
REMAINDER = 2 ** 20
_TABLES = {}


def _stage_table(key, build):
    """The int32 device array of ``build()``'s rows ``(K, 4)``, padded to whole pairs of stages plus a spare
    stage with rows ``(0, FAR, FAR, FAR)`` (every load through them reads zero, with no test of ``k < K``):
    ``(Kp + TILE_K, 4)``.  Built once per key and array module, on the host and copied once (like
    :func:`tap_table`)."""
    key = (xp().__name__,) + key
    if key not in _TABLES:
        rows = numpy.asarray(build(), dtype=numpy.int64).reshape(-1, 4)
        table = numpy.full((ceil_div(len(rows), 2 * TILE_K) * 2 * TILE_K + TILE_K, 4), FAR, dtype=numpy.int64)
        table[:, 0] = 0
        table[:len(rows)] = rows
        _TABLES[key] = xp().asarray(table.astype(numpy.int32))
    return _TABLES[key]


def _taps(kernel, dilation):
    """``(T, 3)``: each tap's offsets ``(a*dd, i*dh, j*dw)``, taps in C order."""
    grids = numpy.meshgrid(*(numpy.arange(k) * d for k, d in zip(kernel, dilation)), indexing="ij")
    return numpy.stack([g.reshape(-1) for g in grids], axis=-1)


def offset_table(channels, spatial, kernel, dilation):
    """Forward: per depth ``k = (c, tap)``, ``(c*D*H*W + a*dd*H*W + i*dh*W + j*dw, a*dd, i*dh, j*dw)``: the flat
    offset of tap ``(a, i, j)`` of channel ``c`` from a window's corner, and its offsets along depth, height
    and width for the bounds test (:func:`gather_loads`).  ``spatial = (D, H, W)`` of the input."""
    D, H, W = spatial

    def build():
        taps = _taps(kernel, dilation)
        flat = (taps[:, 0] * H + taps[:, 1]) * W + taps[:, 2]
        c = numpy.arange(channels)[:, None]
        return numpy.stack([c * D * H * W + flat, *(numpy.broadcast_to(taps[:, a], (channels, len(taps)))
                                                     for a in range(3))], axis=-1)

    return _stage_table(("forward", channels, tuple(spatial), tuple(kernel), tuple(dilation)), build)


def backward_data_table(filters, out_spatial, kernel, dilation, stride):
    """Backward-data: per depth ``k = (f, tap)``, the gather from ``dy`` of an input position whose window
    coordinates are ``d + pd = qd*sd + rd`` (per axis; :func:`gather_loads`'s ``windows``): tap ``a`` reads
    output ``od = qd - qa`` when ``rd == ra``, with ``a*dd = qa*sd + ra``.  Row ``k`` is ``(f*So - qa*Ho*Wo -
    qi*Wo - qj, -qa - REMAINDER*r, -qi, -qj)``, ``So = Do*Ho*Wo`` and ``r = (ra*sh + ri)*sw + rj``; the window
    adds ``REMAINDER * (rd*sh + rh)*sw + rw`` to ``qd``, so that a tap whose remainders differ lands at least
    ``REMAINDER`` off and fails the depth test: no separate test of the remainders."""
    Do, Ho, Wo = out_spatial
    sd, sh, sw = stride

    def build():
        taps = _taps(kernel, dilation)
        q, r = taps // numpy.array(stride), taps % numpy.array(stride)
        code = (r[:, 0] * sh + r[:, 1]) * sw + r[:, 2]
        f = numpy.arange(filters)[:, None]
        rows = [f * Do * Ho * Wo - ((q[:, 0] * Ho + q[:, 1]) * Wo + q[:, 2]), -q[:, 0] - REMAINDER * code, -q[:, 1],
                -q[:, 2]]
        return numpy.stack([numpy.broadcast_to(v, (filters, len(taps))) for v in rows], axis=-1)

    return _stage_table(("backward-data", filters, tuple(out_spatial), tuple(kernel), tuple(dilation),
                         tuple(stride)), build)


def position_table(N, C, spatial, out_spatial, stride, padding):
    """Backward-filter: per depth ``p = (n, od, oh, ow)``, ``(n*C*D*H*W + d0*H*W + h0*W + w0, d0, h0, w0)`` with
    ``d0 = od*sd - pd`` (and so on): the flat offset of output position ``p``'s window corner in ``x``, and the
    corner's coordinates, to which a row's tap offsets are added (:func:`gather_loads`)."""
    D, H, W = spatial

    def build():
        n, od, oh, ow = numpy.meshgrid(*(numpy.arange(v) for v in (N, *out_spatial)), indexing="ij")
        d0, h0, w0 = (o * s - p for o, s, p in zip((od, oh, ow), stride, padding))
        return numpy.stack([(((n * C) * D + d0) * H + h0) * W + w0, d0, h0, w0], axis=-1)

    return _stage_table(("positions", N, C, tuple(spatial), tuple(out_spatial), tuple(stride), tuple(padding)), build)


def check_remainders(stride, out_spatial):
    """Backward-data's version 3 folds the stride remainders into the depth test (:func:`backward_data_table`):
    it needs ``sd*sh*sw <= 1024`` and output sizes below ``REMAINDER / 2``."""
    if math.prod(stride) > 1024:
        raise ValueError(f"stride: {tuple(stride)} has more than 1024 remainders, past version 3's backward-data "
                         "table; use version=2")
    if max(out_spatial) >= REMAINDER // 2:
        raise ValueError(f"dy: spatial size {tuple(out_spatial)} of {REMAINDER // 2} or more, past version 3's "
                         "backward-data table; use version=2")


def padded_operand(a, groups, rows, depth, rows_padded, depth_padded):
    """``a`` viewed as ``(groups, rows, depth)``, copied into zeros ``(groups, rows_padded, depth_padded)``: version
    3's B operand, whole tiles and stages (plus the spare one), so that its loads need no test."""
    out = xp().zeros((groups, rows_padded, depth_padded), dtype=a.dtype)
    out[:, :rows, :depth] = a.reshape(groups, rows, depth)
    return out


@cuda.jit(device=True)
def store_rows(y, acc, first, m, M, S, F, f_group, f, Fg):
    """``y[n, f_group + f + micro_row(jj), s] = acc[first + r, jj]`` for rows ``m + r = (n, s)``, ``r < 4``,
    below ``M``, and columns below ``Fg``: one run of a thread's micro-tile rows, split once and carried.
    ``y``: ``(N*F*S,)`` flat, the output of the forward (``F`` filters) or backward-data (``F`` = channels)
    kernel; ``f_group``: the group's first column."""
    n, s = split2(m, S)
    at = uint32((n * F + f_group + f) * S + s)  # y's flat index of row m, column f
    for r in range(RUN):
        if m + r < M:
            for jj in range(MICRO):
                if f + micro_row(jj) < Fg:
                    y[uint32(at + micro_row(jj) * S)] = acc[first + r, jj]
        at = uint32(at + 1)
        s += 1
        if s == S:  # the next row is the next sample's first position
            s = 0
            at = uint32(at + (F - 1) * S)
