"""``refconv bench data``: what each rank reads of a store per step, how fast, and its peak memory.

    mpiexec -n 4 refconv bench data --grid sample=2,height=2 --batch 32 --image-size 256
    mpiexec -n 4 refconv bench data --data my_data.h5 --grid height=2,width=2

Each rank reads its block of ``--repeat`` global batches (after ``--warmup``) through
:func:`refconv.datastore.local_block`, as ``refconv train`` does, with the block laid out as a
model's input is (N over sample, C over channel, D over depth in a store of volumes, H over height,
W over width), and reports:

- **bytes read per step**, counted by the store (``bytes_read``), against the block's own size
  ``prod(local shape) * itemsize``; with the global batch fixed it falls as
  ``1 / (P_N * P_c * P_H * P_W)`` (no halo: the first layer exchanges its own);
- **read throughput**, those bytes over the time of the reads (warm page cache unless the
  store is larger than memory; a step's time is the slowest rank's);
- **peak resident memory** (``ru_maxrss``: the process's Python, NumPy and MPI included), and
  the growth of resident memory from the store opened to right after each read, while the
  block is alive (the largest of the steps): what reading costs the rank.

Without ``--data`` rank 0 writes a synthetic store (``--store npy``, ``hdf5`` or ``images``, a
folder of PNGs) of ``4 * --batch`` images (``--mode prefetch``: 16 batches) of 3 x ``--image-size``^2
into ``--dir`` (default: the temporary folder), removed after unless ``--keep``.

``--mode memory`` (a store of ``--store-gib``, by default 4 x memory / ranks: is a rank's peak
memory bounded by its block?) and ``--mode prefetch`` (the step read ahead from a store against
the same step with its block in memory) train a model from the store: ``refconv.bench.data_train``.
"""

import math
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy

from refconv import collectives, datasets, datastore
from refconv.bench import data_train
from refconv.bench.common import BenchError, full_grid, grid_text, option, record, reject
from refconv.distribution import Distribution
from refconv.grid import axes_of


def run(args, comm, env):
    """One results line: per rank, the bytes read per step, the block's bytes, throughput and memory
    (``--mode read``), or what training from a store holds or costs (``memory``, ``prefetch``)."""
    reject(args, ("shape", "algorithm", "filter-groups") + (("model",) if args.mode == "read" else ()),
           "bench data reads blocks of a store; it takes --grid, --batch, --image-size, --data, --store, --repeat, "
           "--warmup (and --model with --mode memory or prefetch)")
    P = comm.Get_size()
    grid = full_grid(args.grid or {"sample": P}, P)
    batch = option(args, "batch", 32)
    size = option(args, "image_size", 64)
    option(args, "prefetch", 1, minimum=0)                              # checked before a store is written
    if args.mode != "read":
        data_train.readers_of(args, args.mode)
    if args.mode == "memory" and args.store != "npy":
        raise BenchError(f"--store: --mode memory writes an npy store (sized by --store-gib), not {args.store}")
    samples = {"memory": lambda: data_train.store_samples(args, comm, size),
               "prefetch": lambda: data_train.EPOCH_BATCHES * batch}.get(args.mode, lambda: 4 * batch)()
    if args.data is not None:
        path, folder = args.data, None
    else:
        folder = checks_folder(args, comm, samples * 3 * size * size * 4)
        path = os.path.join(folder, {"hdf5": "store.h5", "images": "images"}.get(args.store, "store"))
        if comm.Get_rank() == 0:
            write_synthetic(path, samples, size, report=progress_line(samples))
        collectives.barrier(comm)
    try:
        if args.mode == "read":
            line = _measure(comm, env, path, grid, batch, option(args, "repeat", 5),
                            option(args, "warmup", 1, minimum=0), args)
        else:
            line = {"memory": data_train.run_memory, "prefetch": data_train.run_prefetch}[args.mode](
                args, comm, env, path, grid, batch)
    finally:
        collectives.barrier(comm)
        if folder and comm.Get_rank() == 0:
            if args.keep:
                print(f"kept the store: {path}", flush=True)
            else:
                shutil.rmtree(folder)
    return [line]


