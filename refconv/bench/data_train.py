"""``refconv bench data --mode memory`` and ``--mode prefetch``: training from a store, measured.

    mpiexec -n 8 refconv bench data --mode memory                  # a store of 4 x memory / ranks
    mpiexec -n 2 refconv bench data --mode prefetch --store images --image-size 128 --batch 16

Both build a model as ``refconv train`` does (``refconv.train.build_model``; ``--model``, else
:data:`DATA_MODEL`, a strided stem whose step is light, so that the data is a large part of it)
and train it with ``refconv.train.step`` on batches of a store, in its global order.

``--mode memory``: is a rank's memory bounded by its block, whatever the store's size?  Rank 0
writes a synthetic ``.npy`` store of ``--store-gib`` GiB (default: 4 x this node's memory / the
ranks, the issue's target), with a progress line at each tenth, into ``--dir`` (default: the
temporary folder), removed afterwards unless ``--keep``.  Each rank then measures, from
``VmHWM`` (the peak resident set of ``/proc/self/status``: its anonymous pages *and* the file
pages it has mapped, so a memory map cannot hide a read):

1. ``rss_before_data``: VmRSS with the model built and the store open, no block read;
2. ``model_own``: the peak of ``--warmup + --repeat`` steps on one block already in memory
   (read once before), less that block: what training holds besides its input;
3. then the peak is reset (``5`` to ``/proc/self/clear_refs``), and ``--repeat`` steps read
   their blocks from the store with ``--prefetch`` (as refconv train): ``peak_rss``.

``blocks_held = (peak_rss - model_own) / block``, the target being below 2.

``--mode prefetch``: does reading ahead hide the reads?  ``time_ranks`` alternates two
contenders in each of ``--repeat`` rounds (a pause before each, for spinning BLAS threads; then
untimed steps that use up what the thread read during the pause; then steps back to back):
``memory``, the step on a block read before; ``store``, the step on the next batch of a
prefetching iterator, whose thread reads the block after it meanwhile.  It prints the median
of each and of their ratio per round (store / memory; the target is at most 1.05).
"""

import math
import os

import numpy

from refconv import collectives, datasets, datastore, train
from refconv.bench import timing
from refconv.bench.common import BenchError, grid_text, option, record, time_ranks
from refconv.model_spec import conv_layer
from refconv.optim import SGD

DATA_MODEL = {"name": "data-stem", "in_channels": 3,
              "layers": [conv_layer(8, 4, stride=4), {"type": "relu"}, {"type": "gap"},
                         {"type": "linear", "out": 10}]}


# -- what a rank holds -----------------------------------------------------------------------------
def status(field):
    """``VmRSS`` or ``VmHWM`` of this process, in bytes (Linux's /proc/self/status; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak():
    """Start ``VmHWM`` again from the current VmRSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def node_memory():
    """This machine's memory in bytes (MemTotal of /proc/meminfo)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise BenchError("--store-gib: this machine has no /proc/meminfo to size the store by; give --store-gib")


# -- the model and the batches --------------------------------------------------------------------
def _model(args, comm, env, grid, x, y, batch):
    cfg = train.TrainConfig(model=args.model or DATA_MODEL, grid=grid, batch_size=batch, dtype=args.dtype,
                            backend=env["ranks"][comm.Get_rank()]["backend"], progress=False)
    model = train.build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=int(y.max()) + 1)
    model.set_overlap(cfg.overlap)
    train.check_model_fits(model, cfg, (batch,) + tuple(x.shape[1:]), int(y.max()) + 1)
    return model, SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _stream(x, y, batch, model, rank, depth, readers=None):
    """Batches of every epoch in turn, each rank's block read ahead by ``depth`` (prefetch.py); each
    epoch's reader is appended to ``readers``."""
    epoch = 0
    while True:
        reader = datastore.batches(x, y, batch, seed=0, epoch=epoch, drop_last=True,
                                   distribution=model.input_distribution, rank=rank, depth=depth)
        if readers is not None:
            readers.append(reader)
        yield from reader
        epoch += 1


