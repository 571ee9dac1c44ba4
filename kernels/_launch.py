"""Launch geometry and index helpers shared by every kernel in ``refconv.kernels``.

Host side: tile constants and small functions that turn a problem size into
``(blocks, threads)`` with ceil-division; the volume view of an image and the tap table that
let one kernel per pass serve both.  Device side: the index arithmetic
(splitting a flat index into coordinates, the stride/padding/dilation map
between input and output pixels), written once and called from every kernel.

Arrays: the public functions take and return *device arrays*: CuPy arrays on a
real GPU, NumPy arrays under Numba's CUDA simulator.  ``refconv.arrays`` decides
which; nothing here imports cupy.
"""

import math

import numpy
from numba import config, cuda, uint32

from refconv import arrays

# ---------------------------------------------------------------- tile constants
# Elementwise and reduction kernels: one thread per element, 256 per block.
BLOCK_1D = 256
# Kernels that choose how finely to split a reduction (split-K, the per-channel sums)
# aim for about this many blocks in flight: a few per SM of a large GPU (an H200 has 132).
TARGET_BLOCKS = 512

# Tiled (version 2) convolution kernels: implicit GEMM C[M, N] = A[M, K] @ B[K, N].
# A block of THREADS x THREADS threads computes a TILE_M x TILE_N tile of C; each
# thread owns a MICRO x MICRO register micro-tile of it, strided by THREADS so that
# neighbouring threads touch neighbouring columns of shared memory (no bank
# conflicts) and neighbouring output pixels (coalesced stores).
THREADS = 16
MICRO = 4
TILE_M = THREADS * MICRO  # 64 rows of C per block
TILE_N = THREADS * MICRO  # 64 columns of C per block
TILE_K = 16  # depth of one shared-memory stage
# One padding column in the shared tiles: a tile written column-wise then does not
# send every store of a warp to the same bank.
PAD = 1
# The shared-memory stage shapes, as module-level constants: Numba freezes a global
# tuple of ints into literals, which ``cuda.shared.array`` needs.  Written inline as
# ``(TILE_K, TILE_M + PAD)`` the sum is typed as a run-time int64, and NVVM's front
# end (not the simulator, which runs plain Python) rejects the kernel.
A_STAGE = (TILE_K, TILE_M + PAD)
B_STAGE = (TILE_K, TILE_N + PAD)
# Tile elements each thread copies into shared memory per stage.
LOADS_A = TILE_K * TILE_M // (THREADS * THREADS)  # 4
LOADS_B = TILE_K * TILE_N // (THREADS * THREADS)  # 4


def kernel_jit(kernel, **options):
    """``cuda.jit`` with Numba's on-disk cache: a kernel is compiled once per machine, not by
    every rank at every start.  The cache sits in __pycache__ beside the source, or under
    NUMBA_CACHE_DIR or the user's cache folder when that is not writable, keyed by signature,
    GPU and closure values.  Where Numba finds no writable place at all, the kernel is
    compiled per process, as without the cache."""
    try:
        return cuda.jit(cache=True, **options)(kernel)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return cuda.jit(**options)(kernel)


def tiled_jit(kernel):
    """``cuda.jit`` for a tiled (version 2) kernel, declaring its launch bounds: blocks of ``THREADS**2`` threads.

    Told the block size (``.maxntid 256`` in the PTX), the compiler allocates far
    fewer registers: measured with ``refconv.kernels.resources`` when it was
    introduced, backward-data float64 138 -> 120, so two blocks fit on an SM
    instead of one.  The simulator's ``cuda.jit`` takes no launch bounds and needs none.
    """
    if config.ENABLE_CUDASIM:
        return cuda.jit(kernel)
    return kernel_jit(kernel, launch_bounds=THREADS * THREADS)


