"""Training data: where images come from, and the global batches every rank draws alike.

Sources (all return NCHW float images ``x`` and int64 labels ``y``)::

    load_digits()    the 1797 8x8 handwritten digits shipped in refconv/data/digits.npz
                     (copied once from scikit-learn by scripts/make_digits_npz.py;
                     nothing is downloaded), normalised and upsampled to 16x16
    load_npz(path)   a user's file with arrays x (N x C x H x W floats, or N x C x D x H x W
                     volumes) and y (N ints, or (N, K) float targets), validated with a
                     ValueError that names the problem
    synthetic(...)   large learnable images for scaling runs: a class pattern plus
                     noise, each sample drawn from its own seed, made on demand; the
                     patterns depend on ``seed`` only, so ``part=1`` (the test set) draws
                     other samples (labels, noise) of the same classes
    synthetic_volumes(...)  volumes (N, C, D, H, W) and float targets (N, 4): the
                     parameters each volume was drawn with (for regression: CosmoFlow)

Loading (no communication: every rank draws the same global batch and takes its block)::

    for x_b, y_b in batches(x, y, B, seed=s, epoch=e):     # same order on every rank
        x_loc = model.input_distribution.extract(x_b, rank) # this rank's block
        y_loc = model.label_block(y_b)                      # the labels of its samples

An array in memory (the digits, an .npz) holds every batch whole, and a rank extracts its block.
A store on disk (a directory of .npy files, HDF5, a folder of images) is read one block per
rank instead: :mod:`refconv.datastore`.  So are ``refconv train --synthetic``'s samples: a
synthetic generator is a store whose samples are made, not read (``x.read(samples, box, out)``
makes a box of some samples), so in a ``datastore.StoreImages`` a rank makes only its block:
its samples, and of them its channels, (planes,) rows and columns.  The patterns are made on
the box; the noise of a sample is drawn up to the box's last element and cut (its stream
cannot skip ahead), one sample at a time.  ``x[idx]`` makes whole samples, the same values.
The digits live in ``refconv/data/``, a directory of package data (no code).
"""

import importlib.resources
import io
import math
import os
import threading
import zipfile

import numpy

from refconv import checks

__all__ = ["load_digits", "load_npz", "split", "held_out_mask", "check_images", "check_labels", "is_targets",
           "cast_labels", "synthetic", "SyntheticImages", "synthetic_volumes", "SyntheticVolumes", "synthetic_for",
           "batches", "num_batches"]


# -- the bundled digits ---------------------------------------------------------------------
DIGITS_UPSAMPLE = 2                                         # load_digits' default
DIGITS_SHAPE = (1, 8 * DIGITS_UPSAMPLE, 8 * DIGITS_UPSAMPLE)  # (C, H, W) of load_digits()' images


def _digits_raw():
    """(x uint8 (1797, 1, 8, 8) in 0..16, y int64 (1797,)) from the installed package."""
    resource = importlib.resources.files("refconv").joinpath("data").joinpath("digits.npz")
    with resource.open("rb") as f:
        z = load_arrays(io.BytesIO(f.read()))
    return z["x"], z["y"]


def load_digits(*, upsample=DIGITS_UPSAMPLE, test_fraction=0.2, seed=0, dtype=numpy.float32):
    """The digits, ready to train on: ``(x_train, y_train, x_test, y_test)``.

    x: ``(n, 1, 8*upsample, 8*upsample)`` of ``dtype``: grey levels / 16, then
    standardised with the training set's mean and standard deviation, then
    upsampled by repeating each pixel ``upsample`` times in H and W (nearest
    neighbour; 16x16 by default, so there is room for spatial splits).
    y: int64 in 0..9.  The split is stratified per class and fixed by ``seed``.
    """
    upsample = checks.positive_int(upsample, "upsample")
    x, y = _digits_raw()
    x = x.astype(numpy.float64) / 16.0
    x_train, y_train, x_test, y_test = split(x, y, test_fraction, seed=seed)
    mean, std = x_train.mean(), x_train.std()
    out = []
    for part in (x_train, x_test):
        part = (part - mean) / std
        part = part.repeat(upsample, axis=2).repeat(upsample, axis=3)
        out.append(numpy.ascontiguousarray(part, dtype=dtype))
    return out[0], y_train, out[1], y_test


