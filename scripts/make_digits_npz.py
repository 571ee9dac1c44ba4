"""One-off: write refconv/data/digits.npz from scikit-learn's bundled digits.

scikit-learn ships the UCI optical-recognition digits (1797 images of 8 x 8,
grey levels 0..16) inside its wheel; this copies them into refconv so that
refconv needs neither scikit-learn nor a download at run time::

    .venv/bin/python scripts/make_digits_npz.py

x: uint8 (1797, 1, 8, 8) in 0..16 (NCHW, one channel); y: int64 (1797,) in 0..9.
"""

import pathlib

import numpy
from sklearn.datasets import load_digits

OUT = pathlib.Path(__file__).resolve().parent.parent / "refconv" / "data" / "digits.npz"


def main():
    digits = load_digits()
    x = digits.images.astype(numpy.uint8).reshape(-1, 1, 8, 8)   # values are exact integers 0..16
    assert numpy.array_equal(x.reshape(len(x), -1), digits.data)
    y = digits.target.astype(numpy.int64)
    numpy.savez_compressed(OUT, x=x, y=y)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): x {x.shape} {x.dtype}, y {y.shape} {y.dtype}")


if __name__ == "__main__":
    main()
