"""The next batch's block, read in a background thread while this step trains.

::

    for x_b, y_b in prefetch.batches(x, y, B, distribution=d, rank=r, depth=1, seed=s, epoch=e, ...):
        x_loc = local_block(x_b, d, r)        # already read: the thread did it during the last step

The order is :func:`refconv.datasets.batches`' (a function of seed and epoch), unchanged.  The
thread reads into a pool of ``depth + 1`` blocks: one the step trains on, and ``depth`` read
ahead.  It reads the next block into a block of the pool that nothing refers to any more: the
block of the step before, once the first layer has let go of it at this step's forward (each
block goes out with a lease that gives it back when its last view dies, :class:`Pool`; the
thread sleeps until then).  So this rank holds at most ``depth + 1`` blocks of input, however
long the run.  A caller that keeps every block it was given (a list of batches) would leave
none free: when the step waits for a batch and none is free, the thread reads into a new block,
which the pool takes in place of one the caller keeps.  ``depth=0``, or images in memory, read
in the step as before.  An error in the thread (a NaN in a block, a file gone) is raised in the
training thread at the batch it belongs to.  The thread does no MPI.
"""

import queue
import threading
import time

import numpy

from refconv import datasets
from refconv.datastore.images import StoreImages

__all__ = ["batches", "Prefetcher", "Pool"]

_END = object()


def batches(x, y, batch_size, *, distribution, rank, depth=1, **order):
    """:func:`refconv.datasets.batches` (``order``: seed, epoch, drop_last, start, shuffle), with
    each batch's block of ``rank`` under ``distribution`` read ahead when ``x`` is in a store."""
    it = datasets.batches(x, y, batch_size, **order)
    if not isinstance(x, StoreImages) or depth == 0:
        return it
    return Prefetcher(it, distribution, rank, depth)


class Prefetcher:
    """Iterate ``(x_b, y_b)`` with ``x_b``'s block read ahead by a daemon thread (see the module)."""

    def __init__(self, batches, distribution, rank, depth):
        self._queue = queue.Queue()                  # at most depth items: each holds a block of the pool
        self._stop = threading.Event()
        self._wanted = threading.Event()             # the step waits for a batch
        starving = lambda: self._wanted.is_set() and self._queue.empty()  # noqa: E731
        self.pool = Pool(depth + 1, distribution.local_shape(rank), starving, self._stop)
        self.read_cpu_s, self.read_s = [], []        # per block: the thread's CPU seconds, and wall seconds
        self.waited_s = []                           # per batch: seconds the step waited for it
        self._thread = threading.Thread(target=_read, name="refconv-prefetch", daemon=True,
                                        args=(batches, distribution, rank, self._queue, self.pool, self._stop,
                                              self.read_cpu_s, self.read_s))
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        self._wanted.set()
        self.pool.wake.set()                         # every block held? then the thread makes one
        start = time.perf_counter()
        item = self._queue.get()
        self.waited_s.append(time.perf_counter() - start)
        self._wanted.clear()
        if item is _END:
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


def _read(batches, distribution, rank, out, pool, stop, cpu, wall):
    """The thread: read each batch's block into a free block of the pool; end with _END or the error."""
    try:
        for x_b, y_b in batches:
            block = pool.free(x_b.dtype) if tuple(distribution.local_shape(rank)) == pool.shape else None
            if stop.is_set():
                return
            start, t0 = time.thread_time(), time.perf_counter()
            x_b.read_ahead(distribution, rank, block)
            cpu.append(time.thread_time() - start)
            wall.append(time.perf_counter() - t0)
            out.put((x_b, y_b))
        out.put(_END)
    except BaseException as exc:                     # handed to the training thread, raised there
        out.put(exc)