def split(x, y, test_fraction=0.2, *, seed=0, stratify=True):
    """``(x_train, y_train, x_test, y_test)``: a deterministic split by ``seed``.

    With ``stratify`` each class gives ``round(test_fraction * count)`` samples to
    the test set, so both sets keep the class proportions (regression targets ``(N, K)``
    have no classes: their samples are one group).  Samples keep their
    original order within each set.  ``x`` may be anything indexed by a boolean
    mask (an array, or a store's lazy images: :mod:`refconv.datastore`).
    """
    y = numpy.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"split: x has {len(x)} samples but y has {len(y)}")
    is_test = held_out_mask(y, test_fraction, seed=seed, stratify=stratify)
    return x[~is_test], y[~is_test], x[is_test], y[is_test]


def held_out_mask(y, test_fraction=0.2, *, seed=0, stratify=True):
    """The boolean mask of :func:`split`'s test samples: a function of the labels and ``seed`` only."""
    if not 0.0 <= float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction: expected a number in [0, 1), got {test_fraction!r}")
    y = numpy.asarray(y)
    rng = numpy.random.default_rng(seed)
    groups = [numpy.flatnonzero(y == k) for k in numpy.unique(y)] if stratify and not is_targets(y) \
        else [numpy.arange(len(y))]
    test = [numpy.zeros(0, numpy.int64)]
    for members in groups:
        take = int(round(test_fraction * len(members)))
        test.append(rng.permutation(members)[:take])
    is_test = numpy.zeros(len(y), dtype=bool)
    is_test[numpy.concatenate(test)] = True
    return is_test


# -- .npy and .npz files, read from rank threads -------------------------------------------------
# numpy parses an .npy header (a dict literal) with ast.literal_eval.  CPython 3.11's AST builder keeps
# its recursion count in state every thread shares, and a garbage collection inside it can switch
# threads: two simulated ranks parsing at once can fail with "SystemError: AST constructor recursion
# depth mismatch" (CI hit it in checkpoint.load; tests/data/test_npy_threads.py makes it certain).  So
# every header refconv parses goes through one lock, never contended on real MPI (a thread a process).
_PARSING = threading.Lock()
_NPY_HEADER_READERS = {(1, 0): numpy.lib.format.read_array_header_1_0,
                       (2, 0): numpy.lib.format.read_array_header_2_0}


def load_arrays(source):
    """``numpy.load(source, allow_pickle=False)`` read whole: an .npy's array, or an .npz's
    ``{name: array}`` (the archive closed).  numpy's errors pass through."""
    with _PARSING:
        loaded = numpy.load(source, allow_pickle=False)
    if not isinstance(loaded, numpy.lib.npyio.NpzFile):
        return loaded
    with loaded:
        return {name: archive_member(loaded, name) for name in loaded.files}


def archive_member(archive, name):
    """``archive[name]`` of an open ``numpy.load`` .npz archive (numpy parses its header on access)."""
    with _PARSING:
        return archive[name]


def read_npy_header(f):
    """``(shape, fortran_order, dtype)`` of the .npy stream ``f`` from its start, leaving ``f`` at
    the data; ValueError for a version numpy cannot read."""
    version = numpy.lib.format.read_magic(f)
    read = _NPY_HEADER_READERS.get(version)
    if read is None:
        raise ValueError(f"unsupported .npy version {version}; numpy.save writes 1.0 or 2.0")
    with _PARSING:
        return read(f)


# -- a user's file -----------------------------------------------------------------------------
def load_npz(path, *, dtype=numpy.float32, num_classes=None):
    """``(x, y)`` from an .npz with ``x`` (N x C x H x W images or N x C x D x H x W volumes,
    floats) and ``y`` (N ints >= 0, or (N, K) float regression targets).

    Every problem is a ValueError naming the file and what would be right: a
    missing or unreadable file, a missing array, a wrong shape or dtype, NaN or
    inf in x (or in the targets), a label < 0 or >= ``num_classes`` (when given), no samples.
    x is returned as ``dtype``, y as int64 (targets as ``dtype``: :func:`cast_labels`).
    """
    where = f"data file {os.fspath(path)!r}"
    if not os.path.exists(path):
        raise ValueError(f"{where} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{where} is a directory; expected an .npz file")
    if not os.path.isfile(path):
        raise ValueError(f"{where} is not a regular file (a FIFO or a device would block every rank); expected "
                         f"an .npz file")
    try:
        with _PARSING:                                # an .npy given here is parsed (and read) at once
            z = numpy.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{where} is not a readable .npz archive ({exc}); save it with "
                         f"numpy.savez(path, x=images, y=labels)") from None
    if not isinstance(z, numpy.lib.npyio.NpzFile):
        raise ValueError(f"{where} holds a single array (.npy), not the named arrays x and y; "
                         f"save with numpy.savez(path, x=images, y=labels)")
    with z:
        missing = [k for k in ("x", "y") if k not in z.files]
        if missing:
            raise ValueError(f"{where} has no array {' or '.join(missing)} (it holds "
                             f"{sorted(z.files)}); save with numpy.savez(path, x=images, y=labels)")
        try:
            _check_claimed_sizes(path, ("x", "y"), where)
            x, y = archive_member(z, "x"), archive_member(z, "y")
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{where}: cannot read x and y ({exc}); object arrays and "
                             f"damaged archives are refused") from None
    return _check_xy(x, y, where, dtype, num_classes)


