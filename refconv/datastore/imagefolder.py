"""A folder of labelled images, one subfolder per class (torchvision's ImageFolder layout)::

    FOLDER/cat/0001.png          class 0 (the subfolders in sorted order)
    FOLDER/cat/0002.jpg
    FOLDER/dog/a.png             class 1

Sample i is the i-th file in (class, file name) order.  Each is decoded by Pillow only when a
rank reads it, as RGB, resized to ``size x size`` (bilinear) when it is not that already (with
``size`` None, kept at their size, which all must share: else a ValueError listing the sizes), and
normalised per channel: ``(pixel / 255 - MEAN[c]) / STD[c]`` (ImageNet's statistics, as
torchvision's models expect).  A rank decodes only the samples of its sample block; under a
spatial or channel split it still decodes each of its samples whole (PNG and JPEG cannot be
decoded in part) and keeps its rows, columns and channels: convert the folder to HDF5
(``refconv data convert``) to read only those.  Opening reads every file's header, so a file
that is no image is refused before training; ``bytes_read`` counts the encoded bytes of the
files read.
"""

import os

import numpy

from refconv.datastore.formats import Store

__all__ = ["ImageFolder", "is_image_folder", "normalise", "import_pillow", "EXTENSIONS", "MEAN", "STD", "TABLE"]

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
MEAN = numpy.array([0.485, 0.456, 0.406])     # per channel (R, G, B), of pixel / 255
STD = numpy.array([0.229, 0.224, 0.225])


def is_image_folder(path):
    """A directory without y.npy whose entries include a subfolder."""
    return (os.path.isdir(path) and not os.path.exists(os.path.join(path, "y.npy"))
            and any(os.path.isdir(os.path.join(path, n)) for n in os.listdir(path)))


class ImageFolder(Store):
    """The images of ``path`` as a store of ``(N, 3, size, size)`` float32 (see the module); with
    ``size`` None, of the images' own ``(N, 3, height, width)``, which must be one for all."""

    def __init__(self, path, size):
        where = f"data {os.fspath(path)!r}"
        Image = import_pillow()
        self.classes = sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))
        self.files, labels = [], []
        for k, name in enumerate(self.classes):
            folder = os.path.join(path, name)
            for f in sorted(os.listdir(folder)):
                if f.lower().endswith(EXTENSIONS):
                    self.files.append(os.path.join(folder, f))
                    labels.append(k)
        if not self.files:
            raise ValueError(f"{where}: its class subfolders {self.classes} hold no images (files ending in "
                             f"{', '.join(EXTENSIONS)})")
        sizes = {}                                           # (width, height) -> the files of that size
        for f in self.files:                                 # headers only: a non-image is refused now
            try:
                with Image.open(f) as image:
                    sizes.setdefault(image.size, []).append(os.path.relpath(f, path))
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                raise ValueError(f"{where}: {os.path.relpath(f, path)} is not a readable image ({exc})") from None
        if size is None and len(sizes) > 1:
            found = ", ".join(f"{w}x{h} ({len(names)} file{'s' if len(names) > 1 else ''}, e.g. {names[0]})"
                              for (w, h), names in sorted(sizes.items(), key=lambda item: -len(item[1])))
            raise ValueError(f"{where}: its images have {len(sizes)} sizes (width x height): {found}; give "
                             f"--image-size to resize them all to one square size")
        (width, height), = sizes if size is None else [(int(size), int(size))]
        self.hw = (height, width)                            # every sample's, resized to it where it differs
        super().__init__(path, (len(self.files), 3, height, width), numpy.float32, numpy.array(labels, numpy.int64))

    def pixels(self, i):
        """Sample ``i`` decoded: ``(height, width, 3)`` uint8, RGB."""
        Image = import_pillow()
        try:
            with Image.open(self.files[i]) as image:
                image = image.convert("RGB")
                if image.size != self.hw[::-1]:
                    image = image.resize(self.hw[::-1], Image.BILINEAR)
                return numpy.asarray(image)                                 # (height, width, 3)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.where}: {os.path.relpath(self.files[i], self.path)} cannot be decoded "
                             f"({exc})") from None

    def decode(self, i):
        """Sample ``i``: ``(3, height, width)`` float32, normalised."""
        return normalise(self.pixels(i), 0, 3)

    def read(self, samples, box, out):
        c, h, w = box
        for j, i in enumerate(samples):
            out[j] = normalise(self.pixels(i)[slice(*h), slice(*w)], *c)
        encoded = sum(os.path.getsize(self.files[i]) for i in samples)
        with self._lock:
            self.bytes_read += encoded


# TABLE[c, v] = (v / 255 - MEAN[c]) / STD[c] in float64, rounded to float32 once: the same numbers as
# normalising each pixel in float64, looked up instead of computed: 0.21 ms of CPU instead of 0.39 for an
# image of 128 x 128, whose decoding takes 0.17 ms.
TABLE = ((numpy.arange(256) / 255.0 - MEAN[:, None]) / STD[:, None]).astype(numpy.float32)   # (3, 256)


def normalise(pixels, c0, c1):
    """Channels c0..c1-1 of ``pixels`` (h, w, 3) uint8 -> ``(c1 - c0, h, w)`` float32, normalised."""
    index = pixels[:, :, c0:c1].transpose(2, 0, 1).astype(numpy.intp)       # (c1 - c0, h, w)
    out = numpy.empty(index.shape, numpy.float32)
    for k in range(c1 - c0):
        numpy.take(TABLE[c0 + k], index[k], out=out[k])
    return out


def import_pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("data: reading an image folder needs Pillow (pip install 'refconv[data]')") from None
    return Image
