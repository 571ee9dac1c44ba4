"""Every MPI data movement in refconv goes through this module.

Arrays may be NumPy or CuPy; results have the array module of the inputs.
Non-contiguous inputs are packed first, and the device stream is synchronized
before MPI touches device memory.  ``reduce_scatter`` and ``allgather`` along an
inner axis let MPI datatypes walk the strided blocks of host buffers instead of
packing them (``_split_axis``).  When the MPI library is CUDA-aware (see
``cuda_aware``) device buffers go to MPI directly, otherwise they are staged
through host memory.

=====================  ========================  ==========================================
function               MPI call                  ``stats`` bytes recorded (per rank)
=====================  ========================  ==========================================
``allreduce``          Allreduce                 the full buffer
``reduce_scatter``     Reduce_scatter (*)        the full input buffer (all ranks' blocks)
``allgather``          Allgatherv (*)            the full output buffer
``exchange``           Isend/Irecv               bytes sent to other ranks         [kind "halo"]
``alltoallv``          Alltoallv                 bytes sent to other ranks (not self)
``bcast``              Bcast                     the buffer
``scatter``            Scatterv                  the block this rank receives
``gather``             Gatherv                   the block this rank contributes
=====================  ========================  ==========================================

(*) Along an inner axis, on host buffers of at least ``DATATYPES_FROM_BYTES``, through
MPI datatypes instead (``_split_axis``): reduce_scatter is an Alltoallw of the blocks
and a local sum, allgather an Allgather (even counts) or an Alltoallw (uneven).

``elements`` is bytes / itemsize.  The figures are buffer sizes by definition,
not wire traffic: a size-1 communicator records the same figures (with
``comm_size=1``) and makes no MPI call.

Deadlines.  Every MPI call here runs under the collective timeout: when one call
waits longer, a watchdog thread prints ONE line (the collective, the
communicator's name, the shapes, how long this rank waited) and calls
``MPI.COMM_WORLD.Abort(EXIT_TIMEOUT)``, so a stopped or stuck peer ends the job
instead of hanging it.  The timeout comes from ``set_timeout(seconds)`` or
``with timeout(seconds):``, else the environment variable ``REFCONV_TIMEOUT``
(seconds; 0 or unset: none).  Plain API use has no deadline by default;
``refconv train`` uses ``--timeout`` (default ``TRAINING_TIMEOUT_S``).

Fault injection (for tests).  ``REFCONV_FAULT=rank:point:action[:n]``, read once
at import (or ``set_fault``), makes world rank ``rank`` ``kill`` (SIGKILL),
``stop`` (SIGSTOP), ``raise`` (``FaultInjected``), ``exit`` (``sys.exit(0)``) or
``osexit`` (``os._exit(0)``) itself the ``n``-th time (default 1) it reaches ``point``:

- ``startup``: this module's import;
- a collective kind, just before its MPI call: ``allreduce``, ``reduce_scatter``,
  ``allgather``, ``halo``, ``alltoallv``, ``bcast``, ``scatter``, ``gather``,
  ``barrier``, ``object``, ``split``;
- ``collective``: any of them, so ``n`` counts every MPI call of the run;
- a point of a checkpoint save (``refconv.checkpoint.FAULT_POINTS``).

Unset, it costs one ``is None`` test per call.
"""

import collections
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import math
import numbers
import os
import signal
import sys
import threading
import time

import numpy
from mpi4py import MPI

from refconv import arrays
from refconv.failure import LINE_GRACE_S

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


# -- statistics --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Record:
    kind: str        # "allreduce", "reduce_scatter", "allgather", "halo", "alltoallv", ...
    comm_size: int
    elements: int
    bytes: int


class Region:
    """The records of one ``stats.recording()`` region."""

    def __init__(self):
        self.records = []
        self.seconds = {}  # kind -> seconds spent inside its MPI calls (the watchdog brackets each)

    def summary(self, *, moved_only=False):
        return _summarize(self.records, moved_only)


def _summarize(records, moved_only=False):
    """kind -> {"calls", "elements", "bytes"}; ``moved_only`` leaves out calls on
    one-rank communicators (recorded by definition, but nothing leaves the rank)."""
    out = {}
    for r in records:
        if moved_only and r.comm_size == 1:
            continue
        s = out.setdefault(r.kind, {"calls": 0, "elements": 0, "bytes": 0})
        s["calls"] += 1
        s["elements"] += r.elements
        s["bytes"] += r.bytes
    return out


