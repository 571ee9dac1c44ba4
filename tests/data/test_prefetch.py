"""The prefetch reader process (refconv.datastore.prefetch.ProcessPrefetcher): the blocks it reads
are the in-memory path's, bit for bit; it reads into ``depth + 1`` shared blocks, reused once let
go; a caller that keeps every block never hangs; an error is raised at its batch; and the process
ends on every route out (the end, an error, close, its own death), without a hang.

The thread reader's tests are in tests/data/test_datastore.py; both readers train bit for bit as in
memory at 1 to 4 ranks in tests/on_ranks/test_datastore.py.
"""

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy
import pytest
from PIL import Image

from refconv import datasets, datastore
from refconv.datastore import prefetch
from refconv.distribution import Distribution

X = numpy.random.default_rng(1).standard_normal((14, 3, 6, 8)).astype(numpy.float32)   # (N, C, H, W)
Y = numpy.arange(14) % 3
ORDER = dict(seed=3, epoch=1, drop_last=True)


def _store(kind, folder):
    """X and Y as a directory of .npy files or an HDF5 file, or random pixels as an image folder."""
    if kind == "npy":
        os.makedirs(folder)
        numpy.save(os.path.join(folder, "x.npy"), X)
        numpy.save(os.path.join(folder, "y.npy"), Y)
        return str(folder)
    if kind == "hdf5":
        with h5py.File(f"{folder}.h5", "w") as f:
            f.create_dataset("x", data=X, chunks=(1, 3, 3, 4))
            f.create_dataset("y", data=Y)
        return f"{folder}.h5"
    rng = numpy.random.default_rng(2)
    for i, label in enumerate(Y):
        os.makedirs(os.path.join(folder, f"class{label}"), exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=numpy.uint8)).save(
            os.path.join(folder, f"class{label}", f"{i:02d}.png"))
    return str(folder)


def _ahead(x, y, d, rank, depth=1):
    ahead = prefetch.batches(x, y, 4, distribution=d, rank=rank, depth=depth, reader="process", **ORDER)
    assert isinstance(ahead, prefetch.ProcessPrefetcher)
    return ahead


@pytest.mark.parametrize("kind", ["npy", "hdf5", "images"])
def test_the_reader_process_reads_the_in_memory_blocks_bit_for_bit_and_ends(tmp_path, kind):
    x, y = datastore.load(_store(kind, tmp_path / "d"), dtype=numpy.float32, image_size=8)
    d = Distribution((2, 1, 2, 1), (4,) + x.shape[1:], ("sample", None, "height", None))
    expected = [(d.extract(numpy.asarray(x_b), 2), y_b) for x_b, y_b in datasets.batches(x, y, 4, **ORDER)]
    x.store.bytes_read = 0
    ahead = _ahead(x, y, d, 2)
    got = [(datastore.local_block(x_b, d, 2).copy(), y_b) for x_b, y_b in ahead]
    assert len(got) == len(expected) == 3
    for (a, ya), (b, yb) in zip(got, expected):
        assert numpy.array_equal(a, b) and numpy.array_equal(ya, yb)
    if kind != "images":                              # an image folder counts encoded bytes
        assert x.store.bytes_read == sum(a.nbytes for a, _ in got)     # each block read once, in the child
    assert ahead.process.exitcode == 0                # the batches ran out: it ended, and was waited for


def test_the_reader_process_reuses_depth_plus_one_shared_blocks_and_a_caller_keeping_them_never_hangs(tmp_path):
    x, y = datastore.load(_store("npy", tmp_path / "d"), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ("sample", None, None, None))
    expected = [numpy.asarray(x_b) for x_b, _ in datasets.batches(x, y, 4, **ORDER)]
    ahead = _ahead(x, y, d, 0)
    for x_b, _ in ahead:                              # a training loop: each block let go at the next batch
        block = x_b.block(d, 0)
        assert any(numpy.shares_memory(block, b) for b in ahead.blocks) and len(ahead.blocks) == 2
    kept = [x_b.block(d, 0) for x_b, _ in _ahead(x, y, d, 0)]        # a list of batches: every block kept
    assert all(numpy.array_equal(a, b) for a, b in zip(kept, expected)) and len(kept) == 3
    assert not numpy.shares_memory(kept[2], kept[0]) and not numpy.shares_memory(kept[2], kept[1])


