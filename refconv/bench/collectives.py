"""``refconv bench collectives``: refconv.collectives against raw mpi4py, same run.

    mpiexec -n 2 refconv bench collectives [--mb 16] [--repeat 15]
    mpiexec -n 2 refconv bench collectives --op reduce_scatter [--mb 0.0625 1 32] [--batch 8]

``--op allreduce`` (the default): bandwidth = buffer bytes / time (the
"algorithm bandwidth"); the median over the repetitions is reported.  Raw
``comm.Allreduce`` runs both first and last, so drift shows as a gap between
the two raw phases.

``--op reduce_scatter`` / ``--op allgather``: the calls Stationary-X/Y/W make,
split along axis 1 of an (n, C, 16, 16) buffer (the full one: ``--mb``
megabytes, MiB here), for each ``--batch`` n; three contenders alternate in
rounds:

- ``refconv``: ``refconv.collectives.reduce_scatter`` / ``allgather``;
- ``packed``: the formulation before issue 10 item 5, written out here: move
  the split axis first and copy (pack), the MPI call on contiguous blocks,
  move it back and copy (unpack);
- ``mpi``: the MPI call alone on a send buffer packed beforehand, into a new
  receive buffer as the wrappers must return one (the floor).

The pack share is ``1 - mpi / packed`` and the gain ``packed / refconv`` (above 1:
refconv is faster), both taken round by round and reported as the median.  Raw
mpi4py calls are made outside ``refconv.collectives`` on purpose here: they are
what the wrappers are measured against.
"""

import sys

import numpy
from mpi4py import MPI

from refconv import collectives
from refconv.bench import timing
from refconv.bench.common import BenchError, option, pause_for, record, reject, time_ranks
from refconv.distribution import block_sizes

ONE_RANK_WARNING = ("refconv bench: warning: collectives on 1 rank move nothing between ranks, so these figures are "
                    "memory copies, not communication; run it as mpiexec -n 2 refconv bench collectives")
ORDER = ("raw", "refconv_out", "refconv_inplace", "refconv", "raw")
LABELS = {
    "refconv": "refconv.collectives.allreduce",
    "refconv_out": "refconv.collectives.allreduce(out=) (reused buffer)",
    "refconv_inplace": "refconv.collectives.allreduce_ (in place)",
    "raw": "raw comm.Allreduce",
}


def run(args, comm, env):
    """One results line per variant and configuration."""
    reject(args, ("grid", "algorithm", "filter-groups", "shape", "model"),
           "bench collectives times collectives of --mb megabytes over all ranks")
    if args.mb is not None and any(mb <= 0 for mb in args.mb):
        raise BenchError(f"--mb: every size must be > 0, got {args.mb}")
    if comm.Get_size() == 1:  # after the checks: a bad input is still refused with its one line
        print(ONE_RANK_WARNING, file=sys.stderr, flush=True)
    if args.op == "allreduce":
        reject(args, ("batch",), "--op allreduce times a flat buffer; --batch is for reduce_scatter and allgather")
        if args.mb is not None and len(args.mb) != 1:
            raise BenchError(f"--mb: --op allreduce takes one size, got {args.mb}")
        return _allreduce(args, comm, env, 16.0 if args.mb is None else args.mb[0])
    return _split_axis(args, comm, env)