def _check_claimed_sizes(path, keys, where):
    """Each array's header must not claim more bytes than its member holds: a header that says
    (100000, 3, 1000, 1000) over 64 bytes of data (a header bomb) would have numpy allocate
    terabytes before it finds out (a MemoryError, not a one-line refusal)."""
    with zipfile.ZipFile(path) as archive:
        for key in keys:
            info = archive.getinfo(f"{key}.npy")
            with archive.open(info) as f:
                shape, _, dtype = read_npy_header(f)
                claimed = math.prod(shape) * dtype.itemsize
                held = info.file_size - f.tell()
                if claimed > held:
                    raise ValueError(f"its array {key} claims shape {shape} of {dtype} ({claimed:,} bytes) but holds "
                                     f"{held:,} bytes")


def _check_xy(x, y, where, dtype, num_classes):
    check_images(x.shape, x.dtype, where)
    check_labels(y, len(x), where, num_classes)
    finite = numpy.isfinite(x)
    if not finite.all():
        first = tuple(int(i) for i in numpy.argwhere(~finite)[0])
        raise ValueError(f"{where}: x has {int((~finite).sum())} NaN or inf values "
                         f"(first at index {first})")
    return numpy.ascontiguousarray(x, dtype=dtype), cast_labels(y, dtype)


def check_images(shape, dtype, where):
    """x's shape and dtype: 4-D N x C x H x W images or 5-D N x C x D x H x W volumes, no empty dim,
    floats (a ValueError naming ``where``).  The one check of samples, in memory (:func:`load_npz`)
    or on disk (:mod:`refconv.datastore`)."""
    shape = tuple(shape)
    if len(shape) not in (4, 5):
        hint = " (one channel? use x[:, None])" if len(shape) == 3 else ""
        raise ValueError(f"{where}: x must be 4-D N x C x H x W, got shape {shape}{hint}; volumes are 5-D "
                         f"N x C x D x H x W")
    if shape[0] == 0:
        raise ValueError(f"{where}: x has zero samples; need at least one")
    if 0 in shape:
        raise ValueError(f"{where}: x has an empty dimension, shape {shape}")
    if numpy.dtype(dtype).kind != "f":
        raise ValueError(f"{where}: x must hold floats, got dtype {dtype}; convert "
                         f"(e.g. images.astype(numpy.float32) / 255) before saving")


def check_labels(y, n, where, num_classes=None):
    """y: 1-D integer class labels >= 0 (< ``num_classes`` when given), one for each of ``n``
    samples; or regression targets, 2-D ``(n, K)`` finite floats (:func:`is_targets`)."""
    if y.ndim == 2 and y.dtype.kind == "f":
        if len(y) != n:
            raise ValueError(f"{where}: x has {n} samples but y has targets for {len(y)}")
        if y.shape[1] == 0:
            raise ValueError(f"{where}: y has no targets per sample (shape {y.shape}); give (N, K) with K >= 1")
        if not numpy.isfinite(y).all():
            raise ValueError(f"{where}: y has NaN or inf targets (first at sample "
                             f"{int(numpy.flatnonzero(~numpy.isfinite(y).all(axis=1))[0])})")
        return
    if y.ndim != 1:
        raise ValueError(f"{where}: y must be 1-D (one label per sample), got shape {y.shape} of {y.dtype}; "
                         f"regression targets are 2-D floats (N, K)")
    if y.dtype.kind not in "iu":
        raise ValueError(f"{where}: y must hold integer class labels, got dtype {y.dtype} of shape {y.shape}; "
                         f"regression targets are 2-D floats (N, K)")
    if len(y) != n:
        raise ValueError(f"{where}: x has {n} samples but y has {len(y)} labels")
    if (y < 0).any():
        raise ValueError(f"{where}: y has negative labels (first at index "
                         f"{int(numpy.flatnonzero(y < 0)[0])}); labels must be 0..num_classes-1")
    if num_classes is not None and (y >= num_classes).any():
        raise ValueError(f"{where}: y has label {int(y.max())} but num_classes = {num_classes}; "
                         f"labels must be 0..{num_classes - 1}")


