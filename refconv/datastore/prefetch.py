"""The next batch's block, read in a background thread while this step trains.

::

    for x_b, y_b in prefetch.batches(x, y, B, distribution=d, rank=r, depth=1, seed=s, epoch=e, ...):
        x_loc = local_block(x_b, d, r)        # already read: the thread did it during the last step

The order is :func:`refconv.datasets.batches`' (a function of seed and epoch), unchanged.  The
thread reads at most ``depth`` blocks ahead of the step (a semaphore of ``depth`` slots: a slot
is taken before a block is read and given back when the step takes it), so this rank holds at
most ``depth + 2`` blocks: ``depth`` ahead, the one the step trains on, and the one before it
until the first layer lets go of it.  ``depth=0``, or images in memory, read in the step as before.
An error in the thread (a NaN in a block, a file gone) is raised in the training thread at the
batch it belongs to.  The thread does no MPI.
"""

import queue
import threading

from refconv import datasets
from refconv.datastore.images import StoreImages

__all__ = ["batches", "Prefetcher"]

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
        self._queue = queue.Queue()                  # bounded by the slots: at most depth + 1 items
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_read, name="refconv-prefetch", daemon=True,
                                        args=(batches, distribution, rank, self._queue, self._slots, self._stop))
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._slots.release()
        return item

    def close(self):
        """Stop reading ahead (a run that stops early: ``--max-steps``)."""
        self._stop.set()

    def __del__(self):
        self._stop.set()


def _read(batches, distribution, rank, out, slots, stop):
    """The thread: read each batch's block once a slot is free; end with _END or the error."""
    try:
        for x_b, y_b in batches:
            while not slots.acquire(timeout=0.1):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            out.put((x_b.read_ahead(distribution, rank), y_b))
        out.put(_END)
    except BaseException as exc:                     # handed to the training thread, raised there
        out.put(exc)
