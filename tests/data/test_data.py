"""refconv.datasets: the bundled digits, load_npz's errors, synthetic images and batches."""

import importlib.resources
import io
import struct
import zipfile

import numpy
import pytest

from refconv import datasets


# -- digits ---------------------------------------------------------------------------------
def test_digits_npz_ships_in_the_package():
    resource = importlib.resources.files("refconv").joinpath("data").joinpath("digits.npz")
    assert resource.is_file()
    with resource.open("rb") as f, numpy.load(f) as z:
        assert z["x"].shape == (1797, 1, 8, 8) and z["x"].max() == 16
        assert set(numpy.unique(z["y"])) == set(range(10))


def test_data_directory_is_package_data_only():
    """refconv/data/ holds data files, no code (loading lives in refconv/datasets.py)."""
    folder = importlib.resources.files("refconv").joinpath("data")
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == ["digits.npz"]


def test_load_digits_shapes_dtypes_and_split():
    x_tr, y_tr, x_te, y_te = datasets.load_digits()
    assert x_tr.shape == (1438, 1, 16, 16) and x_te.shape == (359, 1, 16, 16)
    assert x_tr.dtype == numpy.float32 and y_tr.dtype == numpy.int64
    assert len(y_tr) == len(x_tr) and len(y_te) == len(x_te)
    assert abs(float(x_tr.mean())) < 1e-5 and abs(float(x_tr.std()) - 1) < 1e-5
    # stratified: every class in the test set in proportion (~20 %)
    counts = numpy.bincount(y_te, minlength=10) / numpy.bincount(numpy.r_[y_tr, y_te])
    assert numpy.all(abs(counts - 0.2) < 0.02)
    # nearest-neighbour upsampling: 2x2 blocks are constant
    assert numpy.array_equal(x_tr[:, :, ::2, ::2], x_tr[:, :, 1::2, 1::2])


def test_load_digits_is_deterministic_and_seeded():
    a, b = datasets.load_digits(seed=3), datasets.load_digits(seed=3)
    for u, v in zip(a, b):
        assert numpy.array_equal(u, v)
    c = datasets.load_digits(seed=4)
    assert not numpy.array_equal(a[1], c[1])


def test_load_digits_options():
    x_tr, _, x_te, _ = datasets.load_digits(upsample=1, test_fraction=0.5, dtype=numpy.float64)
    assert x_tr.shape[1:] == (1, 8, 8) and x_tr.dtype == numpy.float64
    assert abs(len(x_te) - 1797 / 2) < 10
    with pytest.raises(ValueError, match="upsample"):
        datasets.load_digits(upsample=0)
    with pytest.raises(ValueError, match="test_fraction"):
        datasets.load_digits(test_fraction=1.0)


# -- load_npz -------------------------------------------------------------------------------
def _save(tmp_path, name="d.npz", **arrays):
    path = tmp_path / name
    numpy.savez(path, **arrays)
    return path


GOOD_X = numpy.zeros((4, 2, 3, 3), numpy.float32)
GOOD_Y = numpy.array([0, 1, 2, 1])


def test_load_npz_good(tmp_path):
    x, y = datasets.load_npz(_save(tmp_path, x=GOOD_X, y=GOOD_Y.astype(numpy.uint8)),
                         dtype=numpy.float64, num_classes=3)
    assert x.shape == (4, 2, 3, 3) and x.dtype == numpy.float64 and y.dtype == numpy.int64


BAD = {
    "no array y": dict(x=GOOD_X),
    "no array x": dict(y=GOOD_Y),
    "4-D": dict(x=GOOD_X[:, 0], y=GOOD_Y),
    "zero samples": dict(x=GOOD_X[:0], y=GOOD_Y[:0]),
    "empty dimension": dict(x=numpy.zeros((4, 0, 3, 3), numpy.float32), y=GOOD_Y),
    "must hold floats": dict(x=GOOD_X.astype(numpy.uint8), y=GOOD_Y),
    "1-D": dict(x=GOOD_X, y=GOOD_Y[:, None]),
    "integer class labels": dict(x=GOOD_X, y=GOOD_Y.astype(numpy.float32)),
    "4 samples but y has 3": dict(x=GOOD_X, y=GOOD_Y[:3]),
    "NaN or inf": dict(x=numpy.where(numpy.arange(72).reshape(4, 2, 3, 3) == 5, numpy.inf, GOOD_X),
                       y=GOOD_Y),
    "negative labels": dict(x=GOOD_X, y=numpy.array([0, -1, 2, 1])),
}


