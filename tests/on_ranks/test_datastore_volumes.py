"""Block-read training of volumes is in-memory training, bit for bit (issue 23's ``--data`` for a
model of volumes, with issue 22's block reading).

The same synthetic volumes (N, 4, 6, 6, 6) and their float targets (N, 4) are saved as an .npz
(loaded whole on every rank, each rank extracting its block of the global batch), as a
directory of .npy shards and as an HDF5 file chunked smaller than a sample (each rank reading
only its samples, channels, planes, rows and columns).  ``train`` on a store gives exactly the
losses and test error of the .npz at 1 to 4, 6 and 8 ranks, on sample, depth, height, width and
channel splits (Stationary-W too, whose ranks read several pieces of the channels); the grids of
a world size take the two formats in turn (one rank: both), the .npy shards read ahead, the HDF5
file not.  Bad stores of volumes are refused with the same error on every rank before training,
and ``refconv bench data`` reads exactly each rank's block of a volume under depth, height and
width splits.

On simulated ranks (refconv.simulated); the stores are written in the test's thread, in pytest's
tmp_path.
"""

import os

import numpy

from refconv import cli, datasets, simulated
from refconv.bench import data
from refconv.datastore.convert import convert
from refconv.model_spec import conv_layer
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks
from refconv.train import train
from refconv.train_config import TrainConfig

SPEC = {"dims": 3, "loss": "mse", "in_channels": 4,
        "layers": [conv_layer(4, 3, padding=1), {"type": "relu"}, conv_layer(4, 3, padding=1), {"type": "relu"},
                   {"type": "gap"}, {"type": "linear", "out": datasets.VOLUME_TARGETS}]}
SHAPE = (15, 4, 6, 6, 6)  # (N, C, D, H, W): 12 to train on (3 steps of 4), 3 held out
STORES = (("npy", 1), ("v.h5", 0))  # (store, blocks read ahead): the grids of a world size take them in turn

# Per world size: the grids (and channel algorithms) trained on.
GRIDS = {
    1: [{}],
    2: [{"grid": {"sample": 2}}, {"grid": {"depth": 2}}, {"grid": {"channel": 2}, "algorithm": "stationary-x"}],
    3: [{"grid": {"height": 3}}, {"grid": {"channel": 3}, "algorithm": "stationary-y"}, {"grid": {"width": 3}}],
    4: [{"grid": {"sample": 2, "depth": 2}}, {"grid": {"depth": 2, "height": 2}},
        {"grid": {"channel": 4}, "algorithm": "stationary-w", "filter_groups": 2}],
    6: [{"grid": {"sample": 2, "depth": 3}}, {"grid": {"channel": 2, "height": 3}, "algorithm": "stationary-x"}],
    8: [{"grid": {"depth": 2, "height": 2, "width": 2}},
        {"grid": {"channel": 4, "depth": 2}, "algorithm": "stationary-w", "filter_groups": 2}],
}


def _write(folder):
    """The volumes as an .npz, and converted to .npy shards (of 4 samples) and HDF5 (chunks of 4^3)."""
    x, y = datasets.synthetic_volumes(SHAPE[0], SHAPE[1], SHAPE[2], seed=5, dtype=numpy.float64)
    numpy.savez(os.path.join(folder, "v.npz"), x=numpy.asarray(x), y=y)
    for name, options in (("npy", {"shard_samples": 4}), ("v.h5", {"chunk": 4})):
        convert(os.path.join(folder, "v.npz"), os.path.join(folder, name), report=lambda line: None, **options)


def _run(comm, path, defaults, prefetch=1):
    cfg = TrainConfig(model=SPEC, data=path, batch_size=4, epochs=1, dtype="float64", lr=0.01,
                      backend="numpy", progress=False, seed=2, prefetch=prefetch, **defaults)
    result = train(cfg, comm=comm, log=lambda *a: None)
    return result["losses"], result["mse"]


def _check(comm, folder):
    for k, defaults in enumerate(GRIDS[comm.size]):
        memory = _run(comm, os.path.join(folder, "v.npz"), defaults)
        stores = (("npy", 1), ("v.h5", 0)) if len(GRIDS[comm.size]) == 1 else (STORES[k % 2],)
        for name, prefetch in stores:
            stored = _run(comm, os.path.join(folder, name), defaults, prefetch)
            assert_all_ranks(comm, stored == memory and len(memory[0]) == 3,
                             f"{defaults}, {name}, prefetch {prefetch}: {stored} != in memory {memory}")


