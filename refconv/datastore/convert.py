"""``refconv data convert SOURCE OUTPUT``: an .npz or a folder of images into HDF5 or .npy shards;
``refconv data synth OUTPUT``: the samples ``refconv train --synthetic`` makes, into a store.

    refconv data convert my_data.npz my_data.h5                  # HDF5: x chunked, y
    refconv data convert photos/ photos.h5                       # class-per-subfolder images, decoded once
    refconv data convert photos/ photos.h5 --image-size 64       # ... and resized to 64 x 64
    refconv data convert my_data.npz my_data --shard-samples 4096   # a directory: x-00000.npy, ..., y.npy
    refconv data synth volumes.h5 --model cosmoflow --samples 64 --image-size 16

The output is what ``refconv train --data OUTPUT`` reads block by block (docs/data.md).  x may
hold images (N, C, H, W) or volumes (N, C, D, H, W), y class labels (N,) or float targets
(N, K).  HDF5 x is written in chunks of one sample, all channels and at most ``--chunk`` pixels
along each spatial dim, so that a rank of a spatial split reads only the chunks its block
overlaps.  Images are stored as float32, decoded and normalised as training would
(refconv.datastore.imagefolder); an .npz keeps its dtype.  The source is read ``--group``
samples at a time (an .npz is loaded whole: a zip member cannot be read in part), with a
progress line on stderr at each tenth.  It runs as one process; an existing OUTPUT is
refused, never overwritten.

The command that calls these writers is :mod:`refconv.commands.data`.
"""

import os

import numpy

from refconv import checks, datasets, failure
from refconv.datastore import HDF5_SUFFIXES, kind_of, open_store
from refconv.datastore.formats import import_h5py
from refconv.model_spec import load_spec

__all__ = ["convert", "synthesize"]


def convert(source, output, *, image_size=None, chunk=64, shard_samples=4096, group=256, report=None):
    """Write ``source`` to ``output`` (HDF5 if it ends in .h5/.hdf5, else a new directory of .npy
    shards); returns ``(shape, dtype)`` of the x written.  A folder's images are resized to
    ``image_size`` square when it is given, else kept at their one size (several: a ValueError
    listing them).  ``report(line)`` gets the progress."""
    for name, v in (("chunk", chunk), ("shard_samples", shard_samples), ("group", group)):
        checks.positive_int(v, name)
    if image_size is not None:
        checks.positive_int(image_size, "image_size")
    _check_output(output)
    if kind_of(source) == "npz":
        x, y = datasets.load_npz(source, dtype=None)
        shape, dtype = x.shape, x.dtype

        def samples(a, b):
            return x[a:b]
    else:
        store = open_store(source, image_size=image_size)
        y, shape, dtype = store.labels, store.shape, store.dtype

        def samples(a, b):
            out = numpy.empty((b - a,) + shape[1:], dtype)
            store.read(numpy.arange(a, b), tuple((0, n) for n in shape[1:]), out)
            return out
    _write(output, shape, dtype, y, samples, chunk=chunk, shard_samples=shard_samples, group=group, report=report)
    return shape, dtype


def synthesize(output, *, model, samples, size, seed=0, chunk=64, shard_samples=4096, group=256, report=None):
    """Write to ``output`` the training samples ``refconv train --model model --synthetic
    --synthetic-samples samples --image-size size --seed seed`` makes (float32), sample for
    sample (:func:`refconv.datasets.synthetic_for`): volumes and their targets for a model of
    volumes, else images and class labels.  Returns ``(shape, dtype)`` of the x written."""
    for name, v in (("samples", samples), ("size", size), ("chunk", chunk), ("shard_samples", shard_samples),
                    ("group", group)):
        checks.positive_int(v, name)
    spec = load_spec(model)
    _check_output(output)
    x, y, _ = datasets.synthetic_for(spec, samples, size, seed=seed, dtype=numpy.float32)
    _write(output, x.shape, x.dtype, y, lambda a, b: x[a:b], chunk=chunk, shard_samples=shard_samples, group=group,
           report=report)
    return x.shape, x.dtype


def _check_output(output):
    if os.path.exists(output):
        raise ValueError(f"output: {output!r} exists; remove it or choose another name (nothing is overwritten)")
    checks.output_file(output, "output")


def _write(output, shape, dtype, y, samples, *, report, **options):
    """Write x (``samples(a, b)`` gives x[a:b]) and y: HDF5 if ``output`` ends in .h5/.hdf5, else .npy shards."""
    write = _hdf5 if output.lower().endswith(HDF5_SUFFIXES) else _shards
    write(output, shape, dtype, datasets.cast_labels(numpy.asarray(y), None), samples,
          report=report or (lambda line: failure.write_line(line)), **options)


def _progress(report, done, total, last):
    """A line at each tenth of the samples (and the last); returns the tenth reported."""
    tenth = done * 10 // total
    if tenth > last:
        report(f"convert: {done:,}/{total:,} samples ({100 * done // total}%)")
    return tenth


def _hdf5(output, shape, dtype, y, samples, *, chunk, group, report, **_):
    h5py = import_h5py()
    n, C = shape[:2]
    with h5py.File(output, "w") as f:
        x = f.create_dataset("x", shape=shape, dtype=dtype, chunks=(1, C) + tuple(min(s, chunk) for s in shape[2:]))
        f.create_dataset("y", data=y)
        last = 0
        for a in range(0, n, group):
            b = min(a + group, n)
            x[a:b] = samples(a, b)
            last = _progress(report, b, n, last)


def _shards(output, shape, dtype, y, samples, *, shard_samples, group, report, **_):
    os.makedirs(output)
    n = shape[0]
    numpy.save(os.path.join(output, "y.npy"), y)
    last = 0
    for k, start in enumerate(range(0, n, shard_samples)):
        stop = min(start + shard_samples, n)
        x = numpy.lib.format.open_memmap(os.path.join(output, f"x-{k:05d}.npy"), mode="w+", dtype=dtype,
                                         shape=(stop - start,) + tuple(shape[1:]))
        for a in range(start, stop, group):
            b = min(a + group, stop)
            x[a - start:b - start] = samples(a, b)
            last = _progress(report, b, n, last)
        x.flush()
        del x