def _allreduce(args, comm, env, mb):
    """One results line per variant (the two raw phases in one line: their times side by side)."""
    repeat = option(args, "repeat", 15)
    warmup = option(args, "warmup", 2, minimum=0)
    dtype = numpy.dtype(args.dtype)
    x = numpy.ones(int(mb * 1e6) // dtype.itemsize, dtype)  # x: (n,) on every rank
    out = numpy.empty_like(x)
    calls = {
        "raw": lambda: comm.Allreduce(x, out, op=MPI.SUM),
        "refconv_out": lambda: collectives.allreduce(comm, x, out=out),  # into a reused buffer, as raw does
        "refconv_inplace": lambda: collectives.allreduce_(comm, x),      # MPI.IN_PLACE
        "refconv": lambda: collectives.allreduce(comm, x),               # returns a new array
    }
    # One phase per variant, no pause (no BLAS runs here).  Alternating calls would let
    # the allocating variant's freed buffer slow whichever call follows it.
    times = {}
    for name in ORDER:
        x[...] = 1
        times.setdefault(name, []).extend(time_ranks(comm, {name: calls[name]}, repeat, warmup, pause=0.0)[name])
    config = {"ranks": comm.Get_size(), "mb": mb, "bytes": x.nbytes, "dtype": dtype.name,
              "repeat": repeat, "warmup": warmup, "sweep": args.sweep}
    gbs = {name: x.nbytes / numpy.median(t) / 1e9 for name, t in times.items()}
    lines = [record("collectives", f"allreduce {name}", env, dict(config, variant=name), {"allreduce": t},
                    {"bytes": {"allreduce": x.nbytes}, "calls": {"allreduce": 1}},
                    extra={"gb_per_s": gbs[name], "ratio_to_raw": gbs[name] / gbs["raw"]})
             for name, t in times.items()]
    if comm.Get_rank() == 0:
        print(f"allreduce of {x.nbytes / 1e6:.1f} MB {dtype.name} on {comm.Get_size()} ranks, median of {repeat}:")
        for name in ("refconv", "refconv_out", "refconv_inplace", "raw"):
            print(f"  {LABELS[name]:<52} {gbs[name]:.2f} GB/s  ratio to raw {gbs[name] / gbs['raw']:.3f}")
    return lines


SPLIT_OPS = ("reduce_scatter", "allgather")
SPLIT_MIB = (0.0625, 0.5, 4, 32)  # 64 KiB .. 32 MiB: the partial y / gathered dy of the scaling sweep's layers
SPLIT_BATCH = (1, 8, 32)
HW = 16 * 16                       # the buffer's (h, w); C follows from the size


def _split_axis(args, comm, env):
    """One line per (n, size): refconv's call, the packed formulation and the bare MPI call."""
    repeat = option(args, "repeat", 15)
    warmup = option(args, "warmup", 2, minimum=0)
    dtype = numpy.dtype(args.dtype)
    p, me = comm.Get_size(), comm.Get_rank()
    lines = []
    if me == 0:
        print(f"{args.op} along axis 1 of (n, C, 16, 16) {dtype.name} on {p} ranks, "
              f"median (min-max) of {repeat} rounds:")
        print(f"  {'n':>3} {'full':>9} {'refconv':>22} {'packed':>22} {'mpi only':>22} "
              f"{'pack share':>10} {'packed/refconv (min-max)':>24}")
    for n in SPLIT_BATCH if args.batch is None else (option(args, "batch", 1),):
        for mib in SPLIT_MIB if args.mb is None else args.mb:
            C = max(p, int(mib * 2**20) // (n * HW * dtype.itemsize))
            counts = block_sizes(C, p)
            calls, expected = _split_contenders(comm, args.op, (n, C, 16, 16), counts, dtype)
            for name, call in calls.items():  # every contender's output is checked before timing
                got = call()
                timing.check({"expected": expected, name: got}, reference="expected", reduction_length=p)
            # Rounds alternate; a sample is ~20 ms of back-to-back calls after ~5 ms of untimed ones,
            # because one small call alone measures only the wake-up.  No BLAS runs here, and at one
            # BLAS thread per rank pause_for gives no pause: nothing spins between contenders.
            times = time_ranks(comm, calls, repeat, warmup, pause=pause_for(env), window=0.02, settle=0.005)
            spans = {name: timing.Span(tuple(t)) for name, t in times.items()}
            # per round, from times measured seconds apart: what packing costs, what refconv gained
            share = timing.Span(tuple(1 - m / k for m, k in zip(times["mpi"], times["packed"])))
            gain = timing.ratio(spans, "packed", "refconv")
            config = {"ranks": p, "op": args.op, "shape": [n, C, 16, 16], "axis": 1, "counts": counts,
                      "bytes": n * C * HW * dtype.itemsize, "dtype": dtype.name, "repeat": repeat,
                      "warmup": warmup, "sweep": args.sweep}
            extra = {"pack_share": share.as_dict(), "packed_over_refconv": gain.as_dict()}
            lines.append(record("collectives", f"{args.op} axis=1 n={n} C={C}", env, config,
                                {args.op: times["refconv"], **{f"{args.op} {k}": times[k] for k in
                                                               ("packed", "mpi")}}, extra=extra))
            if me == 0:
                ms = {name: span.format(1e3, " ms", 2) for name, span in spans.items()}
                print(f"  {n:>3} {_size(config['bytes']):>9} {ms['refconv']:>22} {ms['packed']:>22} "
                      f"{ms['mpi']:>22} {share.median:>10.0%} {gain.format(1, '', 2):>24}", flush=True)
    return lines


def _size(nbytes):
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def _split_contenders(comm, op, shape, counts, dtype):
    """``({name: fn}, expected)`` for one configuration; ``expected`` is this rank's result."""
    p, me = comm.Get_size(), comm.Get_rank()
    n, C, h, w = shape
    inner = h * w
    start = sum(counts[:me])
    full = numpy.arange(n * C * inner, dtype=dtype).reshape(shape) % 7  # the same on every rank
    if op == "reduce_scatter":
        x = full                                                           # x: (n, C, h, w)
        expected = full[:, start:start + counts[me]] * p                   # (n, C_i, h, w)
        packed_x = numpy.ascontiguousarray(numpy.moveaxis(x, 1, 0))        # (C, n, h, w)
        el = [c * n * inner for c in counts]

        def packed():
            send = numpy.ascontiguousarray(numpy.moveaxis(x, 1, 0))
            recv = numpy.empty((counts[me], n, h, w), dtype)
            comm.Reduce_scatter(send, recv, el, op=MPI.SUM)
            return numpy.ascontiguousarray(numpy.moveaxis(recv, 0, 1))

        def mpi():
            recv = numpy.empty((counts[me], n, h, w), dtype)              # (C_i, n, h, w)
            comm.Reduce_scatter(packed_x, recv, el, op=MPI.SUM)
            return numpy.moveaxis(recv, 0, 1)                              # a view: no copy timed

        return {"refconv": lambda: collectives.reduce_scatter(comm, x, counts, axis=1),
                "packed": packed, "mpi": mpi}, expected
    x = numpy.ascontiguousarray(full[:, start:start + counts[me]])         # x: (n, C_i, h, w)
    packed_x = numpy.ascontiguousarray(numpy.moveaxis(x, 1, 0))            # (C_i, n, h, w)
    el = [c * n * inner for c in counts]
    spec = (el, [sum(el[:q]) for q in range(p)])

    def packed():
        send = numpy.ascontiguousarray(numpy.moveaxis(x, 1, 0))
        recv = numpy.empty((C, n, h, w), dtype)
        comm.Allgatherv(send, [recv, spec])
        return numpy.ascontiguousarray(numpy.moveaxis(recv, 0, 1))

    def mpi():
        recv = numpy.empty((C, n, h, w), dtype)
        comm.Allgatherv(packed_x, [recv, spec])
        return numpy.moveaxis(recv, 0, 1)

    return {"refconv": lambda: collectives.allgather(comm, x, counts, axis=1),
            "packed": packed, "mpi": mpi}, full


def add_arguments(p):
    """Flags of bench collectives only."""
    p.add_argument("--op", choices=("allreduce",) + SPLIT_OPS, default="allreduce",
                   help="the collective timed (default allreduce)")
    p.add_argument("--mb", type=float, nargs="+", default=None,
                   help=f"buffer size(s): allreduce one size in MB (1e6 B, default 16); reduce_scatter and "
                        f"allgather the full buffer in MiB (default {' '.join(map(str, SPLIT_MIB))})")
