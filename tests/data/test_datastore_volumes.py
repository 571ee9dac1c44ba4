"""Stores of volumes (N, C, D, H, W) with float targets (N, K), on one rank (issue 23's ``--data``).

The multi-rank checks (block-read training = in-memory training, bit for bit; bad stores
refused alike on every rank; bench data's bytes) are in tests/on_ranks/test_datastore_volumes.py.
"""

import os

import h5py
import numpy
import pytest
from mpi4py import MPI

from refconv import datasets, datastore
from refconv.datastore.convert import convert
from refconv.model_spec import conv_layer
from refconv.testing.commands import only_line, run_command
from refconv.train import load_dataset, train
from refconv.train_config import TrainConfig


def _volumes(n=10, shape=(3, 5, 4, 6), seed=0):
    rng = numpy.random.default_rng(seed)
    return rng.standard_normal((n,) + shape).astype(numpy.float32), rng.uniform(-1, 1, (n, 4)).astype(numpy.float32)


# A box per dim after the sample dim: whole, one plane range, rows, columns, and all at once; the
# .npy reader issues one read per index of the dims before the first whole trailing dims.
BOXES = [((0, 3), (0, 5), (0, 4), (0, 6)), ((1, 3), (0, 5), (0, 4), (0, 6)), ((0, 3), (2, 4), (0, 4), (0, 6)),
         ((0, 3), (0, 5), (1, 3), (0, 6)), ((2, 3), (1, 4), (0, 4), (2, 5)), ((0, 2), (4, 5), (3, 4), (5, 6))]


@pytest.mark.parametrize("box", BOXES)
def test_a_box_of_volumes_reads_what_numpy_slices(tmp_path, box):
    """Both formats, samples out of order across two shards, into a block of another dtype too
    (through a buffer): exactly ``x[samples][box]``, and bytes_read counts exactly the box."""
    x, y = _volumes()
    numpy.savez(tmp_path / "v.npz", x=x, y=y)
    convert(str(tmp_path / "v.npz"), str(tmp_path / "npy"), shard_samples=6, report=lambda line: None)
    convert(str(tmp_path / "v.npz"), str(tmp_path / "v.h5"), chunk=3, report=lambda line: None)
    samples = [7, 2, 5, 9]
    want = x[samples][(slice(None),) + tuple(slice(a, b) for a, b in box)]
    for name in ("npy", "v.h5"):
        store = datastore.open_store(str(tmp_path / name))
        for dtype in (numpy.float32, numpy.float64):
            out = numpy.empty(want.shape, dtype)
            store.read(samples, box, out)
            numpy.testing.assert_array_equal(out, want.astype(dtype), err_msg=f"{name} {dtype}")
        assert store.bytes_read == 2 * want.size * 4
        numpy.testing.assert_array_equal(store.labels, y)


def test_convert_writes_volumes_and_targets_chunked_with_progress(tmp_path):
    x, y = _volumes(n=20, shape=(2, 9, 4, 5))
    numpy.savez(tmp_path / "v.npz", x=x, y=y)
    lines = []
    convert(str(tmp_path / "v.npz"), str(tmp_path / "v.h5"), chunk=4, group=5, report=lines.append)
    assert lines == [f"convert: {k}/20 samples ({5 * k}%)" for k in (5, 10, 15, 20)]
    with h5py.File(tmp_path / "v.h5") as f:
        assert f["x"].chunks == (1, 2, 4, 4, 4) and f["y"].dtype == numpy.float32
        numpy.testing.assert_array_equal(f["x"][()], x)
        numpy.testing.assert_array_equal(f["y"][()], y)
    images, targets = datastore.load(str(tmp_path / "v.h5"), dtype=numpy.float64)
    assert images.shape == x.shape and images.ndim == 5 and targets.dtype == numpy.float64
    numpy.testing.assert_array_equal(numpy.asarray(images[[3, 1]]), x[[3, 1]].astype(numpy.float64))


@pytest.mark.parametrize("model, written", [("cosmoflow", "x (6, 4, 4, 4, 4) float32, y (6, 4) float32"),
                                            ("digits-cnn", "x (6, 1, 4, 4) float32, y (6,) int64")])
def test_data_synth_writes_what_train_synthetic_makes(capsys, tmp_path, model, written):
    out = tmp_path / "s"
    status, stdout, err = run_command(capsys, "data", "synth", str(out), "--model", model,
                                      "--synthetic-samples", "6", "--image-size", "4", "--seed", "3")
    assert status == 0 and stdout == f"wrote {out}: {written}\n" and "6/6 samples (100%)" in err, (stdout, err)
    cfg = TrainConfig(model=model, synthetic=True, synthetic_samples=6, image_size=4, seed=3)
    x, y = load_dataset(cfg, numpy.dtype(numpy.float32))[:2]              # what train --synthetic trains on
    numpy.testing.assert_array_equal(numpy.load(out / "x-00000.npy"), numpy.asarray(x))
    numpy.testing.assert_array_equal(numpy.load(out / "y.npy"), y)


