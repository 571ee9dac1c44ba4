"""The next batch's block, read ahead while this step trains: by a thread, or by a reader process.

::

    for x_b, y_b in prefetch.batches(x, y, B, distribution=d, rank=r, depth=1, seed=s, epoch=e, ...):
        x_loc = local_block(x_b, d, r)        # already read: the reader did it during the last step

The order is :func:`refconv.datasets.batches`' (a function of seed and epoch), unchanged.  The
reader reads into a pool of ``depth + 1`` blocks: one the step trains on, and ``depth`` read
ahead.  It reads the next block into a block of the pool that nothing refers to any more: the
block of the step before, once the first layer has let go of it at this step's forward (each
block goes out with a lease that gives it back when its last view dies, :class:`Pool`; the
reader sleeps until then).  So this rank holds at most ``depth + 1`` blocks of input, however
long the run.  A caller that keeps every block it was given (a list of batches) would leave
none free: when the step waits for a batch and none is free, that batch is read into a new
block, which the caller keeps.  ``depth=0``, or images in memory, read in the step as before.
An error of the reader (a NaN in a block, a file gone) is raised in the training thread at the
batch it belongs to.  The reader does no MPI.

Two readers (``reader=``, ``refconv train --prefetch-reader``):

``"thread"`` (:class:`Prefetcher`)
    a daemon thread of this process.  Its Python work (between the reads, and an image folder's
    decoding and normalising) takes Python's lock from the step now and then.
``"process"`` (:class:`ProcessPrefetcher`)
    a child forked at each epoch (Linux), which reads into blocks of memory shared with this
    process (anonymous ``MAP_SHARED`` mappings: nothing in ``/dev/shm``, so nothing can leak
    there).  It shares no lock with the step.  This process tells it which block of the pool to
    read the next batch into, through a pipe, the moment a lease dies; it answers with what it
    read (or the error) through another.  It ends when told to, when its batches run out, when
    a pipe closes, and with this process (``PR_SET_PDEATHSIG``).  It holds a second Python
    process's memory besides the blocks (the pages it writes of what it shares copy-on-write).
"""

import mmap
import multiprocessing
import os
import pickle
import queue
import struct
import sys
import threading
import time
import weakref

import numpy

from refconv import datasets, failure
from refconv.datastore.formats import Hdf5File, import_h5py
from refconv.datastore.images import StoreImages

__all__ = ["batches", "READERS", "Prefetcher", "ProcessPrefetcher", "Pool"]

READERS = ("thread", "process")
_END = object()
_RETIRED = {}     # (reader, local shape, dtype, depth) -> a weak reference to the pool of an epoch that has ended


def _retire(key, pool):
    """An epoch's prefetcher gave out its last batch: the next epoch's takes its pool over.  The
    first layer still holds a block of it; a new pool beside it would hold 2 blocks more at the
    start of every epoch (measured: 4.0 blocks across an epoch's end, before this)."""
    _RETIRED[key] = weakref.ref(pool)


def _adopt(key):
    """The pool of the epoch before (None: there was none, or nothing holds it any more)."""
    ref = _RETIRED.pop(key, None)
    return None if ref is None else ref()


def batches(x, y, batch_size, *, distribution, rank, depth=1, reader="thread", **order):
    """:func:`refconv.datasets.batches` (``order``: seed, epoch, drop_last, start, shuffle), with
    each batch's block of ``rank`` under ``distribution`` read ahead by ``reader`` (one of
    :data:`READERS`) when ``x`` is in a store."""
    if reader not in READERS:
        raise ValueError(f"prefetch reader: expected one of {', '.join(READERS)}; got {reader!r}")
    if reader == "process" and not sys.platform.startswith("linux"):
        raise ValueError(f"prefetch reader: process needs Linux (fork, PR_SET_PDEATHSIG), not {sys.platform}; "
                         f"use thread")
    it = datasets.batches(x, y, batch_size, **order)
    if not isinstance(x, StoreImages) or depth == 0:
        return it
    if reader == "process":
        return ProcessPrefetcher(it, distribution, rank, depth, x)
    return Prefetcher(it, distribution, rank, depth)


class Prefetcher:
    """Iterate ``(x_b, y_b)`` with ``x_b``'s block read ahead by a daemon thread (see the module)."""

    def __init__(self, batches, distribution, rank, depth):
        self._queue = queue.Queue()                  # at most depth items: each holds a block of the pool
        self._stop = threading.Event()
        # the step waits for a batch the thread has not put yet: more asked for than put.  (A flag set
        # around the step's get would still be set just after the get, when the queue is empty and the
        # step holds every block, and the thread would make a block nobody waits for.)
        self._asked, self._put = 0, [0]
        starving = lambda: self._asked > self._put[0]  # noqa: E731
        self._key = ("thread", tuple(distribution.local_shape(rank)), None, depth)
        self.pool = _adopt(self._key) or Pool(depth + 1, distribution.local_shape(rank), starving, self._stop)
        self.pool.starving, self.pool.stop = starving, self._stop
        self.read_cpu_s, self.read_s = [], []        # per block: the thread's CPU seconds, and wall seconds
        self.waited_s = []                           # per batch: seconds the step waited for it
        self._thread = threading.Thread(target=_read, name="refconv-prefetch", daemon=True,
                                        args=(batches, distribution, rank, self._queue, self._put, self.pool,
                                              self._stop, self.read_cpu_s, self.read_s))
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        self._asked += 1
        self.pool.wake.set()                         # every block held? then the thread makes one
        start = time.perf_counter()
        item = self._queue.get()
        self.waited_s.append(time.perf_counter() - start)
        if item is _END:
            _retire(self._key, self.pool)
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self):
        """Stop reading ahead (a run that stops early: ``--max-steps``)."""
        self._stop.set()

    def __del__(self):
        self._stop.set()


