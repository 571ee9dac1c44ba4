"""What the wrappers hand MPI: host staging of device arrays, and MPI datatypes for split blocks.

Staging.  When the MPI library is CUDA-aware (``cuda_aware``) device buffers go to
MPI directly; otherwise ``to_mpi`` copies them to the host and ``from_mpi`` copies
the result back.  The device stream is synchronized before MPI touches device memory.

Split blocks.  ``reduce_scatter`` and ``allgather`` split one axis of x.  A
C-contiguous x is an (outer, L, inner) array (``split_axis``) whose block of rank i
is ``x[:, start_i:start_i + L_i]``: ``outer`` runs of ``L_i * inner`` elements,
``L * inner`` apart.  ``block_types`` describes each rank's block as one MPI
datatype, so MPI reads and writes the blocks in place and nothing is packed or
unpacked (docs/benchmarks.md, "The collectives' packing").
"""

import collections
import ctypes
import dataclasses
import functools
import itertools
import math
import os

import numpy
from mpi4py import MPI

from refconv import arrays
from refconv.collectives import local
from refconv.shapes import memory
from refconv.shapes.array import ShapeArray


# -- CUDA-aware detection and staging ----------------------------------------------------
@functools.lru_cache(maxsize=1)
def cuda_aware():
    """True when device buffers may be handed to MPI directly.

    REFCONV_CUDA_AWARE=0|1 decides if set; otherwise MPIX_Query_cuda_support()
    of the libmpi this process loaded (found in /proc/self/maps), False if absent.
    """
    env = os.environ.get("REFCONV_CUDA_AWARE")
    if env in ("0", "1"):
        return env == "1"
    for path in _loaded_libmpi():
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query())
    return False


def _loaded_libmpi():
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libmpi" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi"))


def to_mpi(x):
    """A contiguous buffer MPI may read: x itself, or a host copy when staging (in pinned memory: :func:`pinned`)."""
    xp = arrays.array_module(x)
    x = xp.ascontiguousarray(x)
    if arrays.is_device_array(x):
        arrays.synchronize()
        if not cuda_aware():
            host = pinned(x.shape, x.dtype)
            return arrays.device_module().asnumpy(x, out=host)  # the copy into it, waited for
    return x


def empty(shape, dtype, like):
    """A receive buffer: on the host when staging (pinned, for a device ``like``), else with ``like``'s module.

    A fresh device buffer may be a block of CuPy's pool that a kernel still queued
    on the stream reads (its last owner freed it, the stream has not run yet): MPI
    writes without the stream's order, so the stream is waited for first."""
    if arrays.is_device_array(like):
        if not cuda_aware():
            return pinned(shape, dtype)  # staged: copied to the device by from_mpi
        buf = arrays.array_module(like).empty(shape, dtype)
        arrays.synchronize()
        return buf
    if getattr(like, "shapes_only", False):
        return new(shape, dtype, "shapes")
    return numpy.empty(shape, dtype)


def where(x):
    """Where x lives, as :func:`new` takes it: True on the device, "shapes" for a shapes-only array, else False."""
    return "shapes" if getattr(x, "shapes_only", False) else arrays.is_device_array(x)


def new(shape, dtype, on_device):
    """An empty array on the device or the host (for a rank that has no array to be ``like``);
    on the device, after the stream's queued work, as :func:`empty`.  ``on_device="shapes"``: a
    shapes-only array (:func:`where`)."""
    if on_device == "shapes":                   # counted as a communication buffer on a tracking rank
        with memory.kind("comm"):
            return ShapeArray(shape, dtype)
    buf = (arrays.device_module() if on_device else numpy).empty(shape, dtype)
    if on_device:
        arrays.synchronize()
    return buf


def from_mpi(buf, like):
    """Back to ``like``'s array module after MPI has written ``buf``."""
    if arrays.is_device_array(like):
        if arrays.is_device_array(buf):
            arrays.synchronize()
            return buf
        return arrays.array_module(like).asarray(buf)
    return buf


