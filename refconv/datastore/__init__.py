"""Training data on disk, read one block per rank: each rank reads only its own block of each batch.

``refconv train --data PATH`` takes::

    an .npz          x and y, loaded whole on every rank (refconv.datasets.load_npz)
    a directory      y.npy and x.npy (or shards x-00000.npy, ...), read by offset  (formats.py)
    FILE.h5/.hdf5    datasets x and y, read by hyperslab through h5py               (formats.py)
    an image folder  one subfolder per class; a rank decodes only its samples       (imagefolder.py)

x holds images (N, C, H, W) or volumes (N, C, D, H, W), y class labels (N,) or float targets (N, K)
(an image folder: images and labels).

A store's images are a lazy array (:class:`StoreImages`, images.py): the global sample order
is still :func:`refconv.datasets.batches`' (seed and epoch), but a batch is only a list of
sample numbers until a rank asks for its block, and then only that block is read (its
samples, and under a channel or spatial split its channels, (planes,) rows and columns).  The next
batch's block is read in a thread while the step trains (prefetch.py).  docs/data.md.
"""

from refconv import datasets
from refconv.datastore.formats import HDF5_SUFFIXES, Hdf5File, NpyDirectory, kind_of
from refconv.datastore.imagefolder import ImageFolder, is_image_folder
from refconv.datastore.images import StoreImages, local_block
from refconv.datastore.prefetch import batches

__all__ = ["load", "open_store", "kind_of", "StoreImages", "local_block", "batches", "NpyDirectory", "Hdf5File",
           "ImageFolder", "HDF5_SUFFIXES"]


def load(path, *, dtype, image_size=32):
    """``(x, y)`` of ``--data path``: an .npz in memory, or a store's lazy images and its labels
    (an image folder's images resized to ``image_size`` square); targets as ``dtype``
    (:func:`refconv.datasets.cast_labels`), either way."""
    if kind_of(path) == "npz":
        return datasets.load_npz(path, dtype=dtype)
    store = open_store(path, image_size=image_size)
    return StoreImages(store, range(store.shape[0]), dtype), datasets.cast_labels(store.labels, dtype)


def open_store(path, *, image_size=32):
    """The store at ``path``, checked: an image folder, a directory of .npy files or an HDF5 file."""
    if is_image_folder(path):
        return ImageFolder(path, image_size)
    return NpyDirectory(path) if kind_of(path) == "npy" else Hdf5File(path)