class Pool:
    """``size`` blocks of ``shape`` to read into, each handed out again once nothing refers to it.

    A block goes out as an array whose memory belongs to a :class:`_Lease` (NumPy keeps that
    object as the ``base`` of every view taken of it), so the lease dies when the last view
    does: the step's, the first layer's saved input, any reshape of them.  Its death gives the
    block back and wakes the thread, which otherwise sleeps."""

    def __init__(self, size, shape, starving, stop):
        self.blocks = [None] * size                  # each (n_loc, C_loc, H_loc, W_loc), or None
        self.leased = [False] * size
        self.shape, self.starving, self.stop = tuple(shape), starving, stop
        self.wake = threading.Event()                # a block given back, or the step asks for a batch

    def free(self, dtype):
        """A block nobody holds, as a new lease (None once stopped); a new block when the step
        waits for a batch and every block is held (a caller that keeps them all)."""
        while not self.stop.is_set():
            self.wake.clear()                        # before looking: a give-back from now on wakes us
            for k in range(len(self.blocks)):
                if self.blocks[k] is None or self.blocks[k].dtype != dtype:
                    self.blocks[k] = numpy.empty(self.shape, dtype)
                    return self._lease(k)
                if not self.leased[k]:
                    return self._lease(k)
            if self.starving():
                self.blocks[0] = numpy.empty(self.shape, dtype)      # the caller keeps the old one
                return self._lease(0)
            self.wake.wait(0.1)
        return None

    def _lease(self, k):
        self.leased[k] = True
        return numpy.asarray(_Lease(self, k, self.blocks[k]))

    def give_back(self, k, block):
        if self.blocks[k] is block:                  # not a block the pool has since replaced
            self.leased[k] = False
            self.wake.set()


class _Lease:
    """Owns a block's memory for NumPy (``__array_interface__``); gives the block back when it dies."""

    def __init__(self, pool, k, block):
        self.pool, self.k, self.block = pool, k, block
        self.__array_interface__ = block.__array_interface__

    def __del__(self):
        self.pool.give_back(self.k, self.block)


def _read(batches, distribution, rank, out, put, pool, stop, cpu, wall):
    """The thread: read each batch's block into a free block of the pool; end with _END or the error.
    ``put[0]`` counts the batches it has put in ``out``."""
    try:
        for x_b, y_b in batches:
            block = pool.free(x_b.dtype) if tuple(distribution.local_shape(rank)) == pool.shape else None
            if stop.is_set():
                return
            start, t0 = time.thread_time(), time.perf_counter()
            x_b.read_ahead(distribution, rank, block)
            cpu.append(time.thread_time() - start)
            wall.append(time.perf_counter() - t0)
            put[0] += 1
            out.put((x_b, y_b))
        put[0] += 1
        out.put(_END)
    except BaseException as exc:                     # handed to the training thread, raised there
        put[0] += 1
        out.put(exc)


# -- the reader process ------------------------------------------------------------------------------
_SKIP, _STOP = -1, -2             # commands besides a block's number: this process reads the batch itself; end
_COMMAND = struct.Struct("i")     # 4 bytes, which a pipe takes in one piece (at most PIPE_BUF)