def checks_folder(args, comm, nbytes):
    """A new folder for a synthetic store of about ``nbytes`` under ``--dir``, the same on every rank;
    a ``--dir`` that is no folder, or a disk with less free space, is refused on every rank alike."""
    parent = args.dir or tempfile.gettempdir()
    if not os.path.isdir(parent):
        raise BenchError(f"--dir: {parent!r} is not a folder; give an existing folder for the synthetic store")
    free = collectives.bcast_object(comm, shutil.disk_usage(parent).free if comm.Get_rank() == 0 else None)
    if nbytes > 0.9 * free:
        raise BenchError(f"--store-gib: a store of {nbytes / 2**30:,.1f} GiB does not fit in the "
                         f"{free / 2**30:,.1f} GiB free under {parent!r}; give a smaller --store-gib or another --dir")
    return collectives.bcast_object(comm, tempfile.mkdtemp(prefix="refconv-bench-data-", dir=parent)
                                    if comm.Get_rank() == 0 else None)


def progress_line(n):
    """A ``report(i)`` that prints a line on stderr at each tenth of ``n`` samples written."""
    marks = {math.ceil(n * k / 10) for k in range(1, 11)}

    def report(i, nbytes):
        if i in marks:
            print(f"writing the synthetic store: {i:,} of {n:,} samples ({nbytes / 2**30:,.2f} GiB)", file=sys.stderr,
                  flush=True)
    return report


def write_synthetic(path, n, size, seed=0, report=lambda i, nbytes: None):
    """``n`` images of 3 x size x size and labels 0..9 at ``path``: a .npy directory, HDF5 if it ends
    in .h5, or a folder of PNGs, one subfolder per label (images), written a sample at a time;
    ``report(i, bytes)`` after sample i."""
    rng = numpy.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    sample = lambda: rng.random((3, size, size), numpy.float32)  # noqa: E731  (finite, and quick to draw)
    if os.path.basename(path) == "images":
        Image = datastore.imagefolder.import_pillow()
        for i in range(n):
            folder = os.path.join(path, f"class{y[i]}")
            os.makedirs(folder, exist_ok=True)
            pixels = rng.integers(0, 256, (size, size, 3), dtype=numpy.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, f"{i:07d}.png"))
            report(i + 1, (i + 1) * pixels.nbytes)
        return
    if path.endswith(datastore.HDF5_SUFFIXES):
        h5py = datastore.formats.import_h5py()
        with h5py.File(path, "w") as f:
            x = f.create_dataset("x", (n, 3, size, size), numpy.float32, chunks=(1, 3, min(size, 64), min(size, 64)))
            for i in range(n):
                x[i] = sample()
                report(i + 1, (i + 1) * x[0].nbytes)
            f["y"] = y
        return
    os.makedirs(path)
    with open(os.path.join(path, "x.npy"), "wb") as f:          # plain writes: no mapping inflates our RSS
        header = {"descr": numpy.lib.format.dtype_to_descr(numpy.dtype(numpy.float32)), "fortran_order": False,
                  "shape": (n, 3, size, size)}
        numpy.lib.format.write_array_header_2_0(f, header)
        for i in range(n):
            f.write(sample().tobytes())
            report(i + 1, (i + 1) * 3 * size * size * 4)
    numpy.save(os.path.join(path, "y.npy"), y)


