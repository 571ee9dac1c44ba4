"""The two array stores that ``--data`` reads a block at a time, and how they are checked on opening.

A directory of ``.npy`` files, read with plain reads at each piece's offset::

    DIR/y.npy                      (N,) integer labels or (N, K) float targets, read whole
    DIR/x.npy                      (N, C, H, W) images or (N, C, D, H, W) volumes, floats: one shard, or
    DIR/x-00000.npy, x-00001.npy   shards of consecutive samples, numbered from 0 without a gap

One HDF5 file (h5py, the ``data`` extra), read by hyperslab::

    FILE.h5 or FILE.hdf5           datasets "x" and "y" as above; x is best chunked
                                   (refconv data convert writes one sample and at most 64 pixels
                                   along each spatial dim per chunk, so a spatial block touches
                                   few chunks)

A sample has 2 spatial dims (an image) or 3 (a volume); a block of it is a box, one
``(start, stop)`` per dim after the sample dim: ``(c, h, w)`` or ``(c, d, h, w)``.

Opening costs the headers and the labels.  Everything a file can get wrong that its headers
show is a ``ValueError`` naming the file and what would be right, raised before training on
every rank alike (every rank opens the same files): a missing file or shard, a truncated file
(its header claims more bytes than it holds), a wrong shape or dtype, labels that do not
match.  ``read`` reads exactly the elements asked for and counts them in ``bytes_read``.
"""

import itertools
import os
import re
import threading

import numpy

from refconv import datasets

__all__ = ["kind_of", "NpyDirectory", "Hdf5File", "HDF5_SUFFIXES"]

HDF5_SUFFIXES = (".h5", ".hdf5")
_SHARD = re.compile(r"x-(\d{5})\.npy")


def kind_of(path):
    """``"npz"``, ``"npy"`` (a directory) or ``"hdf5"``: which reader ``--data path`` takes."""
    if os.path.isdir(path):
        return "npy"
    if os.fspath(path).lower().endswith(HDF5_SUFFIXES):
        return "hdf5"
    return "npz"


class Store:
    """What both stores share: ``shape`` (N, C, H, W) or (N, C, D, H, W), ``dtype`` (x's, on disk),
    ``labels`` (int64 (N,), or float targets (N, K) as stored), and ``bytes_read``, the bytes of x
    read so far (a counter safe across threads)."""

    def __init__(self, path, shape, dtype, labels):
        self.path = os.fspath(path)
        self.where = f"data {self.path!r}"
        datasets.check_images(shape, dtype, self.where)
        datasets.check_labels(labels, shape[0], self.where)
        self.shape, self.dtype = tuple(int(s) for s in shape), numpy.dtype(dtype)
        self.labels = datasets.cast_labels(labels, None)
        self.bytes_read = 0
        self._lock = threading.Lock()

    def read(self, samples, box, out):
        """Write x[samples, c0:c1, (d0:d1,) h0:h1, w0:w1] into ``out`` (cast to its dtype); ``box``
        holds a (start, stop) pair per dim after the sample dim, ``samples`` are global sample
        numbers in any order."""
        if len(box) != len(self.shape) - 1:
            raise ValueError(f"read: a box of {len(box)} ranges for samples of {self.shape[1:]}")
        self._read(numpy.asarray(samples, numpy.int64), tuple((int(a), int(b)) for a, b in box), out)
        with self._lock:
            self.bytes_read += out.size * self.dtype.itemsize

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r}, shape={self.shape}, dtype={self.dtype})"


# -- a directory of .npy files -------------------------------------------------------------------------
def _npy_header(path, where):
    """(shape, dtype, data offset) of an .npy file; a file shorter than its header claims is refused."""
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = datasets.read_npy_header(f)
            offset = f.tell()
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{where}: {os.path.basename(path)} is not a readable .npy file ({exc}); save it "
                         f"with numpy.save") from None
    if fortran:
        raise ValueError(f"{where}: {os.path.basename(path)} is in Fortran order; save a C-ordered array "
                         f"(numpy.save(path, numpy.ascontiguousarray(x)))")
    if dtype.hasobject:
        raise ValueError(f"{where}: {os.path.basename(path)} holds Python objects; save numbers")
    claimed, held = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize, os.path.getsize(path) - offset
    if held < claimed:
        raise ValueError(f"{where}: {os.path.basename(path)} is truncated: its header says {shape} of {dtype} "
                         f"({claimed:,} bytes) but it holds {held:,}; write it again")
    return tuple(shape), dtype, offset