class ProcessPrefetcher:
    """Iterate ``(x_b, y_b)`` with ``x_b``'s block read ahead by a forked reader process (see the module).

    This process iterates its own copy of ``batches`` (the order is a function of seed and
    epoch), and the child its copy, forked before either began.  For each batch in turn this
    process writes one command to the child: the number of a free block of the pool (the child
    reads the batch into it and answers), or ``_SKIP``."""

    def __init__(self, batches, distribution, rank, depth, x):
        shape = tuple(distribution.local_shape(rank))
        size = int(numpy.prod(shape))
        self._key, self._successor = ("process", shape, x.dtype.str, depth), None
        before = _adopt(self._key)                   # the epoch before's blocks, mapped before this fork too
        if before is not None:
            self.blocks, self._leased, before._successor = before.blocks, before._leased, self
        else:
            self.blocks = [numpy.frombuffer(mmap.mmap(-1, max(1, size * x.dtype.itemsize)), x.dtype, size)
                           .reshape(shape) for _ in range(depth + 1)]  # each (n_loc, C_loc, H_loc, W_loc)
            self._leased = set()                     # blocks a lease holds
        self.distribution, self.rank, self._batches = distribution, rank, batches
        self.read_cpu_s, self.read_s = [], []        # per block: the child's CPU seconds, and wall seconds
        self.waited_s = []                           # per batch: seconds the step waited for it
        self._free = [k for k in range(depth + 1) if k not in self._leased]   # nobody holds; the child not told
        self._granted = self._taken = 0              # batches the child was told about; batches handed out
        self._closed = False
        context = multiprocessing.get_context("fork")
        self._answers, answers_out = context.Pipe(duplex=False)
        commands_in, self._commands = os.pipe()
        self.process = context.Process(target=_serve, name="refconv-prefetch", daemon=True,
                                       args=(batches, distribution, rank, self.blocks, x.store, commands_in,
                                             answers_out, (self._commands, self._answers)))
        self.process.start()
        os.close(commands_in)                        # so that the child's end alone keeps the pipes open
        answers_out.close()
        self._grant()

    def __iter__(self):
        return self

    def __next__(self):
        try:
            x_b, y_b = next(self._batches)
        except StopIteration:
            self.close()
            _retire(self._key, self)
            raise
        self._taken += 1
        start = time.perf_counter()
        if self._granted < self._taken:              # every block is held by the caller: read this one here
            self._granted += 1
            self._command(_SKIP)
            x_b.read_ahead(self.distribution, self.rank)
            self.waited_s.append(time.perf_counter() - start)
            return x_b, y_b
        answer = self._answer()
        self.waited_s.append(time.perf_counter() - start)
        if isinstance(answer, BaseException):
            self.close()
            raise answer
        k, nbytes, cpu, wall = answer
        x_b.store.bytes_read += nbytes               # counted in the child; this process's count stays whole
        self.read_cpu_s.append(cpu)
        self.read_s.append(wall)
        self._leased.add(k)
        x_b.hold(self.distribution, self.rank, numpy.asarray(_Lease(self, k, self.blocks[k])))
        return x_b, y_b

    def give_back(self, k, block):
        """A lease died (the last view of block ``k``): the child reads the next batch into it, now
        (the next epoch's child, once this epoch's prefetcher has handed its blocks on)."""
        if self._successor is not None:
            self._successor.give_back(k, block)
            return
        self._leased.discard(k)
        self._free.append(k)
        self._grant()

    def _grant(self):
        while self._free and not self._closed:
            self._granted += 1
            self._command(self._free.pop())

    def _command(self, command):
        """One command to the child: a single write, so that a lease's __del__ may send one at any time."""
        try:
            os.write(self._commands, _COMMAND.pack(command))
        except OSError:                              # the child has ended: its batches ran out, or it failed
            pass

    def _answer(self):
        """The child's answer for the next batch it was told to read, or the error that ended it (no hang)."""
        try:
            while not self._answers.poll(0.1):
                if not self.process.is_alive() and not self._answers.poll():
                    break
            else:
                return pickle.loads(self._answers.recv_bytes())
        except EOFError:
            pass
        return RuntimeError(f"prefetch: the reader process ended (exit code {self.process.exitcode}) before it read "
                            f"the next block; see its error above, or use --prefetch-reader thread")

    def close(self):
        """Stop the reader process and wait for it to end (a run that stops early, an error, the end)."""
        if self._closed:
            return
        self._closed = True
        self._command(_STOP)
        os.close(self._commands)
        self._answers.close()
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)

    def __del__(self):
        if not getattr(self, "_closed", True):
            self.close()


def _serve(batches, distribution, rank, blocks, store, commands, answers, parent_ends):
    """The reader process: for each batch, the command; read the batch's block into the block of
    the pool it names and answer ``(k, bytes read, CPU s, wall s)``, or answer the error and end."""
    os.close(parent_ends[0])                         # this process's ends: a pipe it closes is then closed
    parent_ends[1].close()
    failure.die_with_launcher()                      # prctl: the kernel ends this child with its rank
    if isinstance(store, Hdf5File):                  # HDF5's state in the rank is not the child's to use
        store.inherited, store.file = store.file, import_h5py().File(store.path, "r")
        store.x = store.file["x"]
    try:
        for x_b, _ in batches:
            command = os.read(commands, _COMMAND.size)
            k = _COMMAND.unpack(command)[0] if len(command) == _COMMAND.size else _STOP
            if k == _STOP:
                return
            if k == _SKIP:
                continue
            before, cpu, wall = store.bytes_read, time.process_time(), time.perf_counter()
            try:
                x_b.block(distribution, rank, blocks[k])
            except BaseException as exc:             # raised in the rank at this batch
                answers.send_bytes(_pickled(exc))
                return
            answers.send_bytes(_pickled((k, store.bytes_read - before, time.process_time() - cpu,
                                         time.perf_counter() - wall)))
    except OSError:                                  # the rank closed the pipes (it ended, or stopped early)
        return


def _pickled(answer):
    """An answer as bytes for the pipe; an error that does not pickle, as its one line."""
    try:
        return pickle.dumps(answer)
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(answer).__name__}: {answer}"))