def tiled_jit3(kernel):
    """``cuda.jit`` for a version 3 kernel: blocks of ``THREADS**2`` threads, at least 2 resident per SM.

    The second bound caps the registers at 65536 / (2 * 256) = 128 per thread (issue 34's ceiling): without it
    ptxas gave the forward kernel 141, one block per SM."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(kernel)
    return kernel_jit(kernel, launch_bounds=(THREADS * THREADS, 2))


def ceil_div(a, b):
    return -(-a // b)


def grid_1d(n):
    """``(blocks, threads)`` for one thread per element of ``n``."""
    return max(1, ceil_div(n, BLOCK_1D)), BLOCK_1D


# CUDA's limits on a grid's y and z sizes (x allows 2**31 - 1, past any M here).
MAX_GRID_YZ = 65535


def gemm_grid(M, N, depth=1, tile=TILE_M):
    """``(blocks, threads)`` covering a ``M x N`` GEMM with ``depth`` independent slices (groups, K-splits), in
    ``tile x tile`` blocks (version 2's ``TILE_M = TILE_N``, or version 3's ``BLOCK3``).

    The callers check ``depth`` against :data:`MAX_GRID_YZ` where they choose it, naming their own argument
    (``groups``, ``splits``); here, the check that no launch passes it."""
    blocks = (max(1, ceil_div(M, tile)), max(1, ceil_div(N, tile)), depth)
    if blocks[1] > MAX_GRID_YZ or depth > MAX_GRID_YZ:
        raise ValueError(f"a {M} x {N} GEMM in {depth} slices needs grid {blocks}; CUDA allows at most "
                         f"{MAX_GRID_YZ} blocks along y and z")
    return blocks, (THREADS, THREADS)


def check_groups(groups):
    """``groups`` is grid z of the tiled kernels: at most :data:`MAX_GRID_YZ`."""
    if groups > MAX_GRID_YZ:
        raise ValueError(f"groups: at most {MAX_GRID_YZ} on the cuda backend (one grid-z slice each), got {groups}")


def xp():
    """The device array module: CuPy on a real GPU, NumPy under the simulator."""
    return arrays.device_module()


def stream():
    """The stream every launch uses: ``kernel[blocks, threads, stream()](...)``.

    CuPy's current stream on a real GPU (``refconv.arrays.kernel_stream``), so
    kernels, CuPy's own work and the wait before each MPI call share one stream.
    CuPy's null stream is CUDA's legacy default stream, which Numba names by handle 0;
    numba-cuda 0.30 hands CuPy arrays to a launch through DLPack, whose ``__dlpack__(stream=0)``
    is forbidden for CUDA, so that stream is passed by its other name, the legacy default
    stream's handle (``cuda.legacy_default_stream()``): the same stream.  The device check's
    first launch (scripts/gpu_check_jobs.py) checks both on a GPU.
    """
    return legacy_if_null(arrays.kernel_stream())


def legacy_if_null(launch_stream, legacy=None):
    """``launch_stream``, or the legacy default stream where it is Numba's handle-0 stream; ``0`` (the
    simulator's, or a test's stand-in) as it is.  ``legacy``: the legacy stream's factory (tests pass one)."""
    if isinstance(launch_stream, int) or int(launch_stream.handle) != 0:
        return launch_stream
    return (legacy or cuda.legacy_default_stream)()


def contiguous(a):
    """``a`` as a C-contiguous device array (a no-op when it already is one)."""
    return xp().ascontiguousarray(a)


# ------------------------------------------------------------ device index helpers


# The split helpers divide once per coordinate and take each remainder as
# ``index - quotient * size``: a 64-bit divide is a long instruction sequence on a
# GPU, and the compiler does not always merge a ``//`` and a ``%`` of the same operands.
@cuda.jit(device=True)
def split2(index, inner):
    """``index`` -> ``(index // inner, index % inner)``: a flat index into (outer, inner) coordinates."""
    outer = index // inner
    return outer, index - outer * inner


@cuda.jit(device=True)
def advance2(outer, inner, step, size):
    """``split2(index + step, size)`` from ``(outer, inner) = split2(index, size)``, without dividing:
    ``step // size + 1`` compare-and-subtracts, a handful for the tiled kernels' steps (1, 4, 16)."""
    inner += step
    while inner >= size:
        inner -= size
        outer += 1
    return outer, inner


