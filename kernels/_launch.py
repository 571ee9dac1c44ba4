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

from numba import config, cuda

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


def ceil_div(a, b):
    return -(-a // b)


def grid_1d(n):
    """``(blocks, threads)`` for one thread per element of ``n``."""
    return max(1, ceil_div(n, BLOCK_1D)), BLOCK_1D


# CUDA's limits on a grid's y and z sizes (x allows 2**31 - 1, past any M here).
MAX_GRID_YZ = 65535


def gemm_grid(M, N, depth=1):
    """``(blocks, threads)`` covering a ``M x N`` GEMM with ``depth`` independent slices (groups, K-splits).

    The callers check ``depth`` against :data:`MAX_GRID_YZ` where they choose it, naming their own argument
    (``groups``, ``splits``); here, the check that no launch passes it."""
    blocks = (max(1, ceil_div(M, TILE_M)), max(1, ceil_div(N, TILE_N)), depth)
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
