"""Data stores read block by block (refconv.datastore): the block a rank reads is what it would
extract from the global batch, bit for bit, and its size is exactly its block's; bad files are
refused before training with one line and status 2; the prefetch thread keeps the order.

The multi-rank check (block-read training equals in-memory training, bit for bit, at 1 to 4
ranks on sample, spatial and channel splits) is tests/on_ranks/test_datastore.py.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import h5py
import numpy
import pytest

from refconv import cli, datasets, datastore
from refconv.datastore import prefetch
from refconv.distribution import Distribution, Split
from refconv.testing.commands import only_line, run_command
from refconv.testing.mpirun import find_mpiexec
from refconv.train import train
from refconv.train_config import TrainConfig

X = numpy.random.default_rng(0).standard_normal((23, 6, 9, 10)).astype(numpy.float32)   # (N, C, H, W)
Y = numpy.arange(23) % 4


def write_npy(folder, x=X, y=Y, shards=(0, 7, 15)):
    """x in shards starting at the sample numbers ``shards`` (one shard: x.npy), and y.npy."""
    os.makedirs(folder, exist_ok=True)
    if len(shards) == 1:
        numpy.save(os.path.join(folder, "x.npy"), x)
    bounds = list(shards) + [len(x)]
    for k in range(len(shards) if len(shards) > 1 else 0):
        numpy.save(os.path.join(folder, f"x-{k:05d}.npy"), x[bounds[k]:bounds[k + 1]])
    numpy.save(os.path.join(folder, "y.npy"), y)
    return str(folder)


def write_h5(path, x=X, y=Y):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(1, x.shape[1], 4, 4))
        f.create_dataset("y", data=y)
    return str(path)


@pytest.fixture(params=["npy", "npy-one-shard", "hdf5"])
def store_path(request, tmp_path):
    if request.param == "hdf5":
        return write_h5(tmp_path / "d.h5")
    return write_npy(tmp_path / "d", shards=(0,) if request.param == "npy-one-shard" else (0, 7, 15))


# Layouts of a batch of 8: the grid shape (P_N, P_c, P_H, P_W) and the dims, including the
# Stationary-W channel split whose rank holds several pieces of C.
LAYOUTS = [
    ((1, 1, 1, 1), ("sample", "channel", "height", "width")),
    ((4, 1, 1, 1), ("sample", None, None, None)),
    ((1, 1, 2, 2), ("sample", None, "height", "width")),
    ((2, 1, 3, 1), ("sample", None, "height", "width")),
    ((2, 3, 1, 1), ("sample", "channel", "height", "width")),
    ((1, 4, 1, 1), (None, Split.stationary_w_channels(4, 2), None, None)),
]


@pytest.mark.parametrize("grid_shape, dims", LAYOUTS)
def test_a_block_is_what_extract_takes_from_the_batch_and_only_that_is_read(store_path, grid_shape, dims):
    x, y = datastore.load(store_path, dtype=numpy.float64)
    assert isinstance(x, datastore.StoreImages) and numpy.array_equal(y, Y) and x.shape == X.shape
    idx = numpy.random.default_rng([1, 2]).permutation(23)[:8]
    d = Distribution(grid_shape, (8,) + X.shape[1:], dims)
    for rank in range(int(numpy.prod(grid_shape))):
        before = x.store.bytes_read
        got = datastore.local_block(x[idx], d, rank)
        expected = d.extract(X[idx].astype(numpy.float64), rank)       # the in-memory path
        assert got.dtype == numpy.float64 and numpy.array_equal(got, expected), rank
        assert x.store.bytes_read - before == expected.size * X.itemsize   # the block, exactly


def test_indexing_reads_nothing_and_a_split_keeps_store_images(store_path):
    x, y = datastore.load(store_path, dtype=numpy.float32)
    x_train, y_train, x_test, y_test = datasets.split(x, y, 0.2, seed=3)
    m_train, _, m_test, _ = datasets.split(X, Y, 0.2, seed=3)
    assert isinstance(x_train, datastore.StoreImages) and x.store.bytes_read == 0
    assert numpy.array_equal(numpy.asarray(x_train), m_train) and numpy.array_equal(numpy.asarray(x_test), m_test)
    assert numpy.array_equal(x_test[2], m_test[2])


def test_a_nan_is_refused_where_it_is_read(tmp_path):
    bad = X.copy()
    bad[11, 2, 3, 4] = numpy.nan
    x, _ = datastore.load(write_npy(tmp_path / "d", x=bad), dtype=numpy.float32)
    d = Distribution((2, 1, 1, 1), (4,) + X.shape[1:], ("sample", None, None, None))
    assert datastore.local_block(x[[0, 1, 11, 12]], d, 0).shape == (2, 6, 9, 10)   # rank 0 misses it
    with pytest.raises(ValueError, match="sample 11 of x has NaN or inf values"):
        datastore.local_block(x[[0, 1, 11, 12]], d, 1)


# -- prefetch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [1, 3])
def test_prefetch_keeps_the_order_and_reads_each_block_once(store_path, depth):
    x, y = datastore.load(store_path, dtype=numpy.float32)
    d = Distribution((2, 1, 1, 2), (4,) + X.shape[1:], ("sample", None, "height", "width"))
    order = dict(seed=5, epoch=2, drop_last=True, start=1)
    plain = [(d.extract(numpy.asarray(x_b), 3), y_b) for x_b, y_b in datasets.batches(x, y, 4, **order)]
    x.store.bytes_read = 0
    ahead = prefetch.batches(x, y, 4, distribution=d, rank=3, depth=depth, **order)
    assert isinstance(ahead, prefetch.Prefetcher)
    got = [(datastore.local_block(x_b, d, 3), y_b) for x_b, y_b in ahead]
    assert len(got) == len(plain) == 4
    for (a, ya), (b, yb) in zip(got, plain):
        assert numpy.array_equal(a, b) and numpy.array_equal(ya, yb)
    assert x.store.bytes_read == sum(a.nbytes for a, _ in got)          # read ahead once, never again


def _queued(ahead, n):
    for _ in range(3000):                              # until n are queued (a bound, not a timing)
        if ahead._queue.qsize() == n:
            return True
        ahead._thread.join(0.02)
    return False


def test_prefetch_reads_into_depth_plus_one_blocks_reused_once_let_go(store_path):
    """depth 1: the thread reads into 2 blocks.  While the step holds batch 1 and the first layer
    still holds batch 0, none is free and the thread reads nothing; once batch 0 is let go, batch 2
    is read into its block, and holds batch 2's values."""
    x, y = datastore.load(store_path, dtype=numpy.float32)
    block = 2 * 6 * 9 * 10 * 4                         # bytes of one block: 2 samples, all of each
    d = Distribution((1, 1, 1, 1), (2,) + X.shape[1:], ("sample", None, None, None))
    order = dict(seed=0, epoch=0, drop_last=True)
    expected = [d.extract(numpy.asarray(x_b), 0) for x_b, _ in datasets.batches(x, y, 2, **order)][:3]
    x.store.bytes_read = 0
    ahead = prefetch.batches(x, y, 2, distribution=d, rank=0, depth=1, **order)
    first, _ = next(ahead)                             # the step trains on batch 0 ...
    assert _queued(ahead, 1) and x.store.bytes_read == 2 * block       # ... while batch 1 is read
    second, _ = next(ahead)                            # batch 1 taken; batch 0 still held (the first layer)
    ahead._thread.join(0.2)
    assert ahead._queue.qsize() == 0 and x.store.bytes_read == 2 * block   # no block free: nothing read
    reused = first.block(d, 0)
    del first                                          # the first layer lets go of batch 0
    ahead._thread.join(0.2)
    assert ahead._queue.qsize() == 0                   # still held here, by `reused`
    del reused
    assert _queued(ahead, 1) and x.store.bytes_read == 3 * block
    third, _ = next(ahead)
    got = third.block(d, 0)
    assert any(numpy.shares_memory(got, b) for b in ahead.pool.blocks) and len(ahead.pool.blocks) == 2
    assert numpy.array_equal(got, expected[2]) and numpy.array_equal(second.block(d, 0), expected[1])
    ahead.close()
    ahead._thread.join(30)
    assert not ahead._thread.is_alive()


