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

``blocks_held = (peak_rss - model_own) / block``, the target being below 2.  With ``--reader
process`` the reader process's own pages (``private_bytes``) are reported besides: they are not
in the rank's peak.

``--mode prefetch``: does reading ahead hide the reads?  ``time_ranks`` alternates the
contenders in each of ``--repeat`` rounds (a pause before each, for spinning BLAS threads; then
untimed steps that use up what the reader read during the pause; then steps back to back):
``memory``, the step on a block read before; ``thread`` and ``process`` (``--reader``, both by
default), the step on the next batch of a prefetching iterator whose reader (prefetch.py) reads
the block after it meanwhile.  The store is 16 batches, so an epoch (and a reader process's
fork) spans 16 steps.  It prints the median of each and of their ratio per round (reader /
memory; the target is at most 1.05), and where the step's own thread spent each step
(``schedstat``): on a core, runnable but waiting for one, preempted how often, and asleep
(waiting for Python's lock or for its block).  Other processes' load lengthens the wait for a
core; the time on a core and asleep are the step's own.
"""

import math
import os
import time

import numpy

from refconv import collectives, datasets, datastore, train, train_config
from refconv.datastore import prefetch
from refconv.bench import timing
from refconv.bench.common import BenchError, grid_text, option, record, time_ranks
from refconv.model_spec import conv_layer
from refconv.optim import SGD
from refconv.train import inputs

EPOCH_BATCHES = 16    # --mode prefetch's store: an epoch is 16 batches (a reader process is forked at each)
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


def private_bytes(pid):
    """The pages process ``pid`` holds alone (Private_Clean + Private_Dirty of its smaps_rollup):
    what a forked process adds to its parent's memory; 0 where /proc does not tell."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


def readers_of(args, mode):
    """``--reader``: the prefetch readers to measure.  ``both`` (thread and process side by side)
    is ``--mode prefetch``'s default and only its; ``--mode memory`` defaults to refconv train's."""
    if args.reader == "both" and mode != "prefetch":
        raise BenchError(f"--reader: --mode {mode} measures one reader; give thread or process")
    if args.reader is None:
        return list(prefetch.READERS) if mode == "prefetch" else [train_config.BY_NAME["prefetch_reader"].default]
    return list(prefetch.READERS) if args.reader == "both" else [args.reader]


def node_memory():
    """This machine's memory in bytes (MemTotal of /proc/meminfo)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise BenchError("--store-gib: this machine has no /proc/meminfo to size the store by; give --store-gib")


# -- the model and the batches --------------------------------------------------------------------
def _model(args, comm, env, grid, x, y, batch):
    cfg = train_config.TrainConfig(model=args.model or DATA_MODEL, grid=grid, batch_size=batch, dtype=args.dtype,
                            backend=env["ranks"][comm.Get_rank()]["backend"], progress=False)
    model = train.build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=int(y.max()) + 1)
    model.set_overlap(cfg.overlap)
    inputs.check_model_fits(model, cfg, (batch,) + tuple(x.shape[1:]), int(y.max()) + 1)
    return model, SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _stream(x, y, batch, model, rank, depth, reader, readers=None):
    """Batches of every epoch in turn, each rank's block read ahead by ``depth`` by ``reader`` (a
    thread or a process, prefetch.py); each epoch's prefetcher is appended to ``readers``."""
    epoch = 0
    while True:
        ahead = datastore.batches(x, y, batch, seed=0, epoch=epoch, drop_last=True,
                                  distribution=model.input_distribution, rank=rank, depth=depth, reader=reader)
        if readers is not None:
            readers.append(ahead)
        try:
            yield from ahead
        finally:
            getattr(ahead, "close", lambda: None)()     # a stream closed early ends its reader now
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
    reader = readers_of(args, "memory")[0]
    reset = reset_peak()
    readers = []
    batches = _stream(x, y, batch, model, rank, option(args, "prefetch", 1, minimum=0), reader, readers)
    read0 = x.store.bytes_read
    for _ in range(repeat):
        x_b, y_b = next(batches)
        train.step(model, optimizer, x_b, y_b)
    peak = status("VmHWM")
    children = [r.process.pid for r in readers if hasattr(r, "process") and r.process.is_alive()]
    reader_private = sum(private_bytes(pid) for pid in children)       # the reader process's own pages
    batches.close()
    mine = {"peak_rss_bytes": peak, "block_bytes": block, "model_own_bytes": model_own,
            "rss_before_data_bytes": before, "blocks_held": (peak - model_own) / block,
            "parameter_bytes": model.num_parameters() * numpy.dtype(args.dtype).itemsize,
            "bytes_read": x.store.bytes_read - read0, "peak_reset": reset, "reader_private_bytes": reader_private}
    ranks = collectives.allgather_object(comm, mine)
    store_bytes = x.shape[0] * int(numpy.prod(x.shape[1:])) * x.store.dtype.itemsize
    label = grid_text(grid)
    config = {"ranks": comm.Get_size(), "grid": grid, "batch": batch, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "prefetch": option(args, "prefetch", 1, minimum=0), "mode": "memory", "reader": reader,
              "model": _model_name(args),
              "sample_shape": list(x.shape[1:]), "store_bytes": store_bytes, "sweep": args.sweep}
    worst = max(r["blocks_held"] for r in ranks)
    extra = {"ranks": ranks, "store_bytes": store_bytes, "node_memory_bytes": node_memory(),
             "blocks_held_max": worst, "below_target": worst < 2}
    if rank == 0:
        print(f"{label}, store {store_bytes / 2**30:,.2f} GiB ({x.shape[0]:,} samples of {tuple(x.shape[1:])}) = "
              f"{store_bytes * comm.Get_size() / node_memory():.2f} x memory / ranks; batch {batch}, "
              f"--prefetch {config['prefetch']} (--reader {reader}), {repeat} steps read from the store")
        for r, m in enumerate(ranks):
            print(f"  rank {r}: peak RSS {m['peak_rss_bytes'] / 2**20:,.1f} MiB = model's own "
                  f"{m['model_own_bytes'] / 2**20:,.1f} MiB (RSS before data {m['rss_before_data_bytes'] / 2**20:,.1f}"
                  f") + {m['blocks_held']:.3f} blocks of {m['block_bytes'] / 2**20:,.2f} MiB"
                  + ("" if m["peak_reset"] else " (the peak could not be reset: an upper bound)")
                  + (f"; the reader process's own pages {m['reader_private_bytes'] / 2**20:,.1f} MiB besides"
                     if reader == "process" else ""))
        print(f"  most blocks held on any rank: {worst:.3f} (target: below 2): {'met' if worst < 2 else 'NOT met'}")
    return record("data", label, env, config, {}, extra=extra)