def pinned(shape, dtype):
    """An empty host array in page-locked memory, from CuPy's pinned-memory pool.

    Copies between the device and pinned memory run at the bus's full rate, where pageable memory goes
    through a driver bounce buffer; and the pool reuses blocks, so a staging buffer of a size seen
    before costs no new page-locking.  A block goes back to the pool only when the last array on it
    is freed, and a nonblocking MPI call's request (mpi4py's, and refconv's around it) holds its
    buffers until it completes: a block is never handed out while MPI may still use it.
    """
    dtype = numpy.dtype(dtype)
    count = math.prod(shape)
    if count == 0:
        return numpy.empty(shape, dtype)
    return numpy.ndarray(shape, dtype, buffer=arrays.device_module().cuda.alloc_pinned_memory(count * dtype.itemsize))


def spec(buf, counts=None, displs=None):
    """An mpi4py buffer spec; mpi4py infers the MPI datatype from the buffer."""
    if counts is None:
        return buf
    return [buf, (list(counts), list(displs))]


def displs(counts):
    """Where each of consecutive blocks of ``counts`` starts: 0, c0, c0 + c1, ..."""
    return list(itertools.accumulate(counts, initial=0))[:-1]


# -- MPI datatypes: a split along one axis, read and written in place ---------------------
def split_axis(shape, axis):
    """(outer, L, inner): the sizes of the dims before ``axis``, of ``axis``, and after it."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


# BlockLayout -> committed MPI datatype.  The cache belongs to the process, not to a rank or a run: a
# layout's type is made once and reused by every later call (MPI_Finalize frees what is left, or
# free_block_types()).  Simulated ranks never fill it: they move BlockLayouts as they are.
_BLOCK_TYPES = collections.OrderedDict()
BLOCK_TYPES_KEPT = 64                     # past this many the least recently used are freed


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """One rank's block in a C-contiguous buffer: ``outer`` runs of ``run`` bytes, ``stride``
    bytes apart, with an extent of ``run`` bytes (so that block q of an even split starts q
    extents in).  :func:`block_type` commits it as an MPI datatype; simulated ranks
    (refconv.simulated) read it as it is."""

    outer: int
    run: int
    stride: int


def block_types(dtype, outer, counts, inner, stride):
    """Every rank's block datatype (``block_type``) for the lengths ``counts`` along the
    split axis, ``stride`` elements apart.  The cache is trimmed after the list is made, and
    never below this call's distinct types: freeing one of them would hand MPI a null type.
    On a simulated rank the blocks are their :class:`BlockLayout`: no MPI datatype is made."""
    item = numpy.dtype(dtype).itemsize
    layouts = [BlockLayout(outer, c * inner * item, stride * item) for c in counts]
    if local.simulated() is not None:
        return layouts
    blocks = [block_type(layout) for layout in layouts]
    while len(_BLOCK_TYPES) > max(BLOCK_TYPES_KEPT, len(set(counts))):
        _BLOCK_TYPES.popitem(last=False)[1].Free()     # the least recently used: not this call's
    return blocks


def free_block_types():
    """Free every cached block datatype (:func:`block_type`'s); the next call commits anew.  Safe twice."""
    while _BLOCK_TYPES:
        _BLOCK_TYPES.popitem()[1].Free()


def block_type(layout):
    """The MPI datatype of a :class:`BlockLayout` (bytes, so that any dtype moves alike: the
    wrappers sum nothing through MPI with these).  Committed once and kept."""
    block = _BLOCK_TYPES.pop(layout, None)
    if block is None:
        runs = MPI.BYTE.Create_vector(layout.outer, layout.run, layout.stride)
        block = runs.Create_resized(0, layout.run).Commit()
        runs.Free()
    _BLOCK_TYPES[layout] = block                       # the most recently used go last
    return block