@cuda.jit(device=True)
def split3(index, middle, inner):
    """``index`` -> ``(a, b, c)`` with ``index = (a * middle + b) * inner + c``."""
    rest = index // inner
    a = rest // middle
    return a, rest - a * middle, index - rest * inner


@cuda.jit(device=True)
def split4(index, d1, d2, d3):
    """``index`` -> ``(a, b, c, d)`` in a ``(*, d1, d2, d3)`` C-ordered array."""
    rest = index // d3
    a, b, c = split3(rest, d1, d2)
    return a, b, c, index - rest * d3


@cuda.jit(device=True)
def split5(index, d1, d2, d3, d4):
    """``index`` -> ``(a, b, c, d, e)`` in a ``(*, d1, d2, d3, d4)`` C-ordered array (volumes, NCDHW)."""
    rest = index // d4
    a, b, c, d = split4(rest, d1, d2, d3)
    return a, b, c, d, index - rest * d4


@cuda.jit(device=True)
def input_pixel(out, tap, stride, padding, dilation):
    """The input coordinate that output ``out`` reads through kernel tap ``tap`` (may be outside)."""
    return out * stride - padding + tap * dilation


@cuda.jit(device=True)
def output_pixel(inp, tap, stride, padding, dilation, size_out):
    """The output coordinate that reads input ``inp`` through tap ``tap``, or -1 if none does.

    Inverts :func:`input_pixel`: ``inp + padding - tap * dilation`` must be a
    non-negative multiple of ``stride`` below ``stride * size_out``.  Taps that
    fail land between output pixels (stride > 1) or off the output, and are skipped.
    """
    shifted = inp + padding - tap * dilation
    if shifted < 0:
        return -1
    if stride == 1:  # most layers: every tap lands on an output pixel, no divide needed
        return shifted if shifted < size_out else -1
    out = shifted // stride
    if shifted - out * stride != 0:
        return -1
    return out if out < size_out else -1


# --------------------------------------------------------------- one kernel for images and volumes
# Every convolution kernel works on volumes, (N, C, D, H, W); an image is a volume of depth 1
# (as_volume: a view, no copy).  Its spatial index is flat where only the position matters
# (s = (d, h, w) of D*H*W), and the taps of the filter are one flat index too, tap = (a, i, j)
# of Kd*Kh*Kw, whose offsets come from a small table (tap_table) instead of a divide per load.


def as_volume(a):
    """``a`` as the kernels take it: a volume (5 dims) as it is, an image ``(N, C, H, W)`` (or 2-D weights
    ``(F, Cg, Kh, Kw)``) as ``(N, C, 1, H, W)``: a view, no copy."""
    return a if a.ndim == 5 else a.reshape(a.shape[:2] + (1,) + a.shape[2:])


def geometry3(values, dims, fill):
    """A per-axis tuple for 3 axes: ``values`` (one per spatial dim) with ``fill`` for the depth of an image."""
    return ((fill,) + tuple(values)) if dims == 2 else tuple(values)


_TAPS = {}


def tap_table(kernel, dilation, stride):
    """``(Kd*Kh*Kw, 6)`` int32 device array: per tap ``(a, i, j)`` (flat ``(a*Kh + i)*Kw + j``), the quotient
    and remainder of its offsets ``a*dd, i*dh, j*dw`` by ``stride``: ``(qa, ra, qi, ri, qj, rj)``.

    With ``stride = (1, 1, 1)`` the quotients are the offsets themselves (the forward and backward-filter
    loaders add them to the window's corner).  Backward-data asks whether output ``od`` reads input ``d``
    through tap ``a``, ``d + pd - a*dd = od*sd``: with ``d + pd = qd*sd + rd`` (split once per thread), it
    does when ``rd == ra``, and then ``od = qd - qa``: no divide per load.  Built once per geometry and
    array module, with the array module (a NumPy index table on a GPU would be copied at every launch)."""
    key = (xp().__name__, tuple(kernel), tuple(dilation), tuple(stride))
    if key not in _TAPS:
        rows = []
        for a in range(kernel[0]):
            for i in range(kernel[1]):
                for j in range(kernel[2]):
                    row = []
                    for tap, d, s in zip((a, i, j), dilation, stride):
                        row += divmod(tap * d, s)
                    rows.append(row)
        _TAPS[key] = xp().asarray(rows, dtype="int32").reshape(len(rows), 6)
    return _TAPS[key]


