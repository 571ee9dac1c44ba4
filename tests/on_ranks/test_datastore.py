"""Block-read training is in-memory training, bit for bit (refconv.datastore, issue 22).

The same digits are saved as an .npz (loaded whole on every rank, each rank extracting its block
of the global batch), as a directory of .npy shards and as an HDF5 file (each rank reading only
its block).  ``train`` on each must give exactly the same losses and test accuracy, at 1 to 4, 6
and 8 ranks, on sample, spatial and channel splits (Stationary-W too, whose ranks hold several
pieces of the channels), with the next block read ahead and without, by the reader thread and (on
one grid of 2 ranks) by the reader process.

On simulated ranks (refconv.simulated); the stores are written in the test's thread, in pytest's
tmp_path.  tests/mpiexec/launched/test_datastore.py runs the block-read training here at 2 real ranks, with buckets.
"""

import os

import h5py
import numpy
from PIL import Image
from refconv import cli, datasets, simulated
from refconv.bench import data
from refconv.datastore.convert import convert
from refconv.model_spec import conv_layer
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks
from refconv.train import train
from refconv.train_config import TrainConfig

SPEC = {"in_channels": 4, "layers": [conv_layer(4, 3, padding=1), {"type": "relu"}, conv_layer(4, 3, padding=1),
                                      {"type": "relu"}, {"type": "gap"}, {"type": "linear", "out": 10}]}

# Per world size: the grids (and channel algorithms) trained on.
GRIDS = {
    1: [{}],
    2: [{"grid": {"sample": 2}}, {"grid": {"height": 2}}, {"grid": {"channel": 2}, "algorithm": "stationary-x"}],
    3: [{"grid": {"sample": 3}}, {"grid": {"width": 3}}, {"grid": {"channel": 3}, "algorithm": "stationary-y"}],
    4: [{"grid": {"sample": 2, "height": 2}}, {"grid": {"height": 2, "width": 2}},
        {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x"},
        {"grid": {"channel": 4}, "algorithm": "stationary-w", "filter_groups": 2}],
    6: [{"grid": {"sample": 2, "height": 3}}, {"grid": {"channel": 2, "width": 3}, "algorithm": "stationary-y"}],
    8: [{"grid": {"sample": 2, "height": 2, "width": 2}},
        {"grid": {"channel": 4, "height": 2}, "algorithm": "stationary-w", "filter_groups": 2}],
}


def write_stores(folder):
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


def _run(comm, data, defaults, options, prefetch=1, reader="thread"):
    cfg = TrainConfig(model=SPEC, data=data, batch_size=6, epochs=2, max_steps=9, dtype="float64",
                      backend="numpy", progress=False, seed=4, prefetch=prefetch, prefetch_reader=reader,
                      **options, **defaults)
    result = train(cfg, comm=comm, log=lambda *a: None)
    return result["losses"], result["accuracy"]


def block_reads_match_memory(comm, folder, **options):
    """Each store of ``write_stores(folder)`` trained on each grid of ``GRIDS``: the .npz's losses and
    accuracy, bit for bit.  ``options``: more TrainConfig options.  Collective (tests/mpiexec/launched/test_datastore.py
    runs it too)."""
    for g, defaults in enumerate(GRIDS[comm.size]):
        memory = _run(comm, os.path.join(folder, "d.npz"), defaults, options)
        runs = [("npy", 1, "thread"), ("d.h5", 1, "thread"), ("npy", 0, "thread")]
        runs += [("npy", 1, "process"), ("d.h5", 2, "process")] if g == 0 and comm.size == 2 else []  # the cost
        for name, prefetch, reader in runs:
            stored = _run(comm, os.path.join(folder, name), defaults, options, prefetch, reader)
            assert_all_ranks(comm, stored == memory and len(memory[0]) == 9,
                             f"{defaults}, {name}, prefetch {prefetch} ({reader}): {stored} != in memory {memory}")


@on_ranks(*GRIDS)
def test_block_read_training_is_in_memory_training_bit_for_bit(ranks, tmp_path):
    write_stores(str(tmp_path))
    simulated.run(block_reads_match_memory, ranks, args=(str(tmp_path),))

def _write_images(folder):
    """24 PNGs of 10 x 10 in three classes, and their conversion to HDF5 (8 x 8)."""
    images = os.path.join(folder, "images")
    rng = numpy.random.default_rng(0)
    for k in range(3):
        os.makedirs(os.path.join(images, f"class{k}"))
        for i in range(8):
            a = rng.integers(0, 100, (10, 10, 3)) + 70 * k
            Image.fromarray(a.astype(numpy.uint8)).save(os.path.join(images, f"class{k}", f"{i}.png"))
    convert(images, os.path.join(folder, "images.h5"), image_size=8, report=lambda line: None)


def _images_as_converted(comm, folder):
    spec = dict(SPEC, in_channels=3)
    for grid in ({"sample": 2}, {"height": 2}):
        runs = [train(TrainConfig(model=spec, data=os.path.join(folder, name), image_size=8, batch_size=4,
                                  epochs=1, dtype="float64", backend="numpy", progress=False, grid=grid),
                      comm=comm, log=lambda *a: None) for name in ("images", "images.h5")]
        assert_all_ranks(comm, runs[0]["losses"] == runs[1]["losses"] and len(runs[0]["losses"]) == 4,
                         f"{grid}: {runs[0]['losses']} != {runs[1]['losses']}")


@on_ranks(2)
def test_an_image_folder_trains_as_its_conversion_does(ranks, tmp_path):
    """A folder of PNGs (each rank decoding only its samples) and its conversion to HDF5 give
    the same losses, bit for bit, on a sample and a spatial split."""
    _write_images(str(tmp_path))
    simulated.run(_images_as_converted, ranks, args=(str(tmp_path),))

# -- refconv bench data: the target "bytes read per step == the rank's block, exactly" (not timed) --------
BENCH_GRIDS = {1: ["sample=1"], 2: ["sample=2", "height=2", "width=2"], 3: ["sample=3", "height=3", "width=3"],
               4: ["sample=4", "height=4", "sample=2,height=2", "height=2,width=2"],
               8: ["sample=4,height=2", "height=8", "sample=2,height=2,width=2"]}


@on_ranks(*BENCH_GRIDS)
def test_bench_data_reads_exactly_each_rank_s_block(comm):
    """At 1, 2, 3, 4 and 8 ranks, on sample and spatial splits of a fixed global batch (12 images of
    3 x 10 x 10), every rank reads per step exactly its block: 1 / (P_N P_H P_W) of the batch,
    as the blocks' sizes (uneven splits included) add up to."""
    for store in ("npy", "hdf5"):
        for grid in BENCH_GRIDS[comm.size]:
            args = cli.build_parser().parse_args(["bench", "data", "--grid", grid, "--batch", "12", "--image-size",
                                                  "10", "--repeat", "2", "--warmup", "0", "--store", store])
            line = data.run(args, comm, {"ranks": []})[0]
            ranks = line["extra"]["ranks"]
            per = [r["bytes_per_step"] for r in ranks]
            assert_all_ranks(comm, line["extra"]["exact"] and sum(per) == 12 * 3 * 10 * 10 * 4
                             and all(r["block_bytes"] == numpy.prod(r["local_shape"]) * 4 for r in ranks),
                             f"{store} {grid}: {ranks}")