def _rss_now():
    """This process's resident memory now, in bytes (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _measure(comm, env, path, grid, batch, repeat, warmup, args):
    rank = comm.Get_rank()
    x, y = datastore.load(path, dtype=numpy.dtype(args.dtype), image_size=option(args, "image_size", 64))
    if not isinstance(x, datastore.StoreImages):
        raise ValueError(f"--data: {path!r} is an .npz, loaded whole; give a store (a directory of .npy files, an "
                         f"HDF5 file or an image folder; refconv data convert makes one)")
    if batch > len(x):
        raise ValueError(f"--batch: {batch} is larger than the store's {len(x)} samples")
    shape = (batch,) + x.shape[1:]
    axes = axes_of(len(shape))                                           # a volume's: N, C, D, H, W split
    if grid["depth"] > 1 and len(shape) == 4:
        raise BenchError(f"--grid: depth={grid['depth']} splits volumes, but {path!r} holds images {shape[1:]}")
    d = Distribution(tuple(grid[a] for a in axes), shape, axes)          # a model's input: N, C, (D,) H, W split
    block = int(numpy.prod(d.local_shape(rank))) * x.store.dtype.itemsize
    batches = datasets.batches(x, y, batch, seed=0, epoch=0, drop_last=True)
    steps, times, read, held = 0, [], [], [0]
    before = _rss_now()                                                  # the store open, nothing read
    while steps < warmup + repeat:
        for x_b, _ in batches:
            collectives.barrier(comm)
            start, t0 = x.store.bytes_read, time.perf_counter()
            x_loc = datastore.local_block(x_b, d, rank)
            seconds = time.perf_counter() - t0
            held.append(_rss_now() - before)                             # while the block is alive
            del x_loc
            if steps >= warmup:
                times.append(seconds)
                read.append(x.store.bytes_read - start)
            steps += 1
            if steps == warmup + repeat:
                break
        batches = datasets.batches(x, y, batch, seed=0, epoch=steps, drop_last=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024              # Linux: KiB
    mine = {"bytes_per_step": max(read), "block_bytes": block, "local_shape": list(d.local_shape(rank)),
            "read_s": float(numpy.median(times)), "throughput_Bps": sum(read) / max(sum(times), 1e-12),
            "peak_rss_bytes": peak, "rss_growth_bytes": max(held)}
    ranks = collectives.allgather_object(comm, mine)
    slowest = [max(r) for r in zip(*collectives.allgather_object(comm, times))]
    global_bytes = int(numpy.prod(shape)) * x.store.dtype.itemsize
    config = {"ranks": comm.Get_size(), "grid": grid, "batch": batch, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "store": os.path.basename(os.path.normpath(path)), "kind": type(x.store).__name__,
              "sample_shape": list(x.shape[1:]), "sweep": args.sweep}
    extra = {"global_batch_bytes": global_bytes, "ranks": ranks,
             "exact": all(r["bytes_per_step"] == r["block_bytes"] for r in ranks)}
    label = grid_text(grid)
    if rank == 0:
        per = [r["bytes_per_step"] for r in ranks]
        print(f"{label}, batch {batch} of {tuple(x.shape[1:])} {x.store.dtype} ({type(x.store).__name__}): per rank "
              f"{min(per):,}..{max(per):,} B read per step = {max(per) / global_bytes:.3f} of the global batch "
              f"({global_bytes:,} B); exactly the block on every rank: {extra['exact']}")
        for r, m in enumerate(ranks):
            print(f"  rank {r}: block {tuple(m['local_shape'])}, {m['bytes_per_step']:,} B per step, "
                  f"{m['throughput_Bps'] / 1e6:,.0f} MB/s, peak RSS {m['peak_rss_bytes'] / 2**20:,.0f} MiB "
                  f"(+{m['rss_growth_bytes'] / 2**20:,.1f} MiB while reading)")
    return record("data", label, env, config, {"read": slowest}, extra=extra)


def add_arguments(p):
    """Flags of bench data only."""
    p.add_argument("--data", help="a store to read (default: a synthetic one, written and removed)")
    p.add_argument("--store", choices=("npy", "hdf5", "images"), default="npy", help="the synthetic store's format")
    p.add_argument("--mode", choices=("read", "memory", "prefetch"), default="read",
                   help="read: bytes and throughput of the reads; memory: peak memory training from a store of "
                        "--store-gib; prefetch: the step read ahead from the store vs its block in memory")
    p.add_argument("--store-gib", type=float, help="--mode memory: the synthetic store's size (default: 4 x this "
                                                   "machine's memory / the ranks)")
    p.add_argument("--prefetch", type=int, default=1, help="--mode memory and prefetch: blocks read ahead")
    p.add_argument("--reader", choices=("thread", "process", "both"),
                   help="--mode memory and prefetch: the prefetch reader (both: each, side by side, --mode prefetch's "
                        "default; --mode memory's: refconv train's --prefetch-reader)")
    p.add_argument("--window", type=float, default=0.5, help="--mode prefetch: seconds of steps back to back per "
                                                           "contender and round")
    p.add_argument("--dir", help="the folder for the synthetic store (default: the temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the synthetic store (its path is printed)")
    p.add_argument("--image-size", type=int, help="height and width of the synthetic images (default 64)")
