"""``refconv bench data``: what each rank reads of a store per step, how fast, and its peak memory.

    mpiexec -n 4 refconv bench data --grid sample=2,height=2 --batch 32 --image-size 256
    mpiexec -n 4 refconv bench data --data my_data.h5 --grid height=2,width=2

Each rank reads its block of ``--repeat`` global batches (after ``--warmup``) through
:func:`refconv.datastore.local_block`, as ``refconv train`` does, with the block laid out as a
model's input is (N over sample, C over channel, H over height, W over width), and reports:

- **bytes read per step**, counted by the store (``bytes_read``), against the block's own size
  ``prod(local shape) * itemsize``; with the global batch fixed it falls as
  ``1 / (P_N * P_c * P_H * P_W)`` (no halo: the first layer exchanges its own);
- **read throughput**, those bytes over the time of the reads (warm page cache unless the
  store is larger than memory; a step's time is the slowest rank's);
- **peak resident memory** (``ru_maxrss``: the process's Python, NumPy and MPI included), and
  the growth of resident memory from the store opened to right after each read, while the
  block is alive (the largest of the steps): what reading costs the rank.

Without ``--data`` rank 0 writes a synthetic store (``--store npy`` or ``hdf5``) of
``4 * --batch`` images of 3 x ``--image-size``^2 float32 into a temporary folder, removed after.
"""

import os
import resource
import shutil
import tempfile
import time

import numpy

from refconv import collectives, datasets, datastore
from refconv.bench.common import full_grid, grid_text, option, record, reject
from refconv.distribution import Distribution
from refconv.grid import AXES


def run(args, comm, env):
    """One results line: per rank, the bytes read per step, the block's bytes, throughput and memory."""
    reject(args, ("shape", "model", "algorithm", "filter-groups"), "bench data reads blocks of a store; it takes "
           "--grid, --batch, --image-size, --data, --store, --repeat, --warmup")
    P = comm.Get_size()
    grid = full_grid(args.grid or {"sample": P}, P)
    batch = option(args, "batch", 32)
    repeat, warmup = option(args, "repeat", 5), option(args, "warmup", 1, minimum=0)
    size = option(args, "image_size", 64)
    folder = None
    if args.data is None:
        folder = collectives.bcast_object(comm, tempfile.mkdtemp(prefix="refconv-bench-data-") if comm.rank == 0
                                          else None)
        path = os.path.join(folder, "store.h5" if args.store == "hdf5" else "store")
        if comm.Get_rank() == 0:
            write_synthetic(path, 4 * batch, size)
        collectives.barrier(comm)
    else:
        path = args.data
    try:
        line = _measure(comm, env, path, grid, batch, repeat, warmup, args)
    finally:
        collectives.barrier(comm)
        if folder and comm.Get_rank() == 0:
            shutil.rmtree(folder)
    return [line]


def write_synthetic(path, n, size, seed=0):
    """``n`` images of 3 x size x size float32 and labels 0..9 at ``path`` (a .npy directory, or HDF5
    if it ends in .h5), written a sample at a time."""
    rng = numpy.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    if path.endswith(datastore.HDF5_SUFFIXES):
        h5py = datastore.formats.import_h5py()
        with h5py.File(path, "w") as f:
            x = f.create_dataset("x", (n, 3, size, size), numpy.float32, chunks=(1, 3, min(size, 64), min(size, 64)))
            for i in range(n):
                x[i] = rng.standard_normal((3, size, size), numpy.float32)
            f["y"] = y
        return
    os.makedirs(path)
    with open(os.path.join(path, "x.npy"), "wb") as f:          # plain writes: no mapping inflates our RSS
        header = {"descr": numpy.lib.format.dtype_to_descr(numpy.dtype(numpy.float32)), "fortran_order": False,
                  "shape": (n, 3, size, size)}
        numpy.lib.format.write_array_header_1_0(f, header)
        for i in range(n):
            f.write(rng.standard_normal((3, size, size), numpy.float32).tobytes())
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
    d = Distribution(tuple(grid[a] for a in AXES), shape, AXES)          # a model's input: N, C, H, W split
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
    p.add_argument("--store", choices=("npy", "hdf5"), default="npy", help="the synthetic store's format")
    p.add_argument("--image-size", type=int, help="height and width of the synthetic images (default 64)")
