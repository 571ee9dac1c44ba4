"""``refconv bench collectives``: allreduce bandwidth, refconv.collectives against raw mpi4py, same run.

    mpiexec -n 2 refconv bench collectives [--mb 16] [--repeat 15]

Bandwidth = buffer bytes / time (the "algorithm bandwidth"); the median over the
repetitions is reported.  Raw ``comm.Allreduce`` is the one MPI call made
outside ``refconv.collectives`` on purpose: it is what the wrappers are
measured against.  It runs both first and last, so drift shows as a gap
between the two raw phases.
"""

import numpy
from mpi4py import MPI

from refconv import collectives
from refconv.bench.common import BenchError, option, record, reject, time_ranks

ORDER = ("raw", "refconv_out", "refconv_inplace", "refconv", "raw")
LABELS = {
    "refconv": "refconv.collectives.allreduce",
    "refconv_out": "refconv.collectives.allreduce(out=) (reused buffer)",
    "refconv_inplace": "refconv.collectives.allreduce_ (in place)",
    "raw": "raw comm.Allreduce",
}


def run(args, comm, env):
    """One results line per variant (the two raw phases in one line: their times side by side)."""
    reject(args, ("grid", "algorithm", "filter-groups", "batch", "shape", "model"),
           "bench collectives times an allreduce of --mb megabytes over all ranks")
    if args.mb <= 0:
        raise BenchError(f"--mb: must be > 0, got {args.mb}")
    repeat = option(args, "repeat", 15)
    warmup = option(args, "warmup", 2, minimum=0)
    dtype = numpy.dtype(args.dtype)
    x = numpy.ones(int(args.mb * 1e6) // dtype.itemsize, dtype)  # x: (n,) on every rank
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
    config = {"ranks": comm.Get_size(), "mb": args.mb, "bytes": x.nbytes, "dtype": dtype.name,
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


def add_arguments(p):
    """Flags of bench collectives only."""
    p.add_argument("--mb", type=float, default=16.0, help="buffer size in MB (1e6 B)")