def _merge(a, b):
    """The sum of two summaries (kind -> {"calls", "elements", "bytes"})."""
    out = {kind: dict(figures) for kind, figures in a.items()}
    for kind, figures in b.items():
        s = out.setdefault(kind, {"calls": 0, "elements": 0, "bytes": 0})
        for key, value in figures.items():
            s[key] += value
    return out


class CommStats:
    """Exact, deterministic counts of the calls made through this module.

    ``records`` holds the most recent calls (at least ``RECENT``): older ones are folded
    into the totals that ``summary()`` adds up, so a long run's memory stays flat.
    """

    RECENT = 1_000

    def __init__(self):
        self.records = []
        self._regions = []
        self._folded = ({}, {})         # the records let go of: (their summary, moved_only's)

    def reset(self):
        self.records.clear()
        self._folded = ({}, {})

    def add(self, kind, comm_size, elements, nbytes):
        rec = Record(kind, int(comm_size), int(elements), int(nbytes))
        self.records.append(rec)
        for region in self._regions:
            region.records.append(rec)
        if len(self.records) >= 2 * self.RECENT:
            self._fold(len(self.records) - self.RECENT)

    def _fold(self, n):
        """Replace the oldest ``n`` records by their two summaries."""
        old = self.records[:n]
        del self.records[:n]
        self._folded = tuple(_merge(folded, _summarize(old, moved))
                             for folded, moved in zip(self._folded, (False, True)))

    def summary(self, *, moved_only=False):
        """kind -> {"calls", "elements", "bytes"} over all records since reset()."""
        return _merge(self._folded[moved_only], _summarize(self.records, moved_only))

    def add_seconds(self, kind, seconds):
        """Time one MPI call of ``kind`` took, added to every open region."""
        for region in self._regions:
            region.seconds[kind] = region.seconds.get(kind, 0.0) + seconds

    @contextlib.contextmanager
    def recording(self):
        """``with stats.recording() as region: ...`` then ``region.summary()``."""
        region = Region()
        self._regions.append(region)
        try:
            yield region
        finally:
            self._regions.remove(region)


stats = CommStats()


# -- deadlines: the collective watchdog --------------------------------------------------
TRAINING_TIMEOUT_S = 300.0      # refconv train's default --timeout
EXIT_TIMEOUT = 124              # the abort code of a timed-out collective (as coreutils timeout)