def _held(x, y, batch, model, rank):
    """The first batch with this rank's block read: the step's data already in memory."""
    x_b, y_b = next(datasets.batches(x, y, batch, seed=0, epoch=0, drop_last=True))
    return x_b.read_ahead(model.input_distribution, rank), y_b


def _open(path, args, batch):
    x, y = datastore.load(path, dtype=numpy.dtype(args.dtype), image_size=option(args, "image_size", 64))
    if not isinstance(x, datastore.StoreImages):
        raise ValueError(f"--data: {path!r} is an .npz, loaded whole; give a store (refconv data convert makes one)")
    if 2 * batch > len(x):
        raise ValueError(f"--batch: {batch} needs a store of at least {2 * batch} samples; it has {len(x)}")
    return x, y


# -- --mode memory --------------------------------------------------------------------------------------
def store_samples(args, comm, size):
    """How many samples of 3 x size x size float32 make ``--store-gib`` (default 4 x memory / ranks)."""
    gib = args.store_gib if args.store_gib is not None else 4 * node_memory() / comm.Get_size() / 2**30
    if not gib > 0:
        raise BenchError(f"--store-gib: {gib} is not a size; give GiB above 0, e.g. 0.01")
    return math.ceil(gib * 2**30 / (3 * size * size * 4))


def run_memory(args, comm, env, path, grid, batch):
    rank, repeat, warmup = comm.Get_rank(), option(args, "repeat", 5), option(args, "warmup", 1, minimum=0)
    x, y = _open(path, args, batch)
    model, optimizer = _model(args, comm, env, grid, x, y, batch)
    model.bind((batch,) + tuple(x.shape[1:]))
    block = int(numpy.prod(model.input_distribution.local_shape(rank))) * numpy.dtype(args.dtype).itemsize
    before = status("VmRSS")                                          # the model built, the store open
    x_b, y_b = _held(x, y, batch, model, rank)
    for _ in range(warmup + repeat):
        train.step(model, optimizer, x_b, y_b)
    model_own = status("VmHWM") - block
    del x_b, y_b
    reset = reset_peak()
    batches = _stream(x, y, batch, model, rank, option(args, "prefetch", 1, minimum=0))
    read0 = x.store.bytes_read
    for _ in range(repeat):
        x_b, y_b = next(batches)
        train.step(model, optimizer, x_b, y_b)
    batches.close()
    peak = status("VmHWM")
    mine = {"peak_rss_bytes": peak, "block_bytes": block, "model_own_bytes": model_own,
            "rss_before_data_bytes": before, "blocks_held": (peak - model_own) / block,
            "parameter_bytes": model.num_parameters() * numpy.dtype(args.dtype).itemsize,
            "bytes_read": x.store.bytes_read - read0, "peak_reset": reset}
    ranks = collectives.allgather_object(comm, mine)
    store_bytes = x.shape[0] * int(numpy.prod(x.shape[1:])) * x.store.dtype.itemsize
    label = grid_text(grid)
    config = {"ranks": comm.Get_size(), "grid": grid, "batch": batch, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "prefetch": option(args, "prefetch", 1, minimum=0), "mode": "memory",
              "model": _model_name(args),
              "sample_shape": list(x.shape[1:]), "store_bytes": store_bytes, "sweep": args.sweep}
    worst = max(r["blocks_held"] for r in ranks)
    extra = {"ranks": ranks, "store_bytes": store_bytes, "node_memory_bytes": node_memory(),
             "blocks_held_max": worst, "below_target": worst < 2}
    if rank == 0:
        print(f"{label}, store {store_bytes / 2**30:,.2f} GiB ({x.shape[0]:,} samples of {tuple(x.shape[1:])}) = "
              f"{store_bytes * comm.Get_size() / node_memory():.2f} x memory / ranks; batch {batch}, "
              f"--prefetch {config['prefetch']}, {repeat} steps read from the store")
        for r, m in enumerate(ranks):
            print(f"  rank {r}: peak RSS {m['peak_rss_bytes'] / 2**20:,.1f} MiB = model's own "
                  f"{m['model_own_bytes'] / 2**20:,.1f} MiB (RSS before data {m['rss_before_data_bytes'] / 2**20:,.1f}"
                  f") + {m['blocks_held']:.3f} blocks of {m['block_bytes'] / 2**20:,.2f} MiB"
                  + ("" if m["peak_reset"] else " (the peak could not be reset: an upper bound)"))
        print(f"  most blocks held on any rank: {worst:.3f} (target: below 2): {'met' if worst < 2 else 'NOT met'}")
    return record("data", label, env, config, {}, extra=extra)