# ---------------------------------------------- the pieces every tiled (version 2) kernel shares
# The 2-D and 3-D tiled kernels differ in how they gather their input tile (the index
# arithmetic of two or three spatial dims); what does not depend on the dims is here.


@cuda.jit(device=True)
def zero_fill(acc):
    """``acc[:, :] = 0``: the ``MICRO x MICRO`` register micro-tile, before the first stage."""
    for ii in range(MICRO):
        for jj in range(MICRO):
            acc[ii, jj] = 0


@cuda.jit(device=True)
def load_weight_stage(b_tile, w2, row0, rows, col0, k0, K, t):
    """One stage of the forward kernels' B tile: ``b_tile[kk, ff] = w2[row0 + col0 + ff, k0 + kk]``.

    ``w2 (F, K)``: the weights flattened per filter, ``k = (c, i, j)`` or ``(c, a, i, j)``;
    ``row0`` the group's first filter and ``rows`` its filters; zero past ``rows`` or ``K``.
    Thread ``t`` loads row ``kk = t % TILE_K`` (neighbouring threads read neighbouring ``k``
    of one filter: coalesced) in ``LOADS_B`` columns ``t // TILE_K + 16 load``.
    """
    kk = t % TILE_K
    k = k0 + kk
    for load in range(LOADS_B):
        ff = t // TILE_K + load * (THREADS * THREADS // TILE_K)
        f = col0 + ff
        if f < rows and k < K:
            b_tile[kk, ff] = w2[row0 + f, k]
        else:
            b_tile[kk, ff] = 0


def _multiply_stage_source(depth):
    """The source of :data:`multiply_stage`: this loop, with ``kk`` written out ``0, 1, ..., depth - 1``::

        for kk in range(TILE_K):
            for ii in range(MICRO):
                a_reg[ii] = a_tile[kk, tx + ii * THREADS]
            for jj in range(MICRO):
                b_reg[jj] = b_tile[kk, ty + jj * THREADS]
            for ii in range(MICRO):
                for jj in range(MICRO):
                    acc[ii, jj] += a_reg[ii] * b_reg[jj]

    Numba compiles ``range(16)`` to a counted loop that LLVM does not unroll: its body was 39
    instructions for 16 FFMAs, the loop counter's 64-bit arithmetic among them.  Written out, the
    shared-memory addresses become constants and the counter goes (docs/kernels.md, "The static
    performance table").  The ``ii``/``jj`` loops have constant trip counts and unroll anyway.
    """
    lines = ["def multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, tx, ty):"]
    for kk in range(depth):
        lines += ["    for ii in range(MICRO):", f"        a_reg[ii] = a_tile[{kk}, tx + ii * THREADS]",
                  "    for jj in range(MICRO):", f"        b_reg[jj] = b_tile[{kk}, ty + jj * THREADS]",
                  "    for ii in range(MICRO):", "        for jj in range(MICRO):",
                  "            acc[ii, jj] += a_reg[ii] * b_reg[jj]"]
    return "\n".join(lines)


def _compile_multiply_stage():
    namespace = {"MICRO": MICRO, "THREADS": THREADS}
    exec(_multiply_stage_source(TILE_K), namespace)  # noqa: S102 (the text above, generated here)
    function = namespace["multiply_stage"]
    function.__doc__ = """``acc += a_tile[:, rows] x b_tile[:, cols]`` for this thread's ``MICRO x MICRO`` micro-tile.

    Shared by the three tiled (version 2) convolution kernels: after a stage of ``TILE_K`` is in
    shared memory, thread ``(tx, ty)`` owns rows ``tx + THREADS*ii`` and columns ``ty + THREADS*jj``;
    each ``kk`` loads ``MICRO`` values of A and of B into registers and does ``MICRO*MICRO``
    multiply-adds (an outer product).  Generated: :func:`_multiply_stage_source`."""
    return cuda.jit(device=True)(function)


