"""Gradient buckets (PyTorch DDP's idea): consecutive gradients on one communicator packed
into one allreduce, up to a size threshold.

A model's backward makes its weight-gradient allreduces one layer after another.  Many are
small (a bias, a 3x3 convolution of few channels), and each pays the latency of a call;
packing them into one buffer pays it once.  :func:`plan` decides the buckets from the
gradients in the order backward makes them ready, ``(key, comm, nbytes, dtype)`` each: a
bucket takes consecutive gradients of one communicator and dtype, and is closed as soon as
it holds ``threshold`` bytes or more (threshold 0: every gradient its own bucket, each
allreduced in place as it is ready).

:class:`Buckets` runs a plan for one backward: ``add(key, x)`` hands a gradient over and
returns a :class:`Slot`; the moment a bucket holds all its gradients, they are copied into
one buffer and its allreduce started (``iallreduce_``), and ``Slot.wait()`` copies the sums
back into ``x``.  The blocking path uses the same buckets and waits for each the moment it
starts, so the calls, and the bits, are the same with overlap on or off: MPICH picks its
allreduce algorithm by message size, so packing changes the summation order, and only the
same buckets on both paths give the same sums.  ``Model.records()`` lists the same calls
(:func:`bucket_calls`).
"""

import dataclasses

from mpi4py import MPI

from refconv import arrays
from refconv.collectives.ops import iallreduce_

MIB = 2 ** 20
BUCKET_BYTES = 0  # refconv train's --bucket-mib default: measured in docs/benchmarks.md ("Buckets")


@dataclasses.dataclass
class Bucket:
    """Consecutive gradients of one communicator and dtype, allreduced in one call."""

    comm: object
    dtype: object
    keys: list
    sizes: list  # bytes of each gradient, in the order of keys

    @property
    def nbytes(self):
        return sum(self.sizes)


def plan(entries, threshold):
    """The :class:`Bucket` list of ``entries`` (``(key, comm, nbytes, dtype)`` in the order
    backward makes them ready): consecutive entries of one communicator (the same ranks in the
    same order: ``MPI_Comm_compare``, a local call) and dtype, each bucket closed once it holds
    ``threshold`` bytes or more.  A bucket's call is made on its first entry's communicator."""
    if threshold < 0:
        raise ValueError(f"threshold: expected bytes >= 0, got {threshold!r}")
    buckets, open_ = [], None
    for key, comm, nbytes, dtype in entries:
        if open_ is not None and (not _same_ranks(open_.comm, comm) or open_.dtype != dtype):
            open_ = None
        if open_ is None:
            open_ = Bucket(comm, dtype, [], [])
            buckets.append(open_)
        open_.keys.append(key)
        open_.sizes.append(nbytes)
        if open_.nbytes >= threshold:
            open_ = None
    return buckets


def _same_ranks(a, b):
    return a is b or type(a).Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT)  # MPI.Comm's, or a simulated one's


def bucket_calls(buckets, calls):
    """The calls the buckets make: ``calls[key]`` is the :class:`refconv.algorithms.Call` of one
    gradient's own allreduce; a bucket of several is one call of their bytes together."""
    out = []
    for bucket in buckets:
        first = calls[bucket.keys[0]]
        out.append(first if len(bucket.keys) == 1 else dataclasses.replace(first, bytes=bucket.nbytes))
    return out


class Slot:
    """One gradient handed to :class:`Buckets`: ``wait()`` returns it, summed over the ranks."""

    def __init__(self, state, index, x):
        self._state, self._index, self.x = state, index, x

    def wait(self):
        if self._state.request is None:
            raise RuntimeError(f"gradient bucket {self._index}: waited for before all its gradients were added "
                               f"(the layers' backward made them ready in another order than the plan)")
        return self._state.finish(self.x)


class _Started:
    """A bucket's state in one backward: the gradients added so far, then its request."""

    def __init__(self, bucket):
        self.bucket, self.added, self.request, self._unpacked = bucket, {}, None, False

    def start(self, overlap):
        xs = [self.added[k] for k in self.bucket.keys]
        if len(xs) == 1:  # alone: allreduced in place, no copy (threshold 0 makes only these)
            self.flat = None
            self.request = iallreduce_(self.bucket.comm, xs[0], overlap=overlap or "")
        else:
            xp = arrays.array_module(xs[0])
            self.flat = xp.empty(sum(x.size for x in xs), dtype=xs[0].dtype)  # the bucket's buffer
            offset = 0
            for x in xs:
                self.flat[offset:offset + x.size] = x.reshape(-1)
                offset += x.size
            self.request = iallreduce_(self.bucket.comm, self.flat, overlap=overlap or "")
        if not overlap:  # the blocking path: the same call, waited for the moment it starts
            self.request.wait()

    def finish(self, x):
        self.request.wait()
        if self.flat is not None and not self._unpacked:  # the sums back into each gradient
            offset = 0
            for k in self.bucket.keys:
                g = self.added[k]
                g[...] = self.flat[offset:offset + g.size].reshape(g.shape)
                offset += g.size
            self._unpacked = True
        return x


class Buckets:
    """A :func:`plan` run for one backward: ``add(key, x)`` returns a :class:`Slot`; a bucket's
    allreduce starts when it holds all its gradients, in flight behind compute with ``overlap``
    (what runs meanwhile, for the record), else waited for at once."""

    def __init__(self, buckets, overlap=None):
        self.overlap = overlap
        self._states = [_Started(b) for b in buckets]
        self._where = {k: (i, s) for i, s in enumerate(self._states) for k in s.bucket.keys}

    def __contains__(self, key):
        return key in self._where

    def add(self, key, x):
        index, state = self._where[key]
        state.added[key] = x
        if len(state.added) == len(state.bucket.keys):
            state.start(self.overlap)
        return Slot(state, index, x)
