"""The operations: every MPI data movement in refconv, one implementation each.

Arrays may be NumPy or CuPy; results have the array module of the inputs.  Every
call is recorded in ``stats`` before MPI is called, and runs under the deadline
(``guard``); buffers are staged through the host unless MPI is CUDA-aware
(``refconv.collectives.staging``).

=====================  ===========================  =========================================
function               MPI call                     ``stats`` bytes recorded (per rank)
=====================  ===========================  =========================================
``allreduce``          Allreduce                    the full buffer
``reduce_scatter``     Alltoallw, then a local sum  the full input buffer (all ranks' blocks); the sum runs
                                                    where x lives (on the device for a device x)
``allgather``          Allgather or Alltoallw       the full output buffer
``exchange``           Isend/Irecv                  bytes sent to other ranks      [kind "halo"]
``iallreduce_``        Iallreduce (in place)        the full buffer
``ireduce_scatter``    Ialltoallw, then a local sum as ``reduce_scatter``
``iallgather``         Iallgather or Ialltoallw     as ``allgather``
``iexchange``          Isend/Irecv                  as ``exchange``                [kind "halo"]
``alltoallv``          Alltoallv                    bytes sent to other ranks (not self)
``bcast``              Bcast                        the buffer
``scatter``            Scatterv                     the block this rank receives
``gather``             Gatherv                      the block this rank contributes
=====================  ===========================  =========================================

``elements`` is bytes / itemsize.  ``messages`` counts the sends to other ranks of
``exchange`` (every one) and ``alltoallv`` (the non-empty ones); it is 0 for the rest.
The figures are buffer sizes by definition, not wire traffic: a size-1 communicator
records the same figures (with ``comm_size=1``) and makes no MPI call.

The ``i...`` forms start the call and return a ``Request`` (refconv.collectives.requests); its ``wait()``
finishes it and returns the result, under the deadline (``guard`` brackets the wait,
and ``stats`` counts the seconds waited).  They are recorded when started, with
``overlap``: what the caller computes before it waits (``""``: nothing, a blocking
call).  ``reduce_scatter``, ``allgather`` and ``exchange`` are their ``i...`` form
waited for at once, so each operation has one implementation and an overlapped call
moves exactly what its blocking form moves.  ``requests.progress`` tests every call in
flight: MPICH progresses a nonblocking call only inside MPI calls unless
``MPICH_ASYNC_PROGRESS=1`` (docs/parallel.md, "Overlap").

``reduce_scatter`` and ``allgather`` split one axis; an MPI datatype per rank
walks its block in place (``staging.block_types``), so no block is packed.
MPICH refuses ``MPI.SUM`` over a derived datatype, so ``reduce_scatter`` sends
every other rank q its part of block q (an all-to-all of the same volume as a
pairwise reduce-scatter) and adds the parts it receives to its own.  Below
about 1 MiB packing was faster by 20-60 us a call; from 4 MiB these are 1.2-5x
faster than packing (docs/benchmarks.md, "One implementation per operation").  Both return a new array also on
one rank, where the block is x itself: callers keep results (Stationary-Y keeps
the gathered x for its backward) and write into them (``add_bias``), and a view
of x would make either depend on the communicator's size.
"""

import math
import numbers

import numpy
from mpi4py import MPI

from refconv import arrays
from refconv.checks import ArgumentError
from refconv.collectives.local import check_comm, stats
from refconv.collectives.requests import Request, finished
from refconv.collectives.staging import (block_types, cuda_aware, displs, empty, from_mpi, new, spec,
                                         split_axis, to_mpi, where)
from refconv.collectives.watchdog import guard
from refconv.shapes.memory import kind

comm_buffers = kind("comm")  # the arrays an operation stages and receives count as communication (shapes-only runs)
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


def _op(comm, op, what):
    """The MPI op of ``op`` ("sum", "prod", "max" or "min"); another is an ArgumentError naming it and the rank,
    raised before any MPI call."""
    found = _OPS.get(op) if isinstance(op, str) else None
    if found is None:
        raise ArgumentError(f"{what} on rank {comm.Get_rank()}: op must be one of {tuple(_OPS)}, got {op!r}")
    return found