multiply_stage = _compile_multiply_stage()


@cuda.jit(device=True)
def store_flat_tile(c2, acc, row0, rows, m0, n0, cols, tx, ty):
    """``c2[row0 + m, n] = acc[ii, jj]`` for this thread's rows ``m = m0 + tx + 16 ii < rows`` and columns
    ``n = n0 + ty + 16 jj < cols``: the backward-filter kernels' store into their workspace ``c2``, flat in
    ``q``.  The loop body holds no index arithmetic, so it unrolls fully and ``acc[ii, jj]`` keeps a
    compile-time index: ``acc`` stays in registers (a divide in it once gave a 64-byte stack frame)."""
    for ii in range(MICRO):
        m = m0 + tx + ii * THREADS
        if m < rows:
            for jj in range(MICRO):
                n = n0 + ty + jj * THREADS
                if n < cols:
                    c2[row0 + m, n] = acc[ii, jj]


# ------------------------------------ the register-tiled, double-buffered (version 3) kernels' pieces
# Version 3 computes a BLOCK3 x BLOCK3 tile of C per block of THREADS x THREADS threads; each thread owns
# a MICRO3 x MICRO3 register micro-tile: rows ra + {0..3} and ra + HALF3 + {0..3} with ra = 4 tx, columns
# rb + {0..3} and rb + HALF3 + {0..3} with rb = 4 ty.  Each run of four is contiguous in shared memory, so a
# thread reads its 8 values of A (and of B) for one kk as two 16-byte loads, and the 16 threads of a
# half-warp read 16 neighbouring 16-byte runs (no bank conflict).  The stage is TILE_K3 deep, and there are
# two of them in shared memory: while the threads multiply one, their registers hold the next one's
# global loads, which they store into the other (one barrier per stage).
MICRO3 = 8
RUN3 = 4  # a micro-tile's rows (and columns) come in two contiguous runs of four
BLOCK3 = THREADS * MICRO3  # 128 rows and 128 columns of C per block
HALF3 = BLOCK3 // 2  # the second run of a thread's rows starts 64 rows after the first
TILE_K3 = 8
# Four padding columns: a B tile written down its columns (neighbouring threads, neighbouring kk) then
# spreads a warp over all 32 banks, and every row still starts on a 16-byte boundary.
PAD3 = 4
# Shared tiles start on a 16-byte boundary, so that LLVM can merge four neighbouring loads into one 16-byte
# load; the simulator takes no alignment (and needs none).
ALIGN3 = None if config.ENABLE_CUDASIM else 16
ROW3 = BLOCK3 + PAD3  # 132: the elements of one kk's row in a stage
STAGE3 = TILE_K3 * ROW3  # one stage of one tile, flat: element (kk, r) at kk * ROW3 + r
TILES3 = 2 * STAGE3  # the shared array of one operand: two stages (buffers), flat
LOADS3 = TILE_K3 * BLOCK3 // (THREADS * THREADS)  # 4 elements of A and 4 of B per thread and stage
WINDOWS3 = (BLOCK3, 4)  # per row of a block's A tile: its window's corner, flat and (d, h, w), in shared memory
A_STEP3 = THREADS * THREADS // TILE_K3  # 32: a thread's four A loads of a stage are rows t % 32 + 32 l
INT32_MAX = 2 ** 31 - 1


def gemm_grid3(M, N, depth=1):
    """``(blocks, threads)`` of version 3: :func:`gemm_grid` with ``BLOCK3 x BLOCK3`` tiles."""
    return gemm_grid(M, N, depth, tile=BLOCK3)


def check_int32(**arrays):
    """Version 3 indexes with 32-bit integers: every array (or size) must have fewer than 2**31 elements.

    Raises ``ValueError`` naming the first that does not, and what to use instead."""
    for name, a in arrays.items():
        size = a if isinstance(a, int) else a.size
        if size > INT32_MAX:
            raise ValueError(f"{name}: {size} elements, more than version 3's 32-bit indices reach "
                             f"({INT32_MAX}); use version=2 (64-bit indices) or a smaller batch")