def _check_timeout(seconds, what="timeout"):
    """seconds > 0, or None for no deadline (0 also means none)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not seconds >= 0 \
            or seconds == float("inf"):
        raise ValueError(f"{what}: expected seconds > 0, or 0 / None for no deadline; got {seconds!r}")
    return float(seconds) or None


def env_timeout(default=None):
    """REFCONV_TIMEOUT in seconds (0: no deadline) if set, else ``default``."""
    text = os.environ.get("REFCONV_TIMEOUT", "").strip()
    if not text:
        return _check_timeout(default)
    try:
        value = float(text)
    except ValueError:
        value = text
    return _check_timeout(value, "REFCONV_TIMEOUT")


class _Watchdog:
    """Watches the MPI call in progress from a daemon thread; aborts the job past its deadline.

    The calling thread only stores and clears ``current``, a tuple (kind, comm, buffers,
    start time, timeout): no lock, no system call, so the deadline costs well under 5%
    of a 4 KB allreduce (``python -m refconv.bench.watchdog``).
    """

    def __init__(self):
        self.timeout = None
        self.current = None
        self._thread = None

    def set(self, seconds):
        self.timeout = seconds
        if seconds is not None and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="refconv-watchdog", daemon=True)
            self._thread.start()

    def __call__(self, kind, comm, buffers):
        """``with _watchdog(kind, comm, buffers): <one MPI call>``; also the fault hook."""
        if _fault is not None:
            _fault.reached(kind, "collective")
        if self.timeout is not None:
            self.current = (kind, comm, buffers, time.monotonic(), self.timeout)
        self.kind, self.started = kind, time.perf_counter()
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current = None
        stats.add_seconds(self.kind, time.perf_counter() - self.started)  # time per kind, for refconv bench

    def _watch(self):
        while True:
            call = self.current
            limit = call[4] if call is not None else self.timeout or 20.0
            time.sleep(min(1.0, max(0.01, limit / 20)))     # fires within 5% of the deadline
            if call is not None and call is self.current and time.monotonic() - call[3] > call[4]:
                _abort_timed_out(*call)


def _abort_timed_out(kind, comm, buffers, started, timeout):
    world = MPI.COMM_WORLD
    waited = time.monotonic() - started
    sys.stderr.write(f"[rank {world.Get_rank()}] refconv: collective timeout: {kind} on communicator "
                     f"{comm.Get_name()!r} ({comm.Get_size()} ranks) with {_describe(buffers)}: "
                     f"this rank waited {waited:.1f} s (timeout {timeout:g} s); aborting the job\n")
    sys.stderr.flush()
    time.sleep(LINE_GRACE_S)         # mpiexec may drop output still in flight when the abort lands
    world.Abort(EXIT_TIMEOUT)


def _describe(buffers):
    """'send (4, 6) float32, recv (8, 6) float32' from {role: array, or {rank: array}, or shape}."""
    def one(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(a)}" for k, a in sorted(v.items())) + "}"
        if isinstance(v, (list, tuple)) and v and hasattr(v[0], "shape"):
            return "[" + ", ".join(one(a) for a in v) + "]"
        if hasattr(v, "shape"):
            return f"{tuple(v.shape)} {v.dtype}"
        return repr(v)
    return ", ".join(f"{role} {one(v)}" for role, v in buffers.items())


_watchdog = _Watchdog()


def set_timeout(seconds):
    """Deadline of every later MPI call made through this module: seconds > 0, or None
    (also 0) for none.  Set it alike on every rank."""
    _watchdog.set(_check_timeout(seconds))


def get_timeout():
    """The current deadline in seconds, or None."""
    return _watchdog.timeout


@contextlib.contextmanager
def timeout(seconds):
    """``with collectives.timeout(30): ...`` sets the deadline inside the block only."""
    before = _watchdog.timeout
    set_timeout(seconds)
    try:
        yield
    finally:
        _watchdog.set(before)


# -- fault injection (tests) ---------------------------------------------------------------
class FaultInjected(RuntimeError):
    """Raised by the ``raise`` action of REFCONV_FAULT."""


class _Fault:
    ACTIONS = ("kill", "stop", "raise", "exit", "osexit")

    def __init__(self, spec):
        parts = spec.split(":")
        try:
            rank, self.point, self.action = int(parts[0]), parts[1], parts[2]
            self.nth = int(parts[3]) if len(parts) == 4 else 1
        except (IndexError, ValueError):
            rank = None
        if rank is None or len(parts) > 4 or self.action not in self.ACTIONS or self.nth < 1:
            raise ValueError(f"REFCONV_FAULT: expected rank:point:action[:n] with action in "
                             f"{self.ACTIONS} and n >= 1, e.g. 1:allreduce:stop:3; got {spec!r}")
        self.mine = rank == MPI.COMM_WORLD.Get_rank()
        self.count = 0

    def reached(self, *points):
        """Count this visit of ``points`` (e.g. "allreduce", "collective"); act on the n-th."""
        if not self.mine or self.point not in points:
            return
        self.count += 1
        if self.count != self.nth:
            return
        where = f"{self.point} (visit {self.nth}) on rank {MPI.COMM_WORLD.Get_rank()}"
        sys.stderr.write(f"REFCONV_FAULT: {self.action} at {where}\n")     # tests time the end from here
        sys.stderr.flush()
        if self.action == "raise":
            raise FaultInjected(f"REFCONV_FAULT: injected at {where}")
        if self.action == "exit":
            sys.exit(0)
        if self.action == "osexit":
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)


def set_fault(spec):
    """Inject a fault like REFCONV_FAULT (``"rank:point:action[:n]"``), or None for none."""
    global _fault
    _fault = None if spec is None else _Fault(spec)


def fault_point(point):
    """A named point where REFCONV_FAULT may strike (used by refconv.checkpoint)."""
    if _fault is not None:
        _fault.reached(point)


_fault = None
set_fault(os.environ.get("REFCONV_FAULT") or None)
_watchdog.set(env_timeout())
fault_point("startup")


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


def _to_mpi(x):
    """A contiguous buffer MPI may read: x itself, or a host copy when staging."""
    xp = arrays.array_module(x)
    x = xp.ascontiguousarray(x)
    if arrays.is_device_array(x):
        arrays.synchronize()
        if not cuda_aware():
            return arrays.to_host(x)
    return x


def _empty(shape, dtype, like):
    """A receive buffer: on the host when staging, else with ``like``'s module."""
    if arrays.is_device_array(like) and cuda_aware():
        return arrays.array_module(like).empty(shape, dtype)
    return numpy.empty(shape, dtype)


