"""Launch geometry and index helpers shared by every kernel in ``refconv.kernels``.

Host side: the block sizes and small functions that turn a problem size into
``(blocks, threads)`` with ceil-division; the volume view of an image and the tap table that
let one kernel per pass serve both.  Device side: the index arithmetic
(splitting a flat index into coordinates, the stride/padding/dilation map
between input and output pixels), written once and called from every kernel.
The tiled kernels' own pieces: ``tiles_v2.py`` (version 2) and ``tiles_v3.py`` (version 3).

Arrays: the public functions take and return *device arrays*: CuPy arrays on a
real GPU, NumPy arrays under Numba's CUDA simulator.  ``refconv.arrays`` decides
which; nothing here imports cupy.
"""

from numba import cuda

from refconv import arrays

# ---------------------------------------------------------------- block sizes
# Elementwise and reduction kernels: one thread per element, 256 per block.
BLOCK_1D = 256
# Kernels that choose how finely to split a reduction (split-K, the per-channel sums)
# aim for about this many blocks in flight: a few per SM of a large GPU (an H200 has 132).
TARGET_BLOCKS = 512
# Both tiled versions launch blocks of THREADS x THREADS threads (tiles_v2.py, tiles_v3.py).
THREADS = 16


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


def ceil_div(a, b):
    return -(-a // b)


def grid_1d(n):
    """``(blocks, threads)`` for one thread per element of ``n``."""
    return max(1, ceil_div(n, BLOCK_1D)), BLOCK_1D


# CUDA's limits on a grid's y and z sizes (x allows 2**31 - 1, past any M here).
MAX_GRID_YZ = 65535


def gemm_grid(M, N, depth, tile):
    """``(blocks, threads)`` covering a ``M x N`` GEMM with ``depth`` independent slices (groups, K-splits), in
    ``tile x tile`` blocks (version 2's ``TILE_M = TILE_N``, or version 3's ``BLOCK``: each version's
    ``gemm_grid`` passes its own).

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