def test_prefetch_makes_no_block_while_the_step_takes_one_it_was_put(store_path):
    """The step holds batch 0 and takes batch 1, so both blocks of the pool are held; the thread,
    looking for a block for batch 2 in the moment after the step's get, must wait, not make a
    third (the step waits for no batch then).  The get is slowed to hold that moment open."""
    x, y = datastore.load(store_path, dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (2,) + X.shape[1:], ("sample", None, None, None))
    ahead = prefetch.batches(x, y, 2, distribution=d, rank=0, depth=1, seed=0, epoch=0, drop_last=True)
    first, _ = next(ahead)
    assert _queued(ahead, 1)                           # batch 1 read into the pool's second block
    pool = list(ahead.pool.blocks)
    get = ahead._queue.get

    def slow_get():
        item = get()
        ahead._thread.join(0.3)                        # the thread looks for a block meanwhile
        return item

    ahead._queue.get = slow_get
    second, _ = next(ahead)
    assert [b is a for a, b in zip(pool, ahead.pool.blocks)] == [True, True], "a third block was made"
    ahead.close()
    ahead._thread.join(30)
    assert not ahead._thread.is_alive() and first is not None and second is not None


def test_prefetch_raises_the_thread_s_error_in_the_training_thread(tmp_path):
    bad = X.copy()
    bad[:, 0, 0, 0] = numpy.inf
    x, y = datastore.load(write_npy(tmp_path / "d", x=bad), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + X.shape[1:], ("sample", None, None, None))
    with pytest.raises(ValueError, match="NaN or inf"):
        next(prefetch.batches(x, y, 4, distribution=d, rank=0, seed=0))