def test_cosmoflow_trains_on_a_store_from_the_command_line(capsys, tmp_path):
    """``refconv train --model cosmoflow --data DIR`` on one rank: the preset takes the store's
    channels, trains, and reports its test error (2 held out of 10)."""
    run_command(capsys, "data", "synth", str(tmp_path / "s.h5"), "--model", "cosmoflow", "--synthetic-samples", "10",
                "--image-size", "4")
    status, stdout, err = run_command(capsys, "train", "--model", "cosmoflow", "--data", str(tmp_path / "s.h5"),
                                      "--batch-size", "4", "--epochs", "1", "--lr", "0.01", "--backend", "numpy",
                                      "--no-progress")
    assert status == 0 and "trained 2 steps" in stdout and "final test mse" in stdout, (stdout, err)


def _store(folder, x, y):
    os.mkdir(folder)
    numpy.save(os.path.join(folder, "x.npy"), x)
    if y is not None:
        numpy.save(os.path.join(folder, "y.npy"), y)
    return str(folder)


x, y = _volumes(shape=(4, 4, 4, 4))
BAD = {  # name: (x, y, model, the refusal)
    "six-d": (x[:, None], y, "cosmoflow", "x must be 4-D N x C x H x W, got shape (10, 1, 4, 4, 4, 4)"),
    "int-volumes": (x.astype(numpy.int16), y, "cosmoflow", "x must hold floats, got dtype int16"),
    "no-targets": (x, None, "cosmoflow", "has no y.npy; write the labels (N,) or targets (N, K) there"),
    "short-targets": (x, y[:9], "cosmoflow", "x has 10 samples but y has targets for 9"),
    "nan-targets": (x, numpy.where(numpy.arange(4) == 2, numpy.nan, y), "cosmoflow",
                    "y has NaN or inf targets (first at sample 0)"),
    "3-d-targets": (x, y[:, :, None], "cosmoflow", "y must be 1-D (one label per sample), got shape (10, 4, 1)"),
    "labels": (x, numpy.arange(10) % 2, "cosmoflow", "'cosmoflow' regresses (loss 'mse') float targets (N, K)"),
    "images-for-volumes": (x[:, :, 0], y, "cosmoflow", "holds images (4, 4, 4) per sample but 'cosmoflow' is a "
                                                       "model of dims 3; give it volumes (N, C, D, H, W)"),
    "volumes-for-images": (x, numpy.arange(10) % 2, "digits-cnn", "holds volumes (4, 4, 4, 4) per sample but "
                                                                  "'digits-cnn' is a model of dims 2"),
    "targets-for-a-classifier": (x[:, :, 0], y, "digits-cnn", "holds float targets y (N, 4), which only a "
                                                              "regression takes"),
}


@pytest.mark.parametrize("problem", sorted(BAD))
def test_a_bad_store_of_volumes_ends_train_with_one_line(capsys, tmp_path, problem):
    xs, ys, model, message = BAD[problem]
    path = _store(tmp_path / problem, xs, ys)
    status, _, err = run_command(capsys, "train", "--model", model, "--data", path, "--batch-size", "2",
                                 "--backend", "numpy", "--no-progress")
    line = only_line(err)
    assert status == 2 and line.startswith("refconv train: error: ") and message in line, line


def test_targets_of_the_wrong_length_for_a_model_file_are_refused(capsys, tmp_path):
    """A model file's head is as written (a preset's is sized to the targets): 3 outputs, 4 targets."""
    spec = tmp_path / "m.json"
    spec.write_text('{"dims": 3, "loss": "mse", "in_channels": 4, "layers": [{"type": "conv", "out": 2, "kernel": 3,'
                    ' "padding": 1}, {"type": "gap"}, {"type": "linear", "out": 3}]}')
    status, _, err = run_command(capsys, "train", "--model", str(spec), "--data", _store(tmp_path / "v", x, y),
                                 "--batch-size", "2", "--backend", "numpy", "--no-progress")
    line = only_line(err)
    assert status == 2 and "its head has 3 outputs but the data have 4 targets per sample" in line, line


def test_a_classifier_of_volumes_trains_on_class_labels(tmp_path):
    """Class labels (N,) go with a model of volumes whose loss is cross-entropy (the default)."""
    spec = {"dims": 3, "in_channels": 4, "layers": [conv_layer(2, 3, padding=1), {"type": "gap"},
                                                    {"type": "linear", "out": 3}]}
    path = _store(tmp_path / "c", x, numpy.arange(10) % 3)
    result = train(TrainConfig(model=spec, data=path, batch_size=2, epochs=1, backend="numpy", progress=False),
                   comm=MPI.COMM_SELF, log=lambda *a: None)
    assert len(result["losses"]) == 3 and 0 <= result["accuracy"] <= 1 and "mse" not in result, result  # 7 of 10 train


def test_a_regression_of_images_trains_on_float_targets(tmp_path):
    """Targets and dims are independent: float targets (N, K) also go with a model of images whose
    loss is mse; its test metric is the mean squared error."""
    spec = {"loss": "mse", "in_channels": 4, "layers": [conv_layer(2, 3, padding=1), {"type": "gap"},
                                                        {"type": "linear", "out": 4}]}
    path = _store(tmp_path / "r", x[:, :, 0], y)
    result = train(TrainConfig(model=spec, data=path, batch_size=4, epochs=1, backend="numpy", progress=False),
                   comm=MPI.COMM_SELF, log=lambda *a: None)
    assert len(result["losses"]) == 2 and result["mse"] > 0 and "accuracy" not in result, result  # 8 of 10 train
