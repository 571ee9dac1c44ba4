"""Image folders (class-per-subfolder) and ``refconv data convert``: a rank decodes only its
samples; convert writes exactly what the source holds; the folder trains; bad input is one line.
The test builds its own small image folder (no downloads)."""

import os

import h5py
import numpy
import pytest
from PIL import Image

from refconv import cli, datasets, datastore
from refconv.datastore import convert, imagefolder
from refconv.distribution import Distribution
from refconv.testing.commands import only_line, run_command
from refconv.train import train
from refconv.train_config import TrainConfig

CLASSES = ("bright", "dark", "stripes")


def make_folder(root, per_class=10, size=12, seed=0):
    """Three learnable classes of RGB PNGs (and one greyscale JPEG, converted to RGB on reading)."""
    rng = numpy.random.default_rng(seed)
    for k, name in enumerate(CLASSES):
        os.makedirs(os.path.join(root, name))
        for i in range(per_class):
            a = rng.uniform(0, 80, (size, size, 3))
            if k == 0:
                a += 150
            if k == 2:
                a[::2] += 150
            Image.fromarray(a.astype(numpy.uint8)).save(os.path.join(root, name, f"{i:03d}.png"))
    Image.fromarray(rng.integers(0, 90, (size + 4, size), dtype=numpy.uint8), "L").save(
        os.path.join(root, "dark", "grey.jpg"))
    open(os.path.join(root, "dark", "notes.txt"), "w").write("not an image: skipped by its extension\n")
    return str(root)


def test_an_image_folder_is_a_store_of_normalised_rgb(tmp_path):
    folder = make_folder(tmp_path / "f")
    x, y = datastore.load(folder, dtype=numpy.float32, image_size=12)
    assert x.shape == (31, 3, 12, 12) and list(y) == [0] * 10 + [1] * 11 + [2] * 10
    store = x.store
    first = numpy.asarray(Image.open(os.path.join(folder, "bright", "000.png")), numpy.float64) / 255
    expected = ((first - imagefolder.MEAN) / imagefolder.STD).transpose(2, 0, 1).astype(numpy.float32)
    assert numpy.array_equal(x[0], expected)
    assert x[20].shape == (3, 12, 12) and store.files[20].endswith("grey.jpg")      # resized, made RGB


def test_the_normalisation_table_gives_the_float64_formula_bit_for_bit():
    """Every value 0..255 of every channel, and a piece of the channels: the table lookup equals
    (v / 255 - MEAN) / STD computed in float64 and rounded to float32 (an independent oracle)."""
    pixels = numpy.arange(256, dtype=numpy.uint8).repeat(3).reshape(16, 16, 3)
    oracle = ((pixels / 255.0 - imagefolder.MEAN) / imagefolder.STD).transpose(2, 0, 1).astype(numpy.float32)
    assert numpy.array_equal(imagefolder.normalise(pixels, 0, 3), oracle)
    assert numpy.array_equal(imagefolder.normalise(pixels[2:7, 1:4], 1, 3), oracle[1:, 2:7, 1:4])


def test_a_rank_decodes_only_the_samples_of_its_block(tmp_path):
    folder = make_folder(tmp_path / "f")
    x, _ = datastore.load(folder, dtype=numpy.float32, image_size=12)
    idx = numpy.array([3, 17, 25, 8, 30, 11])
    d = Distribution((3, 1, 2, 1), (6, 3, 12, 12), ("sample", None, "height", None))
    for rank in range(6):
        before = x.store.bytes_read
        block = datastore.local_block(x[idx], d, rank)
        read = x.store.bytes_read - before
        mine = idx[slice(*d.pieces(rank, 0)[0])]
        assert read == sum(os.path.getsize(x.store.files[i]) for i in mine)
        assert numpy.array_equal(block, d.extract(numpy.asarray(x[idx]), rank))


def test_the_image_folder_trains(tmp_path):
    folder = make_folder(tmp_path / "f", per_class=16)
    result = train(TrainConfig(data=folder, image_size=12, batch_size=8, epochs=3, backend="numpy", progress=False,
                               lr=0.05), log=lambda *a: None)
    assert result["losses"][-1] < result["losses"][0] and result["accuracy"] > 0.8, result["epochs"]


@pytest.mark.parametrize("output", ["out.h5", "shards"])
def test_convert_writes_what_the_source_holds(tmp_path, output):
    x, y, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    numpy.savez(tmp_path / "d.npz", x=x[:50], y=y[:50])
    lines = []
    shape, dtype = convert.convert(str(tmp_path / "d.npz"), str(tmp_path / output), chunk=4, shard_samples=16,
                                   group=7, report=lines.append)
    assert shape == (50, 1, 8, 8) and dtype == numpy.float64
    assert lines[-1] == "convert: 50/50 samples (100%)" and len(lines) <= 10
    stored, labels = datastore.load(str(tmp_path / output), dtype=numpy.float64)
    assert numpy.array_equal(numpy.asarray(stored), x[:50]) and numpy.array_equal(labels, y[:50])
    if output == "out.h5":
        with h5py.File(tmp_path / output) as f:
            assert f["x"].chunks == (1, 1, 4, 4) and f["x"].dtype == numpy.float64
    else:
        assert sorted(os.listdir(tmp_path / output)) == [f"x-{k:05d}.npy" for k in range(4)] + ["y.npy"]