def test_images_in_memory_are_not_prefetched():
    d = Distribution((1, 1, 1, 1), (4,) + X.shape[1:], ("sample", None, None, None))
    assert not isinstance(prefetch.batches(X, Y, 4, distribution=d, rank=0, seed=0), prefetch.Prefetcher)


# -- bad files: one line, status 2, before training ----------------------------------------------------
def _truncate(path, keep=-40):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) + keep)


def _bad_npy(tmp_path, problem):
    folder = write_npy(tmp_path / problem)
    if problem == "truncated":
        _truncate(os.path.join(folder, "x-00001.npy"))
    elif problem == "missing-shard":
        os.remove(os.path.join(folder, "x-00001.npy"))
    elif problem == "missing-last-shard":
        os.remove(os.path.join(folder, "x-00002.npy"))
    elif problem == "wrong-dtype":
        numpy.save(os.path.join(folder, "x-00002.npy"), (X[15:] * 10).astype(numpy.int32))
    elif problem == "wrong-shape":
        numpy.save(os.path.join(folder, "x-00002.npy"), X[15:, :, :8])
    elif problem == "three-d":
        for k in range(3):
            os.remove(os.path.join(folder, f"x-{k:05d}.npy"))
        numpy.save(os.path.join(folder, "x.npy"), X[:, 0])
    elif problem == "no-labels":
        os.remove(os.path.join(folder, "y.npy"))
    elif problem == "float-labels":
        numpy.save(os.path.join(folder, "y.npy"), Y.astype(numpy.float32))
    elif problem == "truncated-labels":
        _truncate(os.path.join(folder, "y.npy"), keep=-8)
    return folder


BAD_NPY = {
    "truncated": "x-00001.npy is truncated: its header says (8, 6, 9, 10) of float32 (17,280 bytes) but it holds 17,240",
    "missing-shard": "shard x-00001.npy is missing",
    "missing-last-shard": "the shards x-00000.npy .. x-00001.npy hold 15 samples but y.npy has 23 labels; is a "
                          "shard after x-00001.npy missing?",
    "wrong-dtype": "x-00002.npy: x must hold floats, got dtype int32",
    "wrong-shape": "x-00002.npy holds (6, 8, 10) samples of float32 but x-00000.npy holds (6, 9, 10) of float32",
    "three-d": "x must be 4-D N x C x H x W, got shape (23, 9, 10) (one channel? use x[:, None])",
    "no-labels": "has no y.npy",
    "float-labels": "y must hold integer class labels, got dtype float32",
    "truncated-labels": "y.npy is truncated",
}


def _bad_h5(tmp_path, problem):
    path = write_h5(tmp_path / "d.h5")
    if problem == "truncated":
        _truncate(path, keep=-4000)
    elif problem == "no-x":
        with h5py.File(path, "a") as f:
            del f["x"]
    elif problem == "wrong-dtype":
        with h5py.File(path, "a") as f:
            del f["x"]
            f["x"] = (X * 10).astype(numpy.int16)
    elif problem == "wrong-shape":
        with h5py.File(path, "a") as f:
            del f["x"]
            f["x"] = X[:, 0]
    elif problem == "short-labels":
        with h5py.File(path, "a") as f:
            del f["y"]
            f["y"] = Y[:20]
    elif problem == "not-hdf5":
        with open(path, "wb") as f:
            f.write(b"not an HDF5 file at all")
    return path