def is_targets(y):
    """True for regression targets ``(N, K)`` floats, False for class labels ``(N,)`` ints."""
    return numpy.ndim(y) == 2


def cast_labels(y, dtype):
    """Checked labels as training takes them: class labels as int64, targets as ``dtype`` (the
    samples' dtype; kept as they are when None), so an .npz and a store of it give the same."""
    if not is_targets(y):
        return y.astype(numpy.int64)
    return y if dtype is None else y.astype(dtype)


# -- synthetic images for scaling runs ---------------------------------------------------------
def _part_key(seed, stream, part):
    """The seed of one random stream of ``part`` (0: training samples, 1: test samples).  Part 0's
    keys are ``[seed, stream]``, as they were before parts existed; another part's add it, so the two
    parts draw other labels and noise while the class patterns (``[seed, 2]``, no part) stay shared."""
    return [seed, stream] if part == 0 else [seed, stream, part]


def synthetic(n, channels, height, width, num_classes, *, seed=0, dtype=numpy.float32,
              noise=1.0, part=0):
    """``(x, y)``: ``n`` learnable images of ``channels x height x width``.

    ``y`` (int64, length n) is drawn from ``seed`` and ``part``; the class patterns from ``seed``
    alone, so ``part=1`` gives other samples of the same classes: a test set.  ``x`` is a
    :class:`SyntheticImages`: a lazy ``(n, C, H, W)`` array whose samples are
    generated only when indexed (``x[idx]``, ``x[a:b]``, ``numpy.asarray(x)``),
    each from its own seed, so any subset is the same whoever asks for it; or
    only a box of some samples (:meth:`SyntheticImages.read`: a rank's block).
    """
    for name, v in (("n", n), ("channels", channels), ("height", height), ("width", width),
                    ("num_classes", num_classes)):
        checks.positive_int(v, name)
    y = numpy.random.default_rng(_part_key(seed, 0, part)).integers(0, num_classes, size=n).astype(numpy.int64)
    return SyntheticImages(y, (channels, height, width), num_classes, seed, dtype, noise, part), y


