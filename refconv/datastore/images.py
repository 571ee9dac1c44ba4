"""A store's images (or volumes) as a lazy array: indexing reads nothing, a rank's block reads only that block.

::

    x = StoreImages(store, numpy.arange(N), numpy.float32)   # (N, C, H, W), nothing read
    x_b = x[idx]                                             # a global batch, still nothing read
    x_loc = x_b.block(distribution, rank)                    # reads exactly this rank's block
    numpy.asarray(x_b)                                       # reads the whole batch (the one-rank replay)

``block`` reads the rank's pieces of every dim of ``distribution`` (samples, channels, planes of
a volume, rows, columns; :meth:`refconv.distribution.Distribution.pieces`), so it holds exactly what
``distribution.extract(numpy.asarray(x_b), rank)`` would, bit for bit (the same elements, cast
the same way) without the global batch ever existing.  The input distribution of a model
carries no halo: its first convolution exchanges the rows and columns (of a volume: the faces,
edges and corners) it needs with its neighbours (refconv.halo), so the block is all a rank reads.
"""

import itertools

import numpy

__all__ = ["StoreImages", "local_block"]


class StoreImages:
    """``store``'s samples ``index`` (global sample numbers) as a lazy ``(len(index), C, H, W)``
    (or ``(len(index), C, D, H, W)``) array of ``dtype``.  ``x[i]`` reads one sample; ``x[idx]``
    (an index array, slice or mask) is another StoreImages."""

    def __init__(self, store, index, dtype):
        self.store = store
        self.index = numpy.asarray(index, numpy.int64)               # (n,) global sample numbers
        self.dtype = numpy.dtype(dtype)
        self.shape = (len(self.index),) + store.shape[1:]
        self.ndim = len(self.shape)
        self._ahead = None                                           # (distribution, rank, block) read ahead

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, tuple):
            raise TypeError("StoreImages: index the sample dim only (x[i], x[idx], x[a:b], x[mask])")
        picked = self.index[index]
        if numpy.ndim(picked) == 0:
            return StoreImages(self.store, [picked], self.dtype).read_all()[0]
        return StoreImages(self.store, picked, self.dtype)

    def block(self, distribution, rank, out=None):
        """This rank's block of ``distribution`` (of this batch's shape), read now or ahead; read
        into ``out`` (an array of its local shape and this dtype) when given."""
        if self._ahead is not None and self._ahead[0] == distribution and self._ahead[1] == rank:
            return self._ahead[2]
        if tuple(distribution.global_shape) != self.shape:
            raise ValueError(f"block: the distribution is of {distribution.global_shape} but this batch is "
                             f"{self.shape}")
        pieces = [distribution.pieces(rank, d) for d in range(self.ndim)]
        samples = self.index[numpy.concatenate([numpy.arange(s, e) for s, e in pieces[0]])]
        if out is None:                                              # x_loc: (n_loc, C_loc, [D_loc,] H_loc, W_loc)
            out = numpy.empty(distribution.local_shape(rank), self.dtype)
        offsets = [numpy.cumsum([0] + [e - s for s, e in p]) for p in pieces[1:]]   # where each piece goes in x_loc
        for chosen in itertools.product(*[enumerate(p) for p in pieces[1:]]):   # one box per piece of each dim
            box = tuple(r for _, r in chosen)
            into = tuple(slice(at[k], at[k + 1]) for at, (k, _) in zip(offsets, chosen))
            self.store.read(samples, box, out[(slice(None),) + into])
        return self._finite(out, samples)

    def read_ahead(self, distribution, rank, out=None):
        """Read this rank's block now (into ``out``, in the prefetch thread), so that :meth:`block`
        returns it."""
        self._ahead = (distribution, rank, self.block(distribution, rank, out))
        return self

    def hold(self, distribution, rank, block):
        """Keep ``block``, this rank's block read elsewhere (by the prefetch reader process), so that
        :meth:`block` returns it."""
        self._ahead = (distribution, rank, block)

    def read_all(self):
        """The whole ``(n, C, (D,) H, W)`` array."""
        out = numpy.empty(self.shape, self.dtype)
        self.store.read(self.index, tuple((0, n) for n in self.shape[1:]), out)
        return self._finite(out, self.index)

    def __array__(self, dtype=None, copy=None):
        out = self.read_all()
        return out if dtype is None else out.astype(dtype)

    def _finite(self, out, samples):
        """A NaN or inf is found where it is read (a store larger than memory is never scanned whole)."""
        for j in range(len(out)):                  # min and max propagate NaN and reach inf: no temporary
            if not (numpy.isfinite(out[j].min()) and numpy.isfinite(out[j].max())):
                raise ValueError(f"{self.store.where}: sample {int(samples[j])} of x has NaN or inf values")
        return out

    def __repr__(self):
        return f"StoreImages({self.store!r}, {len(self)} samples as {self.dtype})"


def local_block(x_b, distribution, rank):
    """This rank's block of the global batch ``x_b``: read from its store when ``x_b`` is a
    :class:`StoreImages`, else extracted from the array in memory."""
    if isinstance(x_b, StoreImages):
        return x_b.block(distribution, rank)
    return distribution.extract(numpy.asarray(x_b), rank)