def _from_mpi(buf, like):
    """Back to ``like``'s array module after MPI has written ``buf``."""
    if arrays.is_device_array(like):
        if arrays.is_device_array(buf):
            arrays.synchronize()
            return buf
        return arrays.array_module(like).asarray(buf)
    return buf


def _spec(buf, counts=None, displs=None):
    """An mpi4py buffer spec; mpi4py infers the MPI datatype from the buffer."""
    if counts is None:
        return buf
    return [buf, (list(counts), list(displs))]


def _displs(counts):
    return list(itertools.accumulate(counts, initial=0))[:-1]


def _check_counts(comm, counts, length, what):
    counts = [int(c) for c in counts]
    if len(counts) != comm.Get_size():
        raise ValueError(f"{what}: counts has {len(counts)} entries but the communicator "
                         f"has {comm.Get_size()} ranks")
    if any(c < 0 for c in counts) or sum(counts) != length:
        raise ValueError(f"{what}: counts {counts} must be >= 0 and sum to {length}")
    return counts


def _check_axis(x, axis, what):
    """``axis`` of x as a non-negative index (-1 is the last): ``_split_axis`` counts the
    dims before and after it, which a negative axis would miscount."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{what}: axis must be an int in [-{x.ndim}, {x.ndim}) for x of shape "
                         f"{tuple(x.shape)}, got {axis!r}")
    return int(axis) % x.ndim


# -- collectives -----------------------------------------------------------------
def allreduce(comm, x, op="sum", *, out=None):
    """The elementwise ``op`` ("sum", "prod", "max", "min") of every rank's x.

    The result is a new array, or ``out`` (same shape and dtype, contiguous) when given:
    reusing a buffer saves the allocation, which matters for large ones.
    """
    stats.add("allreduce", comm.Get_size(), x.size, x.nbytes)
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype):
        raise ValueError(f"allreduce: out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if comm.Get_size() == 1:
        if out is None:
            return arrays.array_module(x).array(x, copy=True)
        out[...] = x
        return out
    send = _to_mpi(x)
    direct = out is not None and out.flags.c_contiguous and \
        (not arrays.is_device_array(out) or cuda_aware())
    recv = out if direct else _empty(send.shape, send.dtype, x)
    with _watchdog("allreduce", comm, {"send": send, "recv": recv}):
        comm.Allreduce(_spec(send), _spec(recv), op=_OPS[op])
    result = _from_mpi(recv, x)
    if out is not None and not direct:
        out[...] = result
        return out
    return result


def allreduce_(comm, x, op="sum"):
    """In-place allreduce (MPI.IN_PLACE, no new buffer) of a contiguous array; returns x."""
    contiguous = x.flags.c_contiguous
    if comm.Get_size() == 1:  # the sum of one rank's x is x: record the call, copy nothing
        stats.add("allreduce", 1, x.size, x.nbytes)
        return x
    if not contiguous or (arrays.is_device_array(x) and not cuda_aware()):
        out = allreduce(comm, x, op)            # records the call itself
        x[...] = out
        return x
    stats.add("allreduce", comm.Get_size(), x.size, x.nbytes)
    if arrays.is_device_array(x):
        arrays.synchronize()
    with _watchdog("allreduce", comm, {"in place": x}):
        comm.Allreduce(MPI.IN_PLACE, x, op=_OPS[op])
    return x


def reduce_scatter(comm, x, counts, axis=0):
    """Sum x (the full buffer) over ranks; return this rank's block along ``axis``.

    counts[i] is the length along ``axis`` of rank i's block; blocks are consecutive.
    The result is always a new array, also on one rank (see ``_split_axis``).
    """
    axis = _check_axis(x, axis, "reduce_scatter")
    counts = _check_counts(comm, counts, x.shape[axis], "reduce_scatter")
    stats.add("reduce_scatter", comm.Get_size(), x.size, x.nbytes)
    xp = arrays.array_module(x)
    if comm.Get_size() == 1:
        return xp.array(x, copy=True)
    me = comm.Get_rank()
    outer, length, inner = _split_axis(x.shape, axis)
    shape = x.shape[:axis] + (counts[me],) + x.shape[axis + 1:]
    if _blocks_apply(x, outer, x.nbytes):
        # An all-to-all of the blocks, then a local sum: rank q receives every rank's block q
        # through a datatype that walks its runs, so nothing is packed.  (MPI's Reduce_scatter
        # would need MPI.SUM over a derived datatype, which MPICH refuses.)
        send = _to_mpi(x)                       # (outer, L, inner), contiguous, on the host
        size, item = comm.Get_size(), send.dtype.itemsize
        parts = numpy.empty((size, outer, counts[me], inner), send.dtype)  # parts[s]: rank s's block me
        blocks = _block_types(send.dtype, outer, counts, inner, length * inner)
        with _watchdog("reduce_scatter", comm, {"x": x, "axis": axis, "counts": counts}):
            comm.Alltoallw([send, ([1] * size, [d * inner * item for d in _displs(counts)]), blocks],
                           [parts, ([parts[0].size] * size, [q * parts[0].nbytes for q in range(size)]),
                            [_predefined(send.dtype)] * size])
        return _from_mpi(parts.sum(axis=0, dtype=send.dtype).reshape(shape), x)
    send = _pack(_to_mpi(x), outer, length, inner)  # (L, outer, inner): block i is a row range
    recv = _empty((counts[me], outer, inner), send.dtype, x)
    with _watchdog("reduce_scatter", comm, {"x": x, "axis": axis, "counts": counts}):
        comm.Reduce_scatter(_spec(send), _spec(recv), [c * outer * inner for c in counts], op=MPI.SUM)
    return _pack(_from_mpi(recv, x), counts[me], outer, inner).reshape(shape)  # unpacked


def allgather(comm, x, counts, axis=0):
    """Concatenate every rank's x along ``axis``; counts[i] = rank i's length there.

    The result is always a new array, also on one rank (see ``_split_axis``).
    """
    xp = arrays.array_module(x)
    axis = _check_axis(x, axis, "allgather")
    total = sum(int(c) for c in counts)
    counts = _check_counts(comm, counts, total, "allgather")
    me = comm.Get_rank()
    if x.shape[axis] != counts[me]:
        raise ValueError(f"allgather: x has length {x.shape[axis]} along axis {axis} "
                         f"but counts[{me}] = {counts[me]}")
    outer, _, inner = _split_axis(x.shape, axis)
    stats.add("allgather", comm.Get_size(), total * outer * inner, total * outer * inner * x.itemsize)
    if comm.Get_size() == 1:
        return xp.array(x, copy=True)
    shape = x.shape[:axis] + (total,) + x.shape[axis + 1:]
    if _blocks_apply(x, outer, total * outer * inner * x.itemsize):
        # Received in its final layout, nothing packed or unpacked: rank q's block is a
        # datatype of ``outer`` runs of L_q * inner elements, L * inner apart, in recv.
        send = _to_mpi(x)                       # (outer, L_me, inner), contiguous, on the host
        recv = numpy.empty(shape, send.dtype)   # (outer, L, inner)
        blocks = _block_types(send.dtype, outer, counts, inner, total * inner)
        with _watchdog("allgather", comm, {"x": x, "axis": axis, "counts": counts}):
            if len(set(counts)) == 1:           # one receive datatype for all: MPI's allgather
                comm.Allgather([send, send.size, _predefined(send.dtype)], [recv, 1, blocks[0]])
            else:                               # one per sender: an all-to-all that sends everyone x
                size, item = comm.Get_size(), send.dtype.itemsize
                comm.Alltoallw([send, ([send.size] * size, [0] * size), [_predefined(send.dtype)] * size],
                               [recv, ([1] * size, [d * inner * item for d in _displs(counts)]), blocks])
        return _from_mpi(recv, x)
    send = _pack(_to_mpi(x), outer, counts[me], inner)  # (L_me, outer, inner)
    recv = _empty((total, outer, inner), send.dtype, x)
    el = [c * outer * inner for c in counts]
    with _watchdog("allgather", comm, {"x": x, "axis": axis, "counts": counts}):
        comm.Allgatherv(_spec(send), _spec(recv, el, _displs(el)))
    return _pack(_from_mpi(recv, x), total, outer, inner).reshape(shape)  # unpacked


# -- a split along one axis: blocks that MPI reads and writes in place --------------------
def _split_axis(shape, axis):
    """(outer, L, inner): the sizes of the dims before ``axis``, of ``axis``, and after it.

    A C-contiguous x is an (outer, L, inner) array whose block of rank i is
    ``x[:, start_i:start_i + L_i]``.  With outer == 1 (axis 0, or only size-1 dims
    before it) each block is one contiguous range: MPI uses x as it is, no copy.
    Otherwise a block is ``outer`` runs of ``L_i * inner`` elements, and on host
    buffers of at least DATATYPES_FROM_BYTES an MPI datatype walks them
    (``_block_type``), so nothing is packed or unpacked: allgather receives every
    block in place, reduce_scatter sends each rank its block in place (an
    all-to-all) and sums what it receives.  Smaller calls pack (``_pack``: the
    split axis first, then back), as do device buffers handed to a CUDA-aware MPI
    (datatypes over device memory are not tested here).

    reduce_scatter and allgather return a new array also on one rank, where the block
    is x itself: callers keep results (Stationary-Y keeps the gathered x for its
    backward) and may write into them (``add_bias``), and a view of the caller's x
    would make either depend on the communicator's size.  That costs one copy.
    """
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _pack(buf, a, b, inner):
    """A contiguous (a, b, inner) ``buf`` as a contiguous (b, a, inner): a copy unless a or b is 1."""
    return arrays.array_module(buf).ascontiguousarray(buf.reshape(a, b, inner).swapaxes(0, 1))


DATATYPES_FROM_BYTES = 2**20  # smaller calls pack: the datatypes' calls cost more per call (docs/benchmarks.md)


def _blocks_apply(x, outer, nbytes):
    """Whether MPI datatypes replace packing for x (the same answer on every rank): its
    blocks are not single ranges (outer > 1), the full buffer has ``nbytes`` >=
    DATATYPES_FROM_BYTES, MPI will see a host buffer (x is one, or is staged), and MPI
    predefines x's dtype."""
    on_host = not arrays.is_device_array(x) or not cuda_aware()
    return outer > 1 and nbytes >= DATATYPES_FROM_BYTES and on_host and _predefined(x.dtype) is not None


