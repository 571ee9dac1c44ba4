"""Block-read training is in-memory training, bit for bit, on real MPI ranks (refconv.datastore,
issue 22): 2 processes, each reading its own block of the files, the reader process among them.

tests/simulated/test_datastore.py makes the same runs at 1 to 8 simulated ranks (written twice on
purpose, once per kind of rank), and checks the image folder and ``refconv bench data``.  Here,
at one size, what simulated ranks cannot: ``train`` with its default gradient buckets (their
planner's ``MPI.Comm.Compare`` takes no simulated communicator), and reader processes started
by real ranks.

The same digits are saved as an .npz (loaded whole on every rank, each rank extracting its block
of the global batch), as a directory of .npy shards and as an HDF5 file (each rank reading only
its block).  ``train`` on each must give exactly the same losses and test accuracy, on sample,
spatial and channel splits, with the next block read ahead and without, by the reader thread and
(on the first grid) by the reader process.
"""

import os
import shutil
import tempfile

import h5py
import numpy
from mpi4py import MPI

from refconv import datasets
from refconv.model_spec import conv_layer
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import TrainConfig, train

comm = MPI.COMM_WORLD

SPEC = {"in_channels": 4, "layers": [conv_layer(4, 3, padding=1), {"type": "relu"}, conv_layer(4, 3, padding=1),
                                      {"type": "relu"}, {"type": "gap"}, {"type": "linear", "out": 10}]}

# Per world size: the grids (and channel algorithms) trained on.
GRIDS = {
    2: [{"grid": {"sample": 2}}, {"grid": {"height": 2}}, {"grid": {"channel": 2}, "algorithm": "stationary-x"}],
}


def _write(folder):
    """The first 60 digits (8x8) in four channels (as they are, flipped twice, transposed), so that a
    channel split of the first layer has channels to split, as an .npz, a directory of three .npy
    shards and an HDF5 file."""
    x, y, _, _ = datasets.load_digits(upsample=1)
    x, y = x[:60], y[:60]
    x = numpy.ascontiguousarray(numpy.concatenate([x, x[:, :, ::-1], x[:, :, :, ::-1], x.transpose(0, 1, 3, 2)], 1))
    numpy.savez(os.path.join(folder, "d.npz"), x=x, y=y)
    os.mkdir(os.path.join(folder, "npy"))
    for k, (a, b) in enumerate(((0, 25), (25, 26), (26, 60))):
        numpy.save(os.path.join(folder, "npy", f"x-{k:05d}.npy"), x[a:b])
    numpy.save(os.path.join(folder, "npy", "y.npy"), y)
    with h5py.File(os.path.join(folder, "d.h5"), "w") as f:
        f.create_dataset("x", data=x, chunks=(1, 4, 4, 4))
        f.create_dataset("y", data=y)


def _run(data, defaults, prefetch=1, reader="thread"):
    cfg = TrainConfig(model=SPEC, data=data, batch_size=6, epochs=2, max_steps=9, dtype="float64",
                      backend="numpy", progress=False, seed=4, prefetch=prefetch, prefetch_reader=reader, **defaults)
    result = train(cfg, log=lambda *a: None)
    return result["losses"], result["accuracy"]


def _check():
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        _write(folder)
    comm.Barrier()
    try:
        for g, defaults in enumerate(GRIDS[comm.size]):
            memory = _run(os.path.join(folder, "d.npz"), defaults)
            runs = [("npy", 1, "thread"), ("d.h5", 1, "thread"), ("npy", 0, "thread")]
            runs += [("npy", 1, "process"), ("d.h5", 2, "process")] if g == 0 and comm.size == 2 else []  # the cost
            for name, prefetch, reader in runs:
                stored = _run(os.path.join(folder, name), defaults, prefetch, reader)
                assert_all_ranks(comm, stored == memory and len(memory[0]) == 9,
                                 f"{defaults}, {name}, prefetch {prefetch} ({reader}): {stored} != in memory {memory}")
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder)


@mpi_test(sizes=tuple(GRIDS), timeout=240)
def test_block_read_training_is_in_memory_training_bit_for_bit():
    _check()