def _model_name(args):
    return args.model or DATA_MODEL["name"]


# -- --mode prefetch --------------------------------------------------------------------------------------
def run_prefetch(args, comm, env, path, grid, batch):
    rank, repeat, warmup = comm.Get_rank(), option(args, "repeat", 7), option(args, "warmup", 1, minimum=0)
    depth = option(args, "prefetch", 1)          # at least 1: the contender is the step read ahead
    kinds = readers_of(args, "prefetch")
    x, y = _open(path, args, batch)
    model, optimizer = _model(args, comm, env, grid, x, y, batch)
    held_x, held_y = _held(x, y, batch, model, rank)
    readers = {kind: [] for kind in kinds}        # each epoch's prefetcher: the reader's CPU per block
    streams = {kind: _stream(x, y, batch, model, rank, depth, kind, readers[kind]) for kind in kinds}

    def from_store(stream):
        def step():
            x_b, y_b = next(stream)
            train.step(model, optimizer, x_b, y_b)
        return step

    contenders = {"memory": lambda: train.step(model, optimizer, held_x, held_y),
                  **{kind: from_store(stream) for kind, stream in streams.items()}}
    spent = {name: [] for name in contenders}        # per call: (wall, CPU, run queue) of the step's thread
    times = time_ranks(comm, {name: _accounted(fn, spent[name]) for name, fn in contenders.items()}, repeat, warmup,
                       timing.PAUSE, window=args.window, settle=args.window / 2)
    for stream in streams.values():
        stream.close()
    per_reader = {}
    thread = {name: _split(calls) for name, calls in spent.items()}
    for kind in kinds:
        ratios = [s / m for s, m in zip(times[kind], times["memory"])]
        medians = [float(numpy.median([t for r in readers[kind] for t in getattr(r, name)]))
                   for name in ("read_cpu_s", "read_s", "waited_s")]
        read_cpu, read_wall, waited = numpy.max(collectives.allgather_object(comm, medians), axis=0)  # slowest rank's
        median = float(numpy.median(ratios))
        per_reader[kind] = {"ratio": {"median": median, "min": min(ratios), "max": max(ratios), "values": ratios},
                            "within_5_percent": median <= 1.05, "read_cpu_s": read_cpu, "read_s": read_wall,
                            "waited_s": waited}
    label = grid_text(grid)
    extra = {"readers": per_reader, "step_thread": collectives.allgather_object(comm, thread)}
    config = {"ranks": comm.Get_size(), "grid": grid, "batch": batch, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "prefetch": depth, "mode": "prefetch", "model": _model_name(args), "readers": kinds,
              "store": os.path.basename(os.path.normpath(path)), "kind": type(x.store).__name__,
              "sample_shape": list(x.shape[1:]), "window_s": args.window, "sweep": args.sweep,
              "load_average": list(os.getloadavg())}
    line = record("data", label, env, config, times, extra=extra)
    if rank == 0:
        p = line["passes"]
        print(f"{label}, {_model_name(args)} on batch {batch} of {tuple(x.shape[1:])} from "
              f"{type(x.store).__name__}, --prefetch {depth}, {repeat} rounds (load average before "
              f"{config['load_average'][0]:.1f}): step with the block in memory {p['memory']['median'] * 1e3:.1f} ms")
        for kind, r in per_reader.items():
            ratio = r["ratio"]
            print(f"  read ahead by a {kind}: step {p[kind]['median'] * 1e3:.1f} ms; {kind} / memory per round: "
                  f"median {ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}); within 5%: "
                  f"{r['within_5_percent']}")
            print(f"    medians, slowest rank: a block takes the {kind} {r['read_s'] * 1e3:.1f} ms "
                  f"({r['read_cpu_s'] * 1e3:.1f} ms of CPU: {r['read_cpu_s'] / p['memory']['median']:.0%} of the step "
                  f"in memory, what a rank without a free core for its reader adds to the step); the step waits "
                  f"{r['waited_s'] * 1e3:.1f} ms for its block")
        for name, t in thread.items():
            print(f"  the step's thread, {name} (rank 0, medians per step): {t['cpu_s'] * 1e3:.1f} ms on a core, "
                  f"{t['queued_s'] * 1e3:.1f} ms runnable waiting for one ({t['preempted']:.1f} preemptions, mean), "
                  f"{t['asleep_s'] * 1e3:.1f} ms asleep (for Python's lock, or its block)")
    return line