def _model_name(args):
    return args.model or DATA_MODEL["name"]


# -- --mode prefetch --------------------------------------------------------------------------------------
def run_prefetch(args, comm, env, path, grid, batch):
    rank, repeat, warmup = comm.Get_rank(), option(args, "repeat", 7), option(args, "warmup", 1, minimum=0)
    depth = option(args, "prefetch", 1)          # at least 1: the contender is the step read ahead
    x, y = _open(path, args, batch)
    model, optimizer = _model(args, comm, env, grid, x, y, batch)
    held_x, held_y = _held(x, y, batch, model, rank)
    readers = []                                     # each epoch's Prefetcher: the thread's CPU per block
    batches = _stream(x, y, batch, model, rank, depth, readers)

    def from_store():
        x_b, y_b = next(batches)
        train.step(model, optimizer, x_b, y_b)

    contenders = {"memory": lambda: train.step(model, optimizer, held_x, held_y), "store": from_store}
    times = time_ranks(comm, contenders, repeat, warmup, timing.PAUSE, window=args.window, settle=args.window / 2)
    batches.close()
    ratios = [s / m for s, m in zip(times["store"], times["memory"])]
    medians = [float(numpy.median([t for r in readers for t in getattr(r, name)]))
               for name in ("read_cpu_s", "read_s", "waited_s")]
    read_cpu, read_wall, waited = numpy.max(collectives.allgather_object(comm, medians), axis=0)  # slowest rank's
    label = grid_text(grid)
    config = {"ranks": comm.Get_size(), "grid": grid, "batch": batch, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "prefetch": depth, "mode": "prefetch", "model": _model_name(args),
              "store": os.path.basename(os.path.normpath(path)), "kind": type(x.store).__name__,
              "sample_shape": list(x.shape[1:]), "window_s": args.window, "sweep": args.sweep}
    median = float(numpy.median(ratios))
    extra = {"ratio": {"median": median, "min": min(ratios), "max": max(ratios), "values": ratios},
             "within_5_percent": median <= 1.05,
             "read_cpu_s": read_cpu, "read_s": read_wall, "waited_s": waited}
    line = record("data", label, env, config, times, extra=extra)
    if rank == 0:
        p = line["passes"]
        print(f"{label}, {_model_name(args)} on batch {batch} of {tuple(x.shape[1:])} from "
              f"{type(x.store).__name__}, --prefetch {depth}, {repeat} rounds: step with the block in memory "
              f"{p['memory']['median'] * 1e3:.1f} ms, read ahead from the store {p['store']['median'] * 1e3:.1f} ms "
              f"(medians); store / memory per round: median {median:.3f} (min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}); within 5%: {median <= 1.05}")
        print(f"  medians, slowest rank: a block takes the reader thread {read_wall * 1e3:.1f} ms "
              f"({read_cpu * 1e3:.1f} "
              f"ms of CPU: {read_cpu / p['memory']['median']:.0%} of the step in memory, what a rank without a free "
              f"core for its reader adds to the step); the step waits {waited * 1e3:.1f} ms for its block")
    return line