BAD_H5 = {
    "truncated": "is not a readable HDF5 file",
    "no-x": "has no dataset x (it holds ['y'])",
    "wrong-dtype": "x must hold floats, got dtype int16",
    "wrong-shape": "x must be 4-D N x C x H x W, got shape (23, 9, 10)",
    "short-labels": "x has 23 samples but y has 20 labels",
    "not-hdf5": "is not a readable HDF5 file",
}


@pytest.mark.parametrize("kind, problem", [("npy", p) for p in sorted(BAD_NPY)] + [("hdf5", p) for p in sorted(BAD_H5)])
def test_a_bad_store_is_refused_before_training(capsys, tmp_path, kind, problem):
    path, message = (_bad_npy(tmp_path, problem), BAD_NPY[problem]) if kind == "npy" else \
        (_bad_h5(tmp_path, problem), BAD_H5[problem])
    status, _, err = run_command(capsys, "train", "--backend", "numpy", "--no-progress", "--data", path)
    line = only_line(err)
    assert status == 2 and line.startswith("refconv train: error: data ") and message in line, line


@pytest.mark.mpi
def test_a_missing_shard_ends_every_rank_with_one_line(tmp_path):
    folder = _bad_npy(tmp_path, "missing-shard")
    r = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "refconv.cli", "train", "--backend", "numpy",
                        "--no-progress", "--data", folder], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    ours = [line for line in r.stderr.splitlines() if line.startswith("refconv train: error:")]
    assert r.returncode == 2 and len(ours) == 1 and "shard x-00001.npy is missing" in ours[0], r.stderr
    assert "Traceback" not in r.stderr


def test_the_data_figure_is_drawn_from_the_layout(tmp_path):
    """docs/figures/data_figure.py: its blocks cover the batch's samples and rows once each (they
    come from Distribution), and it writes a PNG."""
    script = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures" / "data_figure.py"
    spec = importlib.util.spec_from_file_location("data_figure", script)
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    cover = numpy.zeros((fig.BATCH, fig.H, fig.W), int)
    for (n0, n1), (h0, h1), (w0, w1) in fig.blocks():
        cover[n0:n1, h0:h1, w0:w1] += 1
    assert (cover == 1).all() and len(fig.blocks()) == 4
    fig.draw(str(tmp_path / "data.png"))
    assert (tmp_path / "data.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_run_on_a_store_continues_the_same_batches(tmp_path):
    """Checkpoint mid-epoch, resume: the losses after it are those of the run that went on
    (the prefetch thread starts at the resumed batch), and --check-serial replays from the store."""
    x, y, _, _ = datasets.load_digits(upsample=1)
    folder = write_npy(tmp_path / "digits", x=x[:80], y=y[:80], shards=(0, 33))
    cfg = dict(data=folder, batch_size=8, epochs=2, backend="numpy", progress=False, dtype="float64")
    whole = train(TrainConfig(**cfg, check_serial=3), log=lambda *a: None)
    assert whole["serial_check"] is not None and whole["serial_check"] <= 1e-6
    first = train(TrainConfig(**cfg, max_steps=11, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=11),
                  log=lambda *a: None)
    rest = train(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "ck"), resume=True), log=lambda *a: None)
    assert first["losses"] == whole["losses"][:11] and rest["losses"] == whole["losses"][11:], (first, rest)


@pytest.mark.parametrize("kind", ["npy", "hdf5"])
def test_refconv_train_takes_a_store(capsys, tmp_path, kind):
    x, y, _, _ = datasets.load_digits(upsample=1)
    path = write_h5(tmp_path / "d.h5", x[:48], y[:48]) if kind == "hdf5" else write_npy(tmp_path / "d", x[:48], y[:48])
    status = cli.main(["train", "--backend", "numpy", "--no-progress", "--data", path, "--batch-size", "8",
                       "--epochs", "1", "--prefetch", "2"])
    out = capsys.readouterr().out
    assert status == 0 and "train 38 / test 10 samples" in out and "trained 4 steps" in out, out