class NpyDirectory(Store):
    """``DIR/y.npy`` and x in one or more .npy shards of consecutive samples, read piece by piece."""

    def __init__(self, path):
        where = f"data {os.fspath(path)!r}"
        names = sorted(os.listdir(path))
        numbered = sorted((int(m.group(1)), n) for n in names if (m := _SHARD.fullmatch(n)))
        if "x.npy" in names and numbered:
            raise ValueError(f"{where} holds both x.npy and shards x-00000.npy...; keep one of them")
        if "x.npy" in names:
            files = ["x.npy"]
        elif numbered:
            missing = sorted(set(range(numbered[-1][0] + 1)) - {k for k, _ in numbered})
            if missing:
                raise ValueError(f"{where}: shard x-{missing[0]:05d}.npy is missing (shards must be numbered "
                                 f"x-00000.npy, x-00001.npy, ... without a gap)")
            files = [n for _, n in numbered]
        else:
            raise ValueError(f"{where} has no x.npy (or shards x-00000.npy, ...); write the images "
                             f"(N, C, H, W) or volumes (N, C, D, H, W) there, or convert with refconv data convert")
        if "y.npy" not in names:
            raise ValueError(f"{where} has no y.npy; write the labels (N,) or targets (N, K) there")
        self.files = [os.path.join(path, n) for n in files]
        headers = [_npy_header(f, where) for f in self.files]
        for name, (shape, dtype, _) in zip(files, headers):
            datasets.check_images(shape, dtype, f"{where}: {name}")
            first = headers[0]
            if shape[1:] != first[0][1:] or dtype != first[1]:
                raise ValueError(f"{where}: {name} holds {shape[1:]} samples of {dtype} but {files[0]} holds "
                                 f"{first[0][1:]} of {first[1]}; every shard must hold samples alike")
        counts = [h[0][0] for h in headers]
        self.starts = numpy.cumsum([0] + counts)       # shard k holds samples starts[k] .. starts[k+1]-1
        self.headers = headers
        y_path = os.path.join(path, "y.npy")
        _npy_header(y_path, where)
        labels = datasets.load_arrays(y_path)
        if labels.ndim in (1, 2) and len(labels) > self.starts[-1] and len(files) > 1:
            raise ValueError(f"{where}: the shards {files[0]} .. {files[-1]} hold {self.starts[-1]} samples but "
                             f"y.npy has {len(labels)} labels; is a shard after {files[-1]} missing?")
        super().__init__(path, (int(self.starts[-1]),) + headers[0][0][1:], headers[0][1], labels)

    def _read(self, samples, box, out):
        shard = numpy.searchsorted(self.starts, samples, side="right") - 1
        for k in numpy.unique(shard):
            mine = numpy.flatnonzero(shard == k)
            shape, dtype, offset = self.headers[k]
            piece = None                                             # one sample's, where out[j] cannot take it
            with open(self.files[k], "rb", buffering=0) as f:
                for j, i in zip(mine, samples[mine] - self.starts[k]):
                    if out.dtype == dtype and out[j].flags.c_contiguous:
                        _pread_piece(f, offset, shape, i, box, out[j])       # straight into the block
                        continue
                    if piece is None:
                        piece = numpy.empty([b - a for a, b in box], dtype)
                    _pread_piece(f, offset, shape, i, box, piece)
                    out[j] = piece                                   # cast to the batch's dtype


def _pread_piece(f, offset, shape, i, box, piece):
    """``piece[...] = x[i][box]`` of the C-ordered (N, C, ...) array at ``offset`` in the open file ``f``,
    in as few reads as its layout allows.

    The dims at the end that the box holds whole are contiguous in the file, and so is the range
    of the dim before them: one read covers that, and there is one read per index of the dims
    before (an image: the whole piece, a channel's rows, or a row at a time; a volume: the whole
    piece, a channel's planes, a plane's rows, or a row at a time).

    Plain reads (``os.preadv``) rather than a memory map: the page cache holds what is read, not
    this process (a mapped page counts in its resident memory until it is unmapped), and the
    thread that prefetches lets go of the GIL while the kernel copies."""
    sizes = shape[1:]                                                # (C, (D,) H, W)
    strides = numpy.cumprod((1,) + sizes[:0:-1])[::-1]               # elements per step of each dim
    run = len(sizes) - 1                                             # the dim whose range one read covers
    while run > 0 and box[run] == (0, sizes[run]):
        run -= 1
    sample = offset + i * int(numpy.prod(sizes)) * piece.itemsize
    runs = []
    for index in itertools.product(*(range(a, b) for a, b in box[:run])):
        first = sum(int(j * s) for j, s in zip(index + (box[run][0],), strides))
        runs.append((sample + first * piece.itemsize, piece[tuple(j - a for j, (a, _) in zip(index, box))]))
    for at, into in runs:
        view = memoryview(into).cast("B")
        while len(view):
            got = os.preadv(f.fileno(), [view], at)
            if got == 0:
                raise ValueError(f"data: {f.name!r} ended before byte {at:,}; was it truncated while training?")
            view, at = view[got:], at + got


# -- one HDF5 file ------------------------------------------------------------------------------------
class Hdf5File(Store):
    """``FILE.h5`` with datasets x and y, read by hyperslab (only the chunks a block overlaps)."""

    def __init__(self, path):
        where = f"data {os.fspath(path)!r}"
        h5py = import_h5py()
        if not os.path.isfile(path):
            raise ValueError(f"{where} does not exist (or is not a file); expected an HDF5 file with datasets "
                             f"x and y")
        try:
            self.file = h5py.File(path, "r")
        except OSError as exc:
            raise ValueError(f"{where} is not a readable HDF5 file ({exc}); write it again, or convert with "
                             f"refconv data convert") from None
        for key in ("x", "y"):
            if not isinstance(self.file.get(key), h5py.Dataset):
                raise ValueError(f"{where} has no dataset {key} (it holds {sorted(self.file.keys())}); it needs "
                                 f"x (N, C, H, W) or (N, C, D, H, W) floats and y (N,) ints or (N, K) floats")
        self.x = self.file["x"]
        try:
            labels = self.file["y"][()]
        except OSError as exc:
            raise ValueError(f"{where}: cannot read y ({exc})") from None
        super().__init__(path, self.x.shape, self.x.dtype, numpy.asarray(labels))

    def _read(self, samples, box, out):
        box = tuple(slice(a, b) for a, b in box)
        try:
            for j, i in enumerate(samples):
                out[j] = self.x[(i,) + box]                             # one hyperslab per sample
        except OSError as exc:
            raise ValueError(f"{self.where}: reading samples failed ({exc}); is the file damaged?") from None


def import_h5py():
    try:
        import h5py
    except ImportError:
        raise ValueError("data: reading HDF5 needs h5py (pip install 'refconv[data]')") from None
    return h5py