def _predefined(dtype):
    """MPI's predefined datatype of ``dtype`` (MPI.FLOAT for float32), or None where MPI has none:
    the handle mpi4py itself infers a buffer's datatype from (``mpi4py.util.dtlib`` would give a
    derived copy, which MPICH refuses for ``MPI.SUM``)."""
    try:
        return MPI.Datatype.fromcode(numpy.dtype(dtype).char)
    except ValueError:
        return None


_BLOCK_TYPES = collections.OrderedDict()  # (dtype, outer, run, stride) -> committed MPI datatype
_BLOCK_TYPES_KEPT = 64                    # past this many the least recently used are freed


def _block_types(dtype, outer, counts, inner, stride):
    """Every rank's block datatype (``_block_type``) for the lengths ``counts`` along the
    split axis, ``stride`` elements apart.  The cache is trimmed after the list is made, and
    never below this call's distinct types: freeing one of them would hand MPI a null type."""
    blocks = [_block_type(dtype, outer, c * inner, stride) for c in counts]
    while len(_BLOCK_TYPES) > max(_BLOCK_TYPES_KEPT, len(set(counts))):
        _BLOCK_TYPES.popitem(last=False)[1].Free()     # the least recently used: not this call's
    return blocks


def _block_type(dtype, outer, run, stride):
    """The MPI datatype of one rank's block in a C-contiguous buffer: ``outer`` runs of
    ``run`` elements, ``stride`` elements apart, with an extent of ``run`` elements (so
    that block q of an even split starts q extents in).  Committed once and kept."""
    key = (numpy.dtype(dtype).str, outer, run, stride)
    block = _BLOCK_TYPES.pop(key, None)
    if block is None:
        runs = _predefined(dtype).Create_vector(outer, run, stride)
        block = runs.Create_resized(0, run * numpy.dtype(dtype).itemsize).Commit()
        runs.Free()
    _BLOCK_TYPES[key] = block                          # the most recently used go last
    return block