def test_convert_an_image_folder_decodes_once_as_training_would(tmp_path, capsys):
    folder = make_folder(tmp_path / "f")
    assert cli.main(["data", "convert", folder, str(tmp_path / "f.h5"), "--image-size", "12"]) == 0
    out, err = capsys.readouterr()
    assert out == f"wrote {tmp_path / 'f.h5'}: x (31, 3, 12, 12) float32, y (31,) int64\n"
    assert err.splitlines()[-1] == "convert: 31/31 samples (100%)"
    direct, y = datastore.load(folder, dtype=numpy.float32, image_size=12)
    stored, labels = datastore.load(str(tmp_path / "f.h5"), dtype=numpy.float32)
    assert numpy.array_equal(numpy.asarray(direct), numpy.asarray(stored)) and numpy.array_equal(y, labels)


def _main(capsys, *argv):
    status, _, err = run_command(capsys, *argv)
    return status, only_line(err)


def test_bad_image_folders_and_conversions_are_one_line(tmp_path, capsys):
    folder = make_folder(tmp_path / "f")
    open(os.path.join(folder, "bright", "broken.png"), "wb").write(b"\x89PNG not really")
    status, line = _main(capsys, "train", "--backend", "numpy", "--data", folder)
    assert status == 2 and "bright/broken.png is not a readable image" in line, line
    os.makedirs(tmp_path / "empty" / "a")
    status, line = _main(capsys, "train", "--backend", "numpy", "--data", str(tmp_path / "empty"))
    assert status == 2 and "its class subfolders ['a'] hold no images" in line, line
    (tmp_path / "taken.h5").write_bytes(b"")
    status, line = _main(capsys, "data", "convert", folder, str(tmp_path / "taken.h5"))
    assert status == 2 and line.endswith("taken.h5' exists; remove it or choose another name (nothing is "
                                         "overwritten)"), line
    status, line = _main(capsys, "data", "convert", str(tmp_path / "none.npz"), str(tmp_path / "o.h5"))
    assert status == 2 and "none.npz' does not exist" in line, line


# -- refconv data: no resize unless asked, one size or a clear error, each subcommand's own errors ------
def test_convert_keeps_the_images_size_unless_asked_and_lists_mixed_sizes(capsys, tmp_path):
    """A folder of 40x48 images converts to (N, 3, 48, 40), not squashed to 32x32 (issue 35);
    --image-size resizes; a folder of several sizes without it is one line listing them."""
    root = tmp_path / "f"
    for k, name in enumerate(("a", "b")):
        os.makedirs(root / name)
        for i in range(3):
            Image.fromarray(numpy.full((48, 40, 3), 60 * k + i, numpy.uint8)).save(root / name / f"{i}.png")
    status, out, err = run_command(capsys, "data", "convert", str(root), str(tmp_path / "kept.h5"))
    assert status == 0 and "x (6, 3, 48, 40) float32" in out, err
    status, out, err = run_command(capsys, "data", "convert", str(root), str(tmp_path / "sq.h5"), "--image-size", "16")
    assert status == 0 and "x (6, 3, 16, 16) float32" in out, err
    Image.fromarray(numpy.zeros((20, 30, 3), numpy.uint8)).save(root / "b" / "odd.png")
    status, _, err = run_command(capsys, "data", "convert", str(root), str(tmp_path / "mixed.h5"))
    assert status == 2 and only_line(err) == (
        f"refconv data convert: error: data {str(root)!r}: its images have 2 sizes (width x height): 40x48 (6 files, e.g. "
        f"a/0.png), 30x20 (1 file, e.g. b/odd.png); give --image-size to resize them all to one square size")
    assert not os.path.exists(tmp_path / "mixed.h5")


def test_data_synth_takes_samples_and_each_subcommand_reports_its_own_errors(capsys, tmp_path):
    status, out, err = run_command(capsys, "data", "synth", str(tmp_path / "s.h5"), "--samples", "6",
                                   "--image-size", "4")
    assert status == 0 and "x (6, 1, 4, 4) float32" in out, err       # digits-cnn's one channel
    status, _, err = run_command(capsys, "data", "synth", str(tmp_path / "t.h5"), "--bogus", "6")
    lines = err.strip().splitlines()
    assert status == 2 and lines[0].startswith("usage: refconv data synth ") and \
        lines[-1] == "refconv data synth: error: unrecognized arguments: --bogus 6", err
    status, _, err = run_command(capsys, "train", "--bogus")
    assert status == 2 and err.strip().splitlines()[-1] == "refconv train: error: unrecognized arguments: --bogus"