def schedstat():
    """``(seconds on a core, seconds runnable but waiting for one)`` of the calling thread so far
    (Linux's /proc/thread-self/schedstat; zeros where there is none)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_core, queued, _ = f.read().split()
        return int(on_core) / 1e9, int(queued) / 1e9
    except OSError:
        return 0.0, 0.0


def preemptions():
    """How often the calling thread has been taken off a core while it could run (Linux's
    nonvoluntary_ctxt_switches of /proc/thread-self/status; 0 where there is none)."""
    try:
        with open("/proc/thread-self/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _accounted(fn, calls):
    """``fn``, with the wall, core and run-queue seconds and the preemptions of each call appended to ``calls``."""
    def call():
        (c0, q0), p0, t0 = schedstat(), preemptions(), time.perf_counter()
        fn()
        (c1, q1), p1, t1 = schedstat(), preemptions(), time.perf_counter()
        calls.append((t1 - t0, c1 - c0, q1 - q0, p1 - p0))
    return call


def _split(calls):
    """Medians of a contender's calls: on a core, queued for one, and asleep (the rest of the wall
    time: waiting for Python's lock, which another thread holds, or for the block).  The load of
    other processes lengthens the queue; the core and asleep times are the step's own."""
    wall, cpu, queued, preempted = numpy.array(calls).T
    return {"wall_s": float(numpy.median(wall)), "cpu_s": float(numpy.median(cpu)),
            "queued_s": float(numpy.median(queued)), "asleep_s": float(numpy.median(wall - cpu - queued)),
            "preempted": float(numpy.mean(preempted))}