def exchange(comm, sends, recv_shapes, dtype, *, tag=0, like=None):
    """Many point-to-point messages at once (halos reaching past the nearest neighbour).

    sends: {dest rank: array}; recv_shapes: {source rank: shape}.  Returns
    {source rank: array}.  A message to oneself is copied without MPI.
    """
    dtype = numpy.dtype(dtype)
    me = comm.Get_rank()
    if like is None and sends:
        like = next(iter(sends.values()))
    nsent = sum(int(a.size) for r, a in sends.items() if r != me)
    stats.add("halo", comm.Get_size(), nsent, nsent * dtype.itemsize)
    out, requests, staged = {}, [], {}
    for src, shape in sorted(recv_shapes.items()):
        if src == me:
            continue
        staged[src] = _empty(tuple(shape), dtype, like)
        requests.append(comm.Irecv(_spec(staged[src]), src, tag))
    keep = []
    for dest, a in sorted(sends.items()):
        if dest == me:
            continue
        buf = _to_mpi(a.astype(dtype, copy=False))
        keep.append(buf)
        requests.append(comm.Isend(_spec(buf), dest, tag))
    with _watchdog("halo", comm, {"send": sends, "recv": staged}):
        MPI.Request.Waitall(requests)
    for src, buf in staged.items():
        out[src] = _from_mpi(buf, like)
    if me in recv_shapes:
        xp = arrays.array_module(sends[me])
        out[me] = xp.array(sends[me], dtype=dtype, copy=True).reshape(tuple(recv_shapes[me]))
    return out