@pytest.mark.parametrize("problem", sorted(BAD))
def test_load_npz_rejects(tmp_path, problem):
    with pytest.raises(ValueError, match=problem):
        datasets.load_npz(_save(tmp_path, **BAD[problem]))


def test_load_npz_label_above_num_classes(tmp_path):
    path = _save(tmp_path, x=GOOD_X, y=GOOD_Y)
    with pytest.raises(ValueError, match="num_classes = 2"):
        datasets.load_npz(path, num_classes=2)


def test_load_npz_missing_file_and_directory(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        datasets.load_npz(tmp_path / "nope.npz")
    with pytest.raises(ValueError, match="is a directory"):
        datasets.load_npz(tmp_path)


@pytest.mark.parametrize("content", [b"", b"not an archive at all", b"PK\x03\x04garbage"])
def test_load_npz_unreadable(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a readable .npz"):
        datasets.load_npz(path)


def test_load_npz_single_array_and_object_arrays(tmp_path):
    numpy.save(tmp_path / "one.npy", GOOD_X)
    with pytest.raises(ValueError, match="single array"):
        datasets.load_npz(tmp_path / "one.npy")
    path = _save(tmp_path, x=numpy.array([None, 1], dtype=object), y=GOOD_Y)
    with pytest.raises(ValueError, match="cannot read x and y"):
        datasets.load_npz(path)


def test_split_is_stratified_and_disjoint():
    x = numpy.arange(100)
    y = numpy.repeat([0, 1, 2, 3], 25)
    x_tr, y_tr, x_te, y_te = datasets.split(x, y, 0.2, seed=1)
    assert sorted(numpy.r_[x_tr, x_te]) == list(range(100))
    assert list(numpy.bincount(y_te)) == [5, 5, 5, 5]


# -- synthetic ------------------------------------------------------------------------------
def test_synthetic_is_deterministic_and_lazy():
    x, y = datasets.synthetic(12, 3, 20, 24, 5, seed=7)
    assert x.shape == (12, 3, 20, 24) and len(x) == 12 and y.dtype == numpy.int64
    full = numpy.asarray(x)
    assert full.dtype == numpy.float32 and full.shape == x.shape
    x2, y2 = datasets.synthetic(12, 3, 20, 24, 5, seed=7)
    assert numpy.array_equal(y, y2) and numpy.array_equal(full, numpy.asarray(x2))
    idx = numpy.array([5, 0, 11])
    assert numpy.array_equal(x[idx], full[idx])          # any subset, same values
    assert numpy.array_equal(x[3:6], full[3:6]) and numpy.array_equal(x[-1], full[-1])
    x3, _ = datasets.synthetic(12, 3, 20, 24, 5, seed=8)
    assert not numpy.array_equal(full, numpy.asarray(x3))


def test_synthetic_is_learnable():
    """Nearest class mean (from the noisy training half) classifies the other half well."""
    x, y = datasets.synthetic(200, 2, 16, 16, 4, seed=0)
    x = numpy.asarray(x).reshape(200, -1)
    means = numpy.stack([x[:100][y[:100] == k].mean(0) for k in range(4)])
    pred = numpy.argmin(((x[100:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y[100:]).mean() > 0.9


def test_a_synthetic_test_part_is_other_samples_of_the_same_classes():
    """part=1 (what refconv train tests on) shares the class patterns of part 0 and nothing else:
    each class's mean image correlates near 1 across the parts (it was 0.00 when the test set took
    seed + 1), while labels and noise differ.  Volumes keep their patterns likewise."""
    x, y = datasets.synthetic(400, 2, 12, 12, 4, seed=5)
    xt, yt = datasets.synthetic(400, 2, 12, 12, 4, seed=5, part=1)
    assert not numpy.array_equal(y, yt) and not numpy.array_equal(numpy.asarray(x[:1]), numpy.asarray(xt[:1]))
    a, b = (numpy.asarray(v).reshape(len(v), -1) for v in (x, xt))
    for k in range(4):
        r = numpy.corrcoef(a[y == k].mean(0), b[yt == k].mean(0))[0, 1]
        assert r > 0.9, f"class {k}: the parts' mean images correlate at {r:.2f}"
    v, t = datasets.synthetic_volumes(3, 2, 4, seed=5)
    vt, tt = datasets.synthetic_volumes(3, 2, 4, seed=5, part=1)
    assert not numpy.array_equal(t, tt)
    for attr in ("_axes", "_sign"):
        assert numpy.array_equal(numpy.asarray(getattr(v, attr)), numpy.asarray(getattr(vt, attr)))


def test_synthetic_part_0_is_unchanged_by_parts():
    """The training samples are what they were before the test part existed (seeds [seed, 0] for
    the labels, [seed, 1, i] for sample i's noise): checkpoints and recorded runs still replay."""
    x, y = datasets.synthetic(3, 1, 2, 2, 4, seed=7)
    assert numpy.array_equal(y, numpy.random.default_rng([7, 0]).integers(0, 4, size=3))
    noise = numpy.random.default_rng([7, 1, 2]).standard_normal(4).reshape(1, 2, 2)
    pattern = numpy.asarray(x[2], numpy.float64) - noise
    same_class = [i for i in range(3) if y[i] == y[2]]
    assert all(numpy.allclose(numpy.asarray(x[i], numpy.float64)
                              - numpy.random.default_rng([7, 1, i]).standard_normal(4).reshape(1, 2, 2),
                              pattern, atol=1e-6) for i in same_class)


# -- batches and rank blocks -----------------------------------------------------------------
@pytest.mark.parametrize("n,b,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (5, 8, False)])
def test_batches_cover_each_sample_once(n, b, drop_last):
    x = numpy.arange(n, dtype=numpy.float32).reshape(n, 1, 1, 1)
    y = numpy.arange(n)
    got = list(datasets.batches(x, y, b, seed=1, epoch=2, drop_last=drop_last))
    assert len(got) == datasets.num_batches(n, b, drop_last=drop_last)
    seen = numpy.concatenate([yb for _, yb in got])
    assert all(numpy.array_equal(xb.reshape(-1), yb) for xb, yb in got)
    if drop_last:
        assert all(len(yb) == b for _, yb in got) and len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == list(range(n))


def test_batches_are_deterministic_and_resumable():
    x, y = numpy.zeros((20, 1, 1, 1)), numpy.arange(20)
    order = lambda **kw: numpy.concatenate([yb for _, yb in datasets.batches(x, y, 6, **kw)])
    assert numpy.array_equal(order(seed=1, epoch=3), order(seed=1, epoch=3))
    assert not numpy.array_equal(order(seed=1, epoch=3), order(seed=1, epoch=4))
    assert numpy.array_equal(order(seed=1, epoch=0, shuffle=False), numpy.arange(20))
    assert numpy.array_equal(order(seed=1, epoch=3, start=2), order(seed=1, epoch=3)[12:])


def test_batches_of_synthetic_images():
    x, y = datasets.synthetic(9, 1, 4, 4, 3, seed=2)
    for xb, yb in datasets.batches(x, y, 4, seed=0, epoch=0):
        assert isinstance(xb, numpy.ndarray) and xb.shape[1:] == (1, 4, 4)


def _npy(shape, data, header_padding=0):
    """The bytes of a version 1.0 .npy whose header claims ``shape`` (float32) over ``data``."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (shape,) + " " * header_padding
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    if len(header) < 65536:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header.encode() + data


@pytest.mark.parametrize("shape, padding, message", [
    ((100_000, 3, 1000, 1000), 0, r"its array x claims shape \(100000, 3, 1000, 1000\) of float32 "
                                  r"\(1,200,000,000,000 bytes\) but holds 64 bytes"),
    ((1, 1, 2, 2), 2_000_000, "Header info length"),
])
def test_load_npz_refuses_a_header_bomb(tmp_path, shape, padding, message):
    """A header claiming terabytes over 64 bytes (numpy would try to allocate them: a MemoryError,
    exit 1) or a header of megabytes: a ValueError naming the file, before any allocation."""
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", _npy(shape, numpy.zeros(16, numpy.float32).tobytes(), padding))
        buffer = io.BytesIO()
        numpy.save(buffer, numpy.zeros(1, numpy.int64))
        archive.writestr("y.npy", buffer.getvalue())
    with pytest.raises(ValueError, match=f"data file '.*bomb.npz': cannot read x and y \\({message}"):
        datasets.load_npz(path)