def test_the_reader_process_s_error_is_raised_at_its_batch_and_ends_it(tmp_path):
    bad = X.copy()
    bad[:, 1, 2, 3] = numpy.nan
    folder = tmp_path / "d"
    os.makedirs(folder)
    numpy.save(folder / "x.npy", bad)
    numpy.save(folder / "y.npy", Y)
    x, y = datastore.load(str(folder), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ("sample", None, None, None))
    ahead = _ahead(x, y, d, 0)
    with pytest.raises(ValueError, match=r"sample \d+ of x has NaN or inf values"):
        next(ahead)
    assert ahead.process.exitcode is not None


def test_the_reader_process_ends_when_closed_early_or_dropped(tmp_path):
    x, y = datastore.load(_store("npy", tmp_path / "d"), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ("sample", None, None, None))
    ahead = _ahead(x, y, d, 0, depth=2)
    next(ahead)                                       # --max-steps: one step, then the run stops
    ahead.close()
    assert ahead.process.exitcode == 0
    dropped = _ahead(x, y, d, 0)
    process = dropped.process
    del dropped                                       # nobody closes it: its last reference does
    assert process.exitcode == 0


def test_a_reader_process_that_dies_is_an_error_in_the_step_not_a_hang(tmp_path):
    x, y = datastore.load(_store("npy", tmp_path / "d"), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ("sample", None, None, None))
    ahead = _ahead(x, y, d, 0)
    kept = [next(ahead)[0].block(d, 0), next(ahead)[0].block(d, 0)]   # both blocks held: it waits for one
    os.kill(ahead.process.pid, signal.SIGKILL)
    ahead.process.join(30)
    del kept                                          # a block given back: the command finds no reader
    with pytest.raises(RuntimeError, match="the reader process ended .* before it read the next block"):
        next(ahead)


@pytest.mark.parametrize("reader", ["thread", "process"])
def test_the_next_epoch_reads_into_the_same_pool_and_spares_the_block_still_held(tmp_path, reader):
    """At an epoch's end the first layer still holds the last block: the next epoch's reader
    takes the pool over (2 blocks in all, not 4) and reads into the other block only."""
    x, y = datastore.load(_store("npy", tmp_path / "d"), dtype=numpy.float32)
    d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ("sample", None, None, None))
    order = dict(seed=3, drop_last=True)
    expected = [[numpy.asarray(x_b) for x_b, _ in datasets.batches(x, y, 4, epoch=e, **order)] for e in (0, 1)]
    got, held = [], None
    for epoch in (0, 1):
        ahead = prefetch.batches(x, y, 4, distribution=d, rank=0, reader=reader, epoch=epoch, **order)
        for x_b, _ in ahead:
            block = x_b.block(d, 0)
            assert held is None or numpy.array_equal(held, got[-1])   # the block before, still held: untouched
            got.append(block.copy())
            held = block                              # the first layer's: let go at the next forward
        pool = [id(b.base) for b in (ahead.pool.blocks if reader == "thread" else ahead.blocks)]
        if epoch == 0:
            first = pool
    assert pool == first                              # the same blocks in the second epoch
    assert all(numpy.array_equal(a, b) for a, b in zip(got, expected[0] + expected[1])) and len(got) == 6


def _ended(pid):
    """Whether process ``pid`` has ended (gone, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_reader_process_ends_with_its_rank(tmp_path):
    """A rank killed outright (MPI_Abort, the OOM killer) leaves no reader behind: the child,
    waiting for a command, finds the pipe closed (and one busy reading would get the kernel's
    PR_SET_PDEATHSIG)."""
    script = (f"import os, numpy\n"
              f"from refconv import datastore\n"
              f"from refconv.datastore import prefetch\n"
              f"from refconv.distribution import Distribution\n"
              f"x, y = datastore.load({_store('npy', tmp_path / 'd')!r}, dtype=numpy.float32)\n"
              f"d = Distribution((1, 1, 1, 1), (4,) + x.shape[1:], ('sample', None, None, None))\n"
              f"ahead = prefetch.batches(x, y, 4, distribution=d, rank=0, reader='process', seed=0)\n"
              f"next(ahead)\n"
              f"print(ahead.process.pid, flush=True)\n"
              f"os.kill(os.getpid(), 9)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    pid = int(result.stdout.split()[0])
    for _ in range(3000):                             # until it has ended (a bound, not a timing)
        if _ended(pid):
            break
        time.sleep(0.01)
    assert _ended(pid)


def test_an_unknown_reader_is_refused_in_one_line():
    with pytest.raises(ValueError, match="prefetch reader: expected one of thread, process; got 'fork'"):
        prefetch.batches(X, Y, 4, distribution=None, rank=0, reader="fork", **ORDER)