class SyntheticImages:
    """Lazy images: sample i = pattern[y_i] + noise * N(0, 1) drawn from seed (seed, 1, i)
    (of a test set, ``part`` 1: (seed, 1, 1, i)).

    The class pattern is separable, ``a[k, c] * cos(2 pi (f_h[k,c] h/H + phi_h))
    * cos(2 pi (f_w[k,c] w/W + phi_w))``, so it costs O(C (H + W)) to describe even
    for very large images; its frequencies and phases come from ``seed`` alone (not ``part``),
    so a training set and a test set of one seed share their classes.

    Two ways to make samples, the same values bit for bit: ``x[idx]`` makes whole samples
    (an array), and :meth:`read` makes only a box (channels, rows, columns) of each of some
    samples.  :meth:`read` is the protocol of a store on disk (:mod:`refconv.datastore`),
    so ``StoreImages(x, range(len(x)), dtype)`` is a lazy array whose batches make only a
    rank's block: what ``refconv train --synthetic`` trains on.  ``made`` counts what was
    made: ``samples`` (boxes of a sample), ``cells`` (elements of x written) and
    ``normals`` (noise values drawn).
    """

    kind = "images"

    def __init__(self, labels, chw, num_classes, seed, dtype, noise, part=0):
        self._start(labels, chw, seed, dtype, noise, part)
        C, H, W = self.shape[1:]
        rng = numpy.random.default_rng([seed, 2])
        f = rng.integers(1, 4, size=(2, num_classes, C))            # low frequencies
        phase = rng.uniform(0, 1, size=(2, num_classes, C))
        self._rows = numpy.cos(2 * numpy.pi * (f[0, :, :, None] * numpy.arange(H) / H
                                                + phase[0, :, :, None]))   # (K, C, H)
        self._cols = numpy.cos(2 * numpy.pi * (f[1, :, :, None] * numpy.arange(W) / W
                                                + phase[1, :, :, None]))   # (K, C, W)
        self._amp = rng.choice([-2.0, 2.0], size=(num_classes, C))

    def _start(self, labels, sample_shape, seed, dtype, noise, part):
        self.labels = labels
        self.part = part
        self.shape = (len(labels),) + tuple(int(s) for s in sample_shape)
        self.dtype = numpy.dtype(dtype)
        self.ndim = len(self.shape)
        self.seed, self.noise = seed, float(noise)
        self.where = f"synthetic {self.kind} (seed {seed}{', test part' if part else ''})"  # a store's name
        self.made = {"samples": 0, "cells": 0, "normals": 0}
        self._lock = threading.Lock()                                 # the prefetch thread makes samples too

    def __len__(self):
        return self.shape[0]

    def sample(self, i):
        """Sample ``i`` as a ``(C, H, W)`` array (a volume: ``(C, D, H, W)``)."""
        return self._box(int(i), tuple(slice(0, n) for n in self.shape[1:]))

    def read(self, samples, box, out):
        """Write the box of each of ``samples`` (global sample numbers) into ``out[j]``, making
        only that box: ``box`` holds a ``(start, stop)`` pair per dim after the sample dim, as a
        store's ``read`` takes it.  One sample at a time, so nothing larger than one sample is
        made besides ``out`` (:meth:`_noise`)."""
        box = tuple(slice(int(a), int(b)) for a, b in box)
        for j, i in enumerate(samples):
            out[j] = self._box(int(i), box)

    def _box(self, i, box):
        """Sample ``i``'s ``box`` (a slice per dim after the sample dim) as ``dtype``."""
        k = self.labels[i]
        c, h, w = box
        pattern = self._amp[k][c, None, None] * self._rows[k][c, h, None] * self._cols[k][c, None, w]  # (c, h, w)
        return (pattern + self.noise * self._noise(i, box)).astype(self.dtype)

    def _noise(self, i, box):
        """Sample ``i``'s N(0, 1) noise on ``box`` (float64), from seed ``(seed, 1, i)`` (part 1:
        ``(seed, 1, 1, i)``).

        The stream gives a sample's values in C order and cannot skip ahead: a normal costs a
        varying number of raw draws.  So the values up to the box's last element are drawn into
        a buffer of one sample (its pages past them never touched), and the box cut from it: a
        rank with the first rows of a sample draws those rows only, one with the last draws all."""
        shape = self.shape[1:]
        stop = int(numpy.ravel_multi_index(tuple(s.stop - 1 for s in box), shape)) + 1
        flat = numpy.empty(math.prod(shape))                           # one sample's noise, at most
        numpy.random.default_rng(_part_key(self.seed, 1, self.part) + [i]).standard_normal(out=flat[:stop])
        with self._lock:
            self.made["samples"] += 1
            self.made["cells"] += math.prod(s.stop - s.start for s in box)
            self.made["normals"] += stop
        return flat.reshape(shape)[box]

    def __getitem__(self, index):
        if isinstance(index, tuple):
            raise TypeError(f"{type(self).__name__}: index the sample dim only (x[i], x[idx], x[a:b])")
        if numpy.ndim(index) == 0 and not isinstance(index, slice):
            return self.sample(numpy.arange(len(self))[index])
        picked = numpy.arange(len(self))[index]
        out = numpy.empty((len(picked),) + self.shape[1:], self.dtype)
        for j, i in enumerate(picked):
            out[j] = self.sample(i)
        return out

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, seed={self.seed})"


VOLUME_TARGETS = 4  # the parameters of a synthetic volume: noise level, mean, smooth and rough amplitudes


def synthetic_volumes(n, channels, size, *, seed=0, dtype=numpy.float32, part=0):
    """``(x, y)``: ``n`` volumes of ``channels x size x size x size`` and their targets.

    ``y`` (``(n, 4)`` of ``dtype``, uniform in [-1, 1), drawn from ``seed`` and ``part``) are the
    parameters each volume depends on, so a regression can learn them; ``x`` is a lazy
    :class:`SyntheticVolumes`, each sample made from ``(seed, i)`` when it is indexed.  The
    patterns depend on ``seed`` alone: ``part=1`` draws a test set of the same problem.
    """
    for name, v in (("n", n), ("channels", channels), ("size", size)):
        checks.positive_int(v, name)
    y = numpy.random.default_rng(_part_key(seed, 0, part)).uniform(-1, 1, size=(n, VOLUME_TARGETS)).astype(dtype)
    return SyntheticVolumes(y, (channels, size, size, size), seed, dtype, part), y