def _check_counts(comm, counts, length, what):
    counts = [int(c) for c in counts]
    if len(counts) != comm.Get_size():
        raise ValueError(f"{what}: counts has {len(counts)} entries but the communicator "
                         f"has {comm.Get_size()} ranks")
    if any(c < 0 for c in counts) or sum(counts) != length:
        raise ValueError(f"{what}: counts {counts} must be >= 0 and sum to {length}")
    return counts


def _check_axis(x, axis, what):
    """``axis`` of x as a non-negative index (-1 is the last): ``split_axis`` counts the
    dims before and after it, which a negative axis would miscount."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{what}: axis must be an int in [-{x.ndim}, {x.ndim}) for x of shape "
                         f"{tuple(x.shape)}, got {axis!r}")
    return int(axis) % x.ndim


@comm_buffers
def allreduce(comm, x, op="sum", *, out=None):
    """The elementwise ``op`` ("sum", "prod", "max", "min") of every rank's x.

    The result is a new array, or ``out`` (same shape and dtype, contiguous) when given:
    reusing a buffer saves the allocation, which matters for large ones.
    """
    check_comm(comm, "allreduce")
    mpi_op = _op(comm, op, "allreduce")
    stats.add("allreduce", comm.Get_size(), x.size, x.nbytes)
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype):
        raise ValueError(f"allreduce: out must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if comm.Get_size() == 1:
        if out is None:
            return arrays.array_module(x).array(x, copy=True)
        out[...] = x
        return out
    send = to_mpi(x)
    direct = out is not None and out.flags.c_contiguous and \
        (not arrays.is_device_array(out) or cuda_aware())
    recv = out if direct else empty(send.shape, send.dtype, x)
    with guard("allreduce", comm, {"send": send, "recv": recv}, call="Allreduce", nbytes=send.nbytes):
        comm.Allreduce(spec(send), spec(recv), op=mpi_op)
    result = from_mpi(recv, x)
    if out is not None and not direct:
        out[...] = result
        return out
    return result


@comm_buffers
def allreduce_(comm, x, op="sum"):
    """In-place allreduce (MPI.IN_PLACE, no new buffer) of a contiguous array; returns x."""
    check_comm(comm, "allreduce_")
    mpi_op = _op(comm, op, "allreduce_")
    if comm.Get_size() == 1:  # the sum of one rank's x is x: record the call, copy nothing
        stats.add("allreduce", 1, x.size, x.nbytes)
        return x
    if not x.flags.c_contiguous or (arrays.is_device_array(x) and not cuda_aware()):
        x[...] = allreduce(comm, x, op)            # records the call itself
        return x
    stats.add("allreduce", comm.Get_size(), x.size, x.nbytes)
    if arrays.is_device_array(x):
        arrays.synchronize()
    with guard("allreduce", comm, {"in place": x}, call="Allreduce", nbytes=x.nbytes):
        comm.Allreduce(MPI.IN_PLACE, x, op=mpi_op)
    return x


@comm_buffers
def iallreduce_(comm, x, op="sum", *, overlap=""):
    """Start the in-place allreduce of x; ``wait()`` returns x, summed (``op``) over the ranks.

    x must stay untouched until then.  A buffer MPI cannot take in place (not contiguous, or
    on the device without a CUDA-aware MPI) is reduced in a contiguous host copy, written
    back into x by ``wait()``.
    """
    check_comm(comm, "iallreduce_")
    mpi_op = _op(comm, op, "iallreduce_")
    stats.add("allreduce", comm.Get_size(), x.size, x.nbytes, overlap=overlap)
    if comm.Get_size() == 1:   # the sum of one rank's x is x
        return finished(x)
    buf = to_mpi(x)            # x itself when MPI can take it, else a contiguous host copy
    if buf is x and arrays.is_device_array(x):
        arrays.synchronize()

    def finish():
        if buf is not x:
            x[...] = from_mpi(buf, x)
        return x
    request = comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op)
    return Request("allreduce", comm, [request], finish, {"in place": x}, overlap, call="Iallreduce", nbytes=x.nbytes)


@comm_buffers
def reduce_scatter(comm, x, counts, axis=0):
    """Sum x (the full buffer) over ranks; return this rank's block along ``axis``.

    counts[i] is the length along ``axis`` of rank i's block; blocks are consecutive.
    """
    return ireduce_scatter(comm, x, counts, axis).wait()


@comm_buffers
def ireduce_scatter(comm, x, counts, axis=0, *, overlap=""):
    """Start :func:`reduce_scatter`; ``wait()`` returns this rank's summed block.  x must stay
    untouched until then."""
    check_comm(comm, "ireduce_scatter")
    axis = _check_axis(x, axis, "reduce_scatter")
    counts = _check_counts(comm, counts, x.shape[axis], "reduce_scatter")
    stats.add("reduce_scatter", comm.Get_size(), x.size, x.nbytes, overlap=overlap)
    if comm.Get_size() == 1:
        return finished(arrays.array_module(x).array(x, copy=True))
    size, me = comm.Get_size(), comm.Get_rank()
    outer, length, inner = split_axis(x.shape, axis)
    start, item = displs(counts)[me], x.itemsize
    send = to_mpi(x)                                        # (outer, L, inner)
    own = send.reshape(outer, length, inner)[:, start:start + counts[me]]  # this rank's part of its block
    theirs = empty((size - 1, outer, counts[me], inner), send.dtype, x)    # the other ranks' parts, in rank order
    block = theirs[0].nbytes
    request = comm.Ialltoallw([send, ([int(q != me) for q in range(size)], [d * inner * item for d in displs(counts)]),
                               block_types(send.dtype, outer, counts, inner, length * inner)],
                              [theirs, ([block * (q != me) for q in range(size)],
                                        [block * (q - (q > me)) for q in range(size)]), [MPI.BYTE] * size])

    def finish():
        # the sum where x lives: staged parts go back to x's device first (from_mpi), and this rank's
        # part is taken from x itself, so a device x is summed on the device, in the same order
        parts = from_mpi(theirs, x)                         # (size - 1, outer, L_me, inner)
        mine = own if parts is theirs else \
            arrays.array_module(x).ascontiguousarray(x).reshape(outer, length, inner)[:, start:start + counts[me]]
        summed = mine + parts[0]                            # (outer, L_me, inner), a new array
        for part in parts[1:]:
            summed += part
        return summed.reshape(x.shape[:axis] + (counts[me],) + x.shape[axis + 1:])
    return Request("reduce_scatter", comm, [request], finish, {"x": x, "axis": axis, "counts": counts}, overlap,
                   call="Ialltoallw", nbytes=x.nbytes)


@comm_buffers
def allgather(comm, x, counts, axis=0):
    """Concatenate every rank's x along ``axis``; counts[i] = rank i's length there."""
    return iallgather(comm, x, counts, axis).wait()


@comm_buffers
def iallgather(comm, x, counts, axis=0, *, overlap=""):
    """Start :func:`allgather`; ``wait()`` returns the concatenation."""
    check_comm(comm, "iallgather")
    axis = _check_axis(x, axis, "allgather")
    total = sum(int(c) for c in counts)
    counts = _check_counts(comm, counts, total, "allgather")
    me, size = comm.Get_rank(), comm.Get_size()
    if x.shape[axis] != counts[me]:
        raise ValueError(f"allgather: x has length {x.shape[axis]} along axis {axis} "
                         f"but counts[{me}] = {counts[me]}")
    outer, _, inner = split_axis(x.shape, axis)
    stats.add("allgather", size, total * outer * inner, total * outer * inner * x.itemsize, overlap=overlap)
    if size == 1:
        return finished(arrays.array_module(x).array(x, copy=True))
    send = to_mpi(x)                                        # (outer, L_me, inner)
    recv = empty(x.shape[:axis] + (total,) + x.shape[axis + 1:], send.dtype, x)  # (outer, L, inner)
    blocks = block_types(send.dtype, outer, counts, inner, total * inner)
    if len(set(counts)) == 1:               # one receive datatype for all: MPI's allgather
        request = comm.Iallgather([send, send.nbytes, MPI.BYTE], [recv, 1, blocks[0]])
    else:                                   # one per sender: an all-to-all that sends everyone x
        item = send.dtype.itemsize
        request = comm.Ialltoallw([send, ([send.nbytes] * size, [0] * size), [MPI.BYTE] * size],
                                  [recv, ([1] * size, [d * inner * item for d in displs(counts)]), blocks])
    return Request("allgather", comm, [request], lambda: from_mpi(recv, x), {"x": x, "axis": axis, "counts": counts},
                   overlap, call="Iallgather" if len(set(counts)) == 1 else "Ialltoallw", nbytes=recv.nbytes)


@comm_buffers
def exchange(comm, sends, recv_shapes, dtype, *, tag=0, like=None):
    """Many point-to-point messages at once (halos reaching past the nearest neighbour).

    sends: {dest rank: array}; recv_shapes: {source rank: shape}.  Returns
    {source rank: array}.  A message to oneself is copied without MPI.
    """
    return iexchange(comm, sends, recv_shapes, dtype, tag=tag, like=like).wait()


@comm_buffers
def iexchange(comm, sends, recv_shapes, dtype, *, tag=0, like=None, overlap=""):
    """Start :func:`exchange`; ``wait()`` returns {source rank: array}.  The arrays sent may be
    changed once this returns (they are copied, or staged, when not contiguous in ``dtype``;
    contiguous ones are sent in place and must stay untouched until ``wait()``)."""
    check_comm(comm, "iexchange")
    dtype = numpy.dtype(dtype)
    me = comm.Get_rank()
    if like is None and sends:
        like = next(iter(sends.values()))
    nsent = sum(int(a.size) for r, a in sends.items() if r != me)
    stats.add("halo", comm.Get_size(), nsent, nsent * dtype.itemsize, sum(r != me for r in sends), overlap=overlap)
    requests, staged, keep = [], {}, []
    for src, shape in sorted(recv_shapes.items()):
        if src != me:
            staged[src] = empty(tuple(shape), dtype, like)
            requests.append(comm.Irecv(spec(staged[src]), src, tag))
    for dest, a in sorted(sends.items()):
        if dest != me:
            keep.append(to_mpi(a.astype(dtype, copy=False)))  # alive until Waitall
            requests.append(comm.Isend(spec(keep[-1]), dest, tag))
    own = None
    if me in recv_shapes:
        xp = arrays.array_module(sends[me])
        own = xp.array(sends[me], dtype=dtype, copy=True).reshape(tuple(recv_shapes[me]))

    def finish():
        keep.clear()
        out = {src: from_mpi(buf, like) for src, buf in staged.items()}
        if own is not None:
            out[me] = own
        return out
    peers = (tag, tuple((dest, int(sends[dest].size) * dtype.itemsize) for dest in sorted(sends) if dest != me),
             tuple((src, buf.nbytes) for src, buf in staged.items()))    # for the record: paired by peer and tag
    return Request("halo", comm, requests, finish, {"send": sends, "recv": staged}, overlap, call="Isend/Irecv",
                   peers=peers)


@comm_buffers
def alltoallv(comm, send_blocks, recv_shapes, dtype=None):
    """Uneven all-to-all: send_blocks[q] goes to rank q; returns the list of
    blocks received, block r from rank r with shape recv_shapes[r].

    At scale most blocks are empty (a shuffle between grids sends to a few of K ranks): an
    empty block costs its count and nothing else (it is not packed, and the blocks returned
    for empty receives are one empty array per shape)."""
    check_comm(comm, "alltoallv")
    size, me = comm.Get_size(), comm.Get_rank()
    if len(send_blocks) != size or len(recv_shapes) != size:
        raise ValueError(f"alltoallv: need one send block and one recv shape per rank ({size}); "
                         f"got {len(send_blocks)} and {len(recv_shapes)}")
    like = send_blocks[0]
    xp = arrays.array_module(like)
    dtype = numpy.dtype(dtype if dtype is not None else like.dtype)
    scounts = [int(b.size) for b in send_blocks]
    nsent = sum(scounts) - scounts[me]
    stats.add("alltoallv", size, nsent, nsent * dtype.itemsize, sum(1 for c in scounts if c) - (scounts[me] > 0))
    rcounts = [int(math.prod(s)) for s in recv_shapes]
    if size == 1:
        return [xp.array(send_blocks[0], dtype=dtype, copy=True).reshape(tuple(recv_shapes[0]))]
    packed = [xp.ravel(b).astype(dtype, copy=False) for b, c in zip(send_blocks, scounts) if c]
    send = to_mpi(xp.concatenate(packed)) if packed else empty(0, dtype, like)
    recv = empty(sum(rcounts), dtype, like)
    with guard("alltoallv", comm, {"send": send_blocks, "recv": recv_shapes}, call="Alltoallv"):
        comm.Alltoallv(spec(send, scounts, displs(scounts)), spec(recv, rcounts, displs(rcounts)))
    recv, d, empties, out = from_mpi(recv, like), displs(rcounts), {}, []
    for r, (n, shape) in enumerate(zip(rcounts, recv_shapes)):
        shape = tuple(shape)
        if n:
            out.append(recv[d[r]:d[r] + n].reshape(shape))
        else:
            if shape not in empties:
                empties[shape] = recv[:0].reshape(shape)
            out.append(empties[shape])
    return out


@comm_buffers
def bcast(comm, x, root=0):
    """Root's x on every rank.  Non-roots pass None: shape, dtype and array module
    come from root in a small pickled message (not recorded)."""
    check_comm(comm, "bcast")
    if comm.Get_size() == 1:
        stats.add("bcast", 1, x.size, x.nbytes)
        return arrays.array_module(x).array(x, copy=True)
    me = comm.Get_rank()
    with guard("bcast", comm, {"metadata from root": root}, call="bcast", root=root):
        shape, dt, dev = comm.bcast((tuple(x.shape), numpy.dtype(x.dtype).str, where(x))
                                    if me == root else None, root=root)
    dt = numpy.dtype(dt)
    n = int(numpy.prod(shape, dtype=numpy.int64))
    stats.add("bcast", comm.Get_size(), n, n * dt.itemsize)
    like = x if me == root else new((0,), dt, dev)
    buf = to_mpi(x) if me == root else empty(shape, dt, like)
    with guard("bcast", comm, {"buffer": buf}, call="Bcast", nbytes=buf.nbytes, root=root):
        comm.Bcast(spec(buf), root=root)
    return from_mpi(buf, like)


@comm_buffers
def scatter(comm, blocks, shape, root=0):
    """Root's blocks[r] to rank r (Scatterv).  ``shape``: this rank's block shape."""
    check_comm(comm, "scatter")
    me, shape = comm.Get_rank(), tuple(shape)
    if comm.Get_size() == 1:
        meta = (blocks[0].dtype, where(blocks[0]))
    else:
        with guard("scatter", comm, {"metadata from root": root}, call="bcast", root=root):
            meta = comm.bcast((numpy.dtype(blocks[0].dtype).str, where(blocks[0]))
                              if me == root else None, root=root)
    dt, dev = numpy.dtype(meta[0]), meta[1]
    n = int(numpy.prod(shape, dtype=numpy.int64))
    stats.add("scatter", comm.Get_size(), n, n * dt.itemsize)
    like = blocks[0] if me == root else new((0,), dt, dev)
    if comm.Get_size() == 1:
        return arrays.array_module(like).array(blocks[0], copy=True).reshape(shape)
    recv = empty(shape, dt, like)
    if me == root:
        xp = arrays.array_module(like)
        counts = [int(b.size) for b in blocks]
        send = to_mpi(xp.concatenate([xp.ravel(b) for b in blocks]))
        with guard("scatter", comm, {"send": blocks, "recv": recv}, call="Scatterv", root=root):
            comm.Scatterv(spec(send, counts, displs(counts)), spec(recv), root=root)
    else:
        with guard("scatter", comm, {"recv": recv}, call="Scatterv", root=root):
            comm.Scatterv(None, spec(recv), root=root)
    return from_mpi(recv, like)


@comm_buffers
def gather(comm, x, shapes, root=0):
    """Every rank's x to root (Gatherv): a list, block r of shape shapes[r], on root;
    None elsewhere."""
    check_comm(comm, "gather")
    stats.add("gather", comm.Get_size(), x.size, x.nbytes)
    if comm.Get_size() == 1:
        return [arrays.array_module(x).array(x, copy=True).reshape(tuple(shapes[0]))]
    send = to_mpi(x)
    counts = [int(numpy.prod(s, dtype=numpy.int64)) for s in shapes]
    if comm.Get_rank() != root:
        with guard("gather", comm, {"send": send}, call="Gatherv", root=root):
            comm.Gatherv(spec(send), None, root=root)
        return None
    recv = empty(sum(counts), send.dtype, x)
    with guard("gather", comm, {"send": send, "recv": recv}, call="Gatherv", root=root):
        comm.Gatherv(spec(send), spec(recv, counts, displs(counts)), root=root)
    recv, d = from_mpi(recv, x), displs(counts)
    return [recv[d[r]:d[r] + counts[r]].reshape(tuple(shapes[r])) for r in range(len(shapes))]