def alltoallv(comm, send_blocks, recv_shapes, dtype=None):
    """Uneven all-to-all: send_blocks[q] goes to rank q; returns the list of
    blocks received, block r from rank r with shape recv_shapes[r]."""
    size, me = comm.Get_size(), comm.Get_rank()
    if len(send_blocks) != size or len(recv_shapes) != size:
        raise ValueError(f"alltoallv: need one send block and one recv shape per rank ({size}); "
                         f"got {len(send_blocks)} and {len(recv_shapes)}")
    like = send_blocks[0]
    xp = arrays.array_module(like)
    dtype = numpy.dtype(dtype if dtype is not None else like.dtype)
    scounts = [int(b.size) for b in send_blocks]
    nsent = sum(c for q, c in enumerate(scounts) if q != me)
    stats.add("alltoallv", size, nsent, nsent * dtype.itemsize)
    rcounts = [int(numpy.prod(s, dtype=numpy.int64)) for s in recv_shapes]
    if size == 1:
        return [xp.array(send_blocks[0], dtype=dtype, copy=True).reshape(tuple(recv_shapes[0]))]
    flat = xp.concatenate([xp.ravel(b).astype(dtype, copy=False) for b in send_blocks])
    send = _to_mpi(flat)
    recv = _empty(sum(rcounts), dtype, like)
    with _watchdog("alltoallv", comm, {"send": send_blocks, "recv": recv_shapes}):
        comm.Alltoallv(_spec(send, scounts, _displs(scounts)), _spec(recv, rcounts, _displs(rcounts)))
    recv = _from_mpi(recv, like)
    d = _displs(rcounts)
    return [recv[d[r]:d[r] + rcounts[r]].reshape(tuple(recv_shapes[r])) for r in range(size)]


def _bcast_meta(comm, x, root):
    """(shape, dtype, on device) of root's array, known to every rank."""
    meta = None
    if comm.Get_rank() == root:
        meta = (tuple(x.shape), numpy.dtype(x.dtype).str, arrays.is_device_array(x))
    with _watchdog("bcast", comm, {"metadata from root": root}):
        return comm.bcast(meta, root=root)


def _new(shape, dtype, on_device):
    return (arrays.device_module() if on_device else numpy).empty(shape, dtype)


def bcast_object(comm, obj, root=0):
    """Root's small picklable ``obj`` (a shape, a flag) on every rank; metadata, not recorded."""
    if comm.Get_size() == 1:
        return obj
    with _watchdog("object", comm, {"bcast from root": root}):
        return comm.bcast(obj, root=root)