def _multiply_half3_source():
    """The source of :data:`multiply_half3`: half a stage, ``kk = kk0 .. kk0 + 3`` written out::

        for kk in range(kk0, kk0 + 4):
            a_reg[:] = a_tile[buf, kk, ra:ra+4] + a_tile[buf, kk, ra+64:ra+68]    # 2 x 16-byte shared loads
            b_reg[:] = b_tile[buf, kk, rb:rb+4] + b_tile[buf, kk, rb+64:rb+68]
            acc += outer(a_reg, b_reg)                                             # 64 multiply-adds

    4 shared loads (16 bytes each, vectorised by LLVM) per 64 FFMAs, against 8 scalar ones per 16 in
    version 2.  Called with constant ``buf`` and ``kk0``, so every shared address is a register plus a
    constant.  A stage is two halves, so that a loader's registers need live only across one of them."""
    lines = ["def multiply_half3(a_tile, b_tile, buf, kk0, acc, a_reg, b_reg, ra, rb):"]
    for kk in range(TILE_K3 // 2):
        at = f"buf * STAGE3 + (kk0 + {kk}) * ROW3"
        lines += [f"    b_reg[{r}] = b_tile[{at} + rb + {r % RUN3 + (r // RUN3) * HALF3}]" for r in range(MICRO3)]
        for run in range(MICRO3 // RUN3):  # the A rows in two runs of four: fewer registers live at once
            lines += [f"    a_reg[{r}] = a_tile[{at} + ra + {r + run * HALF3}]" for r in range(RUN3)]
            lines += ["    for ii in range(RUN3):", "        for jj in range(MICRO3):",
                      f"            acc[{run * RUN3} + ii, jj] += a_reg[ii] * b_reg[jj]"]
    return "\n".join(lines)


def _compile_multiply_half3():
    namespace = {"MICRO3": MICRO3, "RUN3": RUN3, "STAGE3": STAGE3, "ROW3": ROW3}
    exec(_multiply_half3_source(), namespace)  # noqa: S102 (the text above, generated here)
    function = namespace["multiply_half3"]
    function.__doc__ = """``acc += a_tile[buf, kk0:kk0+4, rows] x b_tile[buf, kk0:kk0+4, cols]``: half a stage of this
    thread's 8 x 8 micro-tile, rows ``ra + {0..3}, ra + 64 + {0..3}``, columns ``rb + {0..3}, rb + 64 + {0..3}``.
    Generated: :func:`_multiply_half3_source`."""
    return cuda.jit(device=True)(function)


multiply_half3 = _compile_multiply_half3()


@cuda.jit(device=True)
def zero_fill3(acc):
    """``acc[:, :] = 0``: the ``MICRO3 x MICRO3`` micro-tile of version 3."""
    for ii in range(MICRO3):
        for jj in range(MICRO3):
            acc[ii, jj] = 0


@cuda.jit(device=True)
def store_stage3(tile, buf, regs, at, step):
    """A stage's loads, from registers into shared buffer ``buf``: ``regs[l]`` (``l < 4``) at flat ``at + l * step``
    of the stage: ``at = kk * ROW3 + col`` and ``step = 32`` for a thread loading columns ``col + 32 l`` of row
    ``kk`` (a warp writes 32 neighbouring elements of one row), or ``step = ROW3`` for rows ``kk + l`` of column
    ``col``."""
    for l in range(LOADS3):
        tile[buf * STAGE3 + at + l * step] = regs[l]


@cuda.jit(device=True)
def micro_row(r):
    """Offset of a thread's micro-tile row (or column) ``r`` (0..7) from its first: ``0..3, 64..67``."""
    return r % RUN3 + (r // RUN3) * HALF3


@cuda.jit(device=True)
def gather_loads3(x, table, windows, a_next, k, kk_a, a_col, D, H, W, zero):
    """A stage's A loads into registers: ``a_next[l] = A[m_l, k + kk_a]`` for this thread's four rows
    ``m_l = a_col + 32 l`` of the block, gathered from ``x`` (flat) as the sum of two halves: the row's, from
    ``windows[m_l] = (flat, d, h, w)`` (the corner of its window), and the depth's, from ``table[k] = (flat, d,
    h, w)`` (an offset within the window).  The element is ``x[flat + flat']``, or zero unless
    ``0 <= d + d' < D``, ``0 <= h + h' < H`` and ``0 <= w + w' < W``, tested as unsigned (a negative
    coordinate fails too).  One table row serves all four loads."""
    row = uint32(k + kk_a)
    offset, dd, dh, dw = table[row, 0], table[row, 1], table[row, 2], table[row, 3]
    for l in range(LOADS3):
        mm = a_col + l * A_STEP3
        inside = ((uint32(windows[mm, 1] + dd) < D) & (uint32(windows[mm, 2] + dh) < H)
                  & (uint32(windows[mm, 3] + dw) < W))
        a_next[l] = x[uint32(windows[mm, 0] + offset)] if inside else zero  # one test, no branch


@cuda.jit(device=True)
def padded_loads3(w, b_next, w_at):
    """A stage's B loads into registers from zero-padded operands (no test): ``b_next[l] = w[w_at + l]``, four
    neighbouring elements (one address, four constant offsets)."""
    for l in range(LOADS3):
        b_next[l] = w[uint32(w_at + l)]


@cuda.jit(device=True)
def gemm_loop3(a_src, b_src, table, windows, a_tile, b_tile, acc, a_reg, b_reg, a_next, b_next, k_begin, k_end,
               D, H, W, b_first, Kp, zero):
    """Version 3's main loop: ``acc += A[rows, k] B[k, cols]`` over the stages of ``[k_begin, k_end)``, double
    buffered, for thread ``(tx, ty)``'s 8 x 8 micro-tile.

    A is gathered from ``a_src`` through ``windows`` (per row) and ``table`` (per depth), :func:`gather_loads3`;
    B is ``b_src[b_first + col * Kp + k]``, zero-padded so that no load needs a test (:func:`padded_loads3`).
    ``k_end - k_begin`` is a whole number of pairs of stages, and both ``table`` and ``b_src`` hold one spare
    stage past ``k_end`` (the last pass's prefetch reads it and never multiplies it).  Thread ``t`` loads A at
    depth ``t // 32`` of rows ``t % 32 + 32 l``, and B at depths ``4 (t % 2) + l`` of column ``t // 2``
    (``l < 4``).  Before the loop, stage ``k_begin`` goes to buffer 0; each pass of the loop then multiplies
    buffer 0 while loading the next stage into registers and storing it to buffer 1, and the reverse: one
    barrier per stage.  B's loads are issued before the first half of the multiply (``kk`` 0..3) and stored
    after it, A's before the second half: each load's latency is hidden behind half a stage of multiply-adds
    (256 per thread), and only four loaded registers are live across a half (with all eight live, ptxas
    spilled at the 128-register cap)."""
    tx = uint32(cuda.threadIdx.x)
    ty = uint32(cuda.threadIdx.y)
    t = uint32(ty * THREADS + tx)
    # Unsigned thread indices: Numba then adds no negative-index wraparound to the shared addresses
    kk_a = uint32(t // A_STEP3)
    a_col = uint32(t % A_STEP3)
    kk_b = uint32(t % 2 * LOADS3)
    b_col = uint32(t // 2)
    a_at = uint32(kk_a * ROW3 + a_col)  # where this thread's loads go in a stage (store_stage3)
    b_at = uint32(kk_b * ROW3 + b_col)
    ra = uint32(tx * RUN3)  # this thread's first micro-tile row and column in a stage
    rb = uint32(ty * RUN3)
    b_at_k = uint32(b_first + b_col * Kp + kk_b + k_begin)  # carried: + TILE_K3 per stage

    gather_loads3(a_src, table, windows, a_next, k_begin, kk_a, a_col, D, H, W, zero)
    padded_loads3(b_src, b_next, b_at_k)
    store_stage3(a_tile, 0, a_next, a_at, A_STEP3)
    store_stage3(b_tile, 0, b_next, b_at, ROW3)
    cuda.syncthreads()
    k = uint32(k_begin + TILE_K3)  # a 32-bit counter: Numba's range() counts in 64 bits, a register more
    while k < uint32(k_end + TILE_K3):  # two stages per pass: multiply buffer 0 and load stage k into 1, ...
        b_at_k = uint32(b_at_k + TILE_K3)
        padded_loads3(b_src, b_next, b_at_k)  # next stage's B
        multiply_half3(a_tile, b_tile, 0, 0, acc, a_reg, b_reg, ra, rb)  # this stage, kk 0..3
        store_stage3(b_tile, 1, b_next, b_at, ROW3)
        gather_loads3(a_src, table, windows, a_next, k, kk_a, a_col, D, H, W, zero)  # next stage's A
        multiply_half3(a_tile, b_tile, 0, 4, acc, a_reg, b_reg, ra, rb)  # this stage, kk 4..7
        store_stage3(a_tile, 1, a_next, a_at, A_STEP3)
        cuda.syncthreads()
        # ... then multiply buffer 1 and load stage k + 8 into 0 (past the last stage: the spare one)
        b_at_k = uint32(b_at_k + TILE_K3)
        padded_loads3(b_src, b_next, b_at_k)
        multiply_half3(a_tile, b_tile, 1, 0, acc, a_reg, b_reg, ra, rb)
        store_stage3(b_tile, 0, b_next, b_at, ROW3)
        gather_loads3(a_src, table, windows, a_next, k + TILE_K3, kk_a, a_col, D, H, W, zero)
        multiply_half3(a_tile, b_tile, 1, 4, acc, a_reg, b_reg, ra, rb)
        store_stage3(a_tile, 0, a_next, a_at, A_STEP3)
        cuda.syncthreads()
        k = uint32(k + 2 * TILE_K3)



# Table rows past the depth K read as padding: an offset this far off is outside every volume.
FAR = 2 ** 30
# Backward-data's tables fold the stride's remainders into the depth coordinate, REMAINDER apart (see
# backward_data_table); the sizes that leaves room for are checked at launch (check_remainders).
REMAINDER = 2 ** 20
_TABLES = {}


def _stage_table(key, build):
    """The int32 device array of ``build()``'s rows ``(K, 4)``, padded to whole pairs of stages plus a spare
    stage with rows ``(0, FAR, FAR, FAR)`` (every load through them reads zero, with no test of ``k < K``):
    ``(Kp + TILE_K3, 4)``.  Built once per key and array module, on the host and copied once (like
    :func:`tap_table`)."""
    key = (xp().__name__,) + key
    if key not in _TABLES:
        rows = numpy.asarray(build(), dtype=numpy.int64).reshape(-1, 4)
        table = numpy.full((ceil_div(len(rows), 2 * TILE_K3) * 2 * TILE_K3 + TILE_K3, 4), FAR, dtype=numpy.int64)
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
    and width for the bounds test (:func:`gather_loads3`).  ``spatial = (D, H, W)`` of the input."""
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
    coordinates are ``d + pd = qd*sd + rd`` (per axis; :func:`gather_loads3`'s ``windows``): tap ``a`` reads
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
    corner's coordinates, to which a row's tap offsets are added (:func:`gather_loads3`)."""
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
def store_rows3(y, acc, first, m, M, S, F, f_group, f, Fg):
    """``y[n, f_group + f + micro_row(jj), s] = acc[first + r, jj]`` for rows ``m + r = (n, s)``, ``r < 4``,
    below ``M``, and columns below ``Fg``: one run of a thread's micro-tile rows, split once and carried.
    ``y``: ``(N*F*S,)`` flat, the output of the forward (``F`` filters) or backward-data (``F`` = channels)
    kernel; ``f_group``: the group's first column."""
    n, s = split2(m, S)
    at = uint32((n * F + f_group + f) * S + s)  # y's flat index of row m, column f
    for r in range(RUN3):
        if m + r < M:
            for jj in range(MICRO3):
                if f + micro_row(jj) < Fg:
                    y[uint32(at + micro_row(jj) * S)] = acc[first + r, jj]
        at = uint32(at + 1)
        s += 1
        if s == S:  # the next row is the next sample's first position
            s = 0
            at = uint32(at + (F - 1) * S)