@on_ranks(*GRIDS)
def test_block_read_training_of_volumes_is_in_memory_training_bit_for_bit(ranks, tmp_path):
    _write(str(tmp_path))
    simulated.run(_check, ranks, args=(str(tmp_path),))


# -- bad stores of volumes: the same one-line error on every rank, before any step --------------------------
def _write_bad(folder):
    x, y = datasets.synthetic_volumes(10, 4, 4, seed=1, dtype=numpy.float32)
    x = numpy.asarray(x)
    stores = {"images": (x[:, :, 0], y), "ints": (x.astype(numpy.int32), y), "short-targets": (x, y[:7]),
              "labels": (x, numpy.arange(10) % 3)}
    for name, (xs, ys) in stores.items():
        os.mkdir(os.path.join(folder, name))
        numpy.save(os.path.join(folder, name, "x.npy"), xs)
        numpy.save(os.path.join(folder, name, "y.npy"), ys)
    os.mkdir(os.path.join(folder, "no-targets"))
    numpy.save(os.path.join(folder, "no-targets", "x.npy"), x)


BAD = {"images": "holds images (4, 4, 4) per sample but 'cosmoflow' is a model of dims 3",
       "ints": "x must hold floats, got dtype int32",
       "short-targets": "x has 10 samples but y has targets for 7",
       "labels": "'cosmoflow' regresses (loss 'mse') float targets (N, K)",
       "no-targets": "has no y.npy"}


def _refused(comm, folder):
    for name, expected in BAD.items():
        cfg = TrainConfig(model="cosmoflow", data=os.path.join(folder, name), batch_size=2, backend="numpy",
                          progress=False, grid={"depth": comm.size})
        try:
            train(cfg, comm=comm, log=lambda *a: None)
            message = None
        except ValueError as exc:
            message = str(exc)
        messages = comm.allgather(message)
        assert_all_ranks(comm, message is not None and expected in message and len(set(messages)) == 1,
                         f"{name}: {messages}")


@on_ranks(2, 3)
def test_a_bad_store_of_volumes_is_refused_alike_on_every_rank_before_training(ranks, tmp_path):
    _write_bad(str(tmp_path))
    simulated.run(_refused, ranks, args=(str(tmp_path),))


# -- refconv bench data: bytes read per step == the rank's block of the volumes, exactly (not timed) ----------
BENCH_GRIDS = {2: ["depth=2", "height=2"], 3: ["depth=3", "height=3", "width=3"],
               4: ["depth=4", "depth=2,height=2", "sample=2,depth=2"],
               8: ["depth=2,height=2,width=2", "sample=2,depth=4"]}


def _bench_reads(comm, folder):
    for name in ("npy", "v.h5"):
        for grid in BENCH_GRIDS[comm.size]:
            args = cli.build_parser().parse_args(["bench", "data", "--data", os.path.join(folder, name), "--grid",
                                                  grid, "--batch", "8", "--repeat", "2", "--warmup", "0"])
            ranks = data.run(args, comm, {"ranks": []})[0]["extra"]["ranks"]
            per = [r["bytes_per_step"] for r in ranks]
            assert_all_ranks(comm, sum(per) == 8 * 3 * 7 * 6 * 5 * 4 and len(ranks[0]["local_shape"]) == 5
                             and all(r["bytes_per_step"] == numpy.prod(r["local_shape"]) * 4 for r in ranks),
                             f"{name} {grid}: {ranks}")


@on_ranks(*BENCH_GRIDS)
def test_bench_data_reads_exactly_each_rank_s_block_of_a_volume(ranks, tmp_path):
    """A store of 12 volumes of 3 x 7 x 6 x 5 (uneven splits), batches of 8: every rank reads per
    step exactly its block, prod(local shape) x 4 bytes, and the blocks add up to the batch."""
    folder = str(tmp_path)
    x = numpy.random.default_rng(0).standard_normal((12, 3, 7, 6, 5)).astype(numpy.float32)
    numpy.savez(os.path.join(folder, "v.npz"), x=x, y=numpy.ones((12, 2), numpy.float32))
    for name in ("npy", "v.h5"):
        convert(os.path.join(folder, "v.npz"), os.path.join(folder, name), chunk=4, report=lambda line: None)
    simulated.run(_bench_reads, ranks, args=(folder,))