class SyntheticVolumes(SyntheticImages):
    """Lazy volumes: sample i, with targets ``t = y[i]``, is in every channel c

    ``(1 + t0/2) noise + t1 / 2 + t2 smooth[c] + t3 rough[c]``

    with ``noise`` N(0, 1) drawn from seed ``(seed, 1, i)``, ``smooth[c]`` a separable
    low-frequency cosine over (d, h, w) and ``rough[c]`` one at the highest frequency
    (a checkerboard of random sign per channel), both fixed by ``seed``: the four targets
    are the noise level, the mean, and the amplitudes of the two patterns.  Both patterns
    are made on the box asked for, as the images' are (:meth:`SyntheticImages.read`).
    """

    kind = "volumes"

    def __init__(self, targets, cdhw, seed, dtype, part=0):
        self._start(targets, cdhw, seed, dtype, 1.0, part)
        C, D, H, W = self.shape[1:]
        rng = numpy.random.default_rng([seed, 2])
        f, phase = rng.integers(1, 3, size=(3, C)), rng.uniform(0, 1, size=(3, C))
        self._axes = [numpy.cos(2 * numpy.pi * (f[a][:, None] * numpy.arange(n) / n + phase[a][:, None]))
                      for a, n in enumerate((D, H, W))]  # (C, D), (C, H), (C, W)
        self._sign = rng.choice([-1.0, 1.0], size=C)

    def _box(self, i, box):
        """Sample ``i``'s ``box`` (slices of c, d, h, w) as ``dtype``."""
        t = self.labels[i].astype(numpy.float64)
        c, d, h, w = box
        depth, rows, cols = (axis[c, s] for axis, s in zip(self._axes, (d, h, w)))   # (c, d), (c, h), (c, w)
        smooth = depth[:, :, None, None] * rows[:, None, :, None] * cols[:, None, None, :]        # (c, d, h, w)
        dd, hh, ww = numpy.ogrid[d, h, w]
        rough = self._sign[c, None, None, None] * numpy.where((dd + hh + ww) % 2, -1.0, 1.0)[None]  # (c, d, h, w)
        return ((1 + t[0] / 2) * self._noise(i, box) + t[1] / 2 + t[2] * smooth + t[3] * rough).astype(self.dtype)


def synthetic_for(spec, n, size, *, seed=0, dtype=numpy.float32, part=0):
    """``(x, y, num_classes)``: what ``refconv train --synthetic`` gives the model ``spec`` (a dict):
    ``n`` volumes of ``size`` cubed and their targets for a model of volumes (``"dims": 3``;
    ``num_classes`` is the number of targets), else ``n`` images of ``size`` squared in 10
    classes; of the spec's ``in_channels`` (3 by default).  ``part`` 0 is the training set,
    1 the test set: other samples of the same classes (or the same volume problem)."""
    channels = spec.get("in_channels", 3)
    if spec.get("dims") == 3:
        return (*synthetic_volumes(n, channels, size, seed=seed, dtype=dtype, part=part), VOLUME_TARGETS)
    return (*synthetic(n, channels, size, size, 10, seed=seed, dtype=dtype, part=part), 10)


# -- batches ----------------------------------------------------------------------------------
def num_batches(n, batch_size, *, drop_last=False):
    """How many batches ``batches`` yields for ``n`` samples."""
    return n // batch_size if drop_last else -(-n // batch_size)


def batches(x, y, batch_size, *, seed=0, epoch=0, shuffle=True, drop_last=False, start=0):
    """Yield global ``(x_batch, y_batch)`` pairs, the same on every rank.

    The order is ``numpy.random.default_rng([seed, epoch]).permutation(N)`` (or
    0..N-1 without ``shuffle``): a function of ``seed`` and ``epoch`` only, so
    ranks agree without talking and a resumed run replays it.  ``start`` skips
    the first ``start`` batches (resuming mid-epoch).  Each sample appears once
    per epoch; the last batch is short unless ``drop_last``.
    """
    batch_size = checks.positive_int(batch_size, "batch_size")
    n = len(x)
    if len(y) != n:
        raise ValueError(f"batches: x has {n} samples but y has {len(y)}")
    order = numpy.random.default_rng([seed, epoch]).permutation(n) if shuffle else numpy.arange(n)
    for b in range(start, num_batches(n, batch_size, drop_last=drop_last)):
        idx = order[b * batch_size:(b + 1) * batch_size]
        yield x[idx], y[idx]