def bcast(comm, x, root=0):
    """Root's x on every rank.  Non-roots pass None: shape, dtype and array module
    come from root in a small pickled message (not recorded)."""
    if comm.Get_size() == 1:
        stats.add("bcast", 1, x.size, x.nbytes)
        return arrays.array_module(x).array(x, copy=True)
    shape, dt, dev = _bcast_meta(comm, x, root)
    dt = numpy.dtype(dt)
    n = int(numpy.prod(shape, dtype=numpy.int64))
    stats.add("bcast", comm.Get_size(), n, n * dt.itemsize)
    like = x if comm.Get_rank() == root else _new((0,), dt, dev)
    buf = _to_mpi(x) if comm.Get_rank() == root else _empty(shape, dt, like)
    with _watchdog("bcast", comm, {"buffer": buf}):
        comm.Bcast(_spec(buf), root=root)
    return _from_mpi(buf, like)


def scatter(comm, blocks, shape, root=0):
    """Root's blocks[r] to rank r (Scatterv).  ``shape``: this rank's block shape."""
    me = comm.Get_rank()
    shape = tuple(shape)
    if comm.Get_size() == 1:
        meta = (blocks[0].dtype, arrays.is_device_array(blocks[0]))
    else:
        with _watchdog("scatter", comm, {"metadata from root": root}):
            meta = comm.bcast((numpy.dtype(blocks[0].dtype).str, arrays.is_device_array(blocks[0]))
                              if me == root else None, root=root)
    dt, dev = numpy.dtype(meta[0]), meta[1]
    n = int(numpy.prod(shape, dtype=numpy.int64))
    stats.add("scatter", comm.Get_size(), n, n * dt.itemsize)
    like = blocks[0] if me == root else _new((0,), dt, dev)
    if comm.Get_size() == 1:
        return arrays.array_module(like).array(blocks[0], copy=True).reshape(shape)
    recv = _empty(shape, dt, like)
    if me == root:
        xp = arrays.array_module(like)
        counts = [int(b.size) for b in blocks]
        send = _to_mpi(xp.concatenate([xp.ravel(b) for b in blocks]))
        with _watchdog("scatter", comm, {"send": blocks, "recv": recv}):
            comm.Scatterv(_spec(send, counts, _displs(counts)), _spec(recv), root=root)
    else:
        with _watchdog("scatter", comm, {"recv": recv}):
            comm.Scatterv(None, _spec(recv), root=root)
    return _from_mpi(recv, like)


def gather(comm, x, shapes, root=0):
    """Every rank's x to root (Gatherv): a list, block r of shape shapes[r], on root;
    None elsewhere."""
    me = comm.Get_rank()
    stats.add("gather", comm.Get_size(), x.size, x.nbytes)
    xp = arrays.array_module(x)
    if comm.Get_size() == 1:
        return [xp.array(x, copy=True).reshape(tuple(shapes[0]))]
    send = _to_mpi(x)
    counts = [int(numpy.prod(s, dtype=numpy.int64)) for s in shapes]
    if me != root:
        with _watchdog("gather", comm, {"send": send}):
            comm.Gatherv(_spec(send), None, root=root)
        return None
    recv = _empty(sum(counts), send.dtype, x)
    with _watchdog("gather", comm, {"send": send, "recv": recv}):
        comm.Gatherv(_spec(send), _spec(recv, counts, _displs(counts)), root=root)
    recv = _from_mpi(recv, x)
    d = _displs(counts)
    return [recv[d[r]:d[r] + counts[r]].reshape(tuple(shapes[r])) for r in range(len(shapes))]


def barrier(comm):
    """comm.Barrier() (not recorded)."""
    with _watchdog("barrier", comm, {"barrier": "no data"}):
        comm.Barrier()


def split(comm, color, key):
    """``comm.Split(color, key)`` under the deadline (collective; not recorded)."""
    with _watchdog("split", comm, {"color": color, "key": key}):
        return comm.Split(color, key)


# -- the job's layout (refconv.device, refconv info; not recorded) ----------------------
def node_comm(comm):
    """The ranks of ``comm`` that share this rank's node (a shared-memory split);
    its rank is the node-local rank.  The caller frees it."""
    with _watchdog("split", comm, {"split": "shared memory"}):
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node.Set_name("node")                   # for the watchdog's timeout line
    return node


def allgather_object(comm, obj):
    """Every rank's picklable ``obj``, as a list indexed by rank, on every rank."""
    with _watchdog("object", comm, {"allgather of": type(obj).__name__}):
        return comm.allgather(obj)


def library_version():
    """The MPI library's own version string (``MPI_Get_library_version``)."""
    return MPI.Get_library_version().strip()
