"""Allreduce bandwidth: refconv.collectives.allreduce vs raw comm.Allreduce, same run.

    mpiexec -n 2 python -m refconv.bench_collectives [--mb 16] [--reps 15]

Bandwidth = buffer bytes / time (the "algorithm bandwidth"); the median over the
repetitions is reported.  Raw mpi4py is measured before and after the wrappers.
"""

import argparse
import statistics
import time

import numpy
from mpi4py import MPI

from refconv import collectives


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench_collectives")
    parser.add_argument("--mb", type=float, default=16.0, help="buffer size in MB (1e6 B)")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = int(args.mb * 1e6) // 4
    x = numpy.ones(n, numpy.float32)
    out = numpy.empty_like(x)
    calls = {
        "raw": lambda: comm.Allreduce(x, out, op=MPI.SUM),
        "refconv_out": lambda: collectives.allreduce(comm, x, out=out),  # into a reused buffer, as raw does
        "refconv_inplace": lambda: collectives.allreduce_(comm, x),      # MPI.IN_PLACE
        "refconv": lambda: collectives.allreduce(comm, x),               # returns a new array
    }
    # One phase per variant, raw both first and last: drift shows as a gap between the two
    # raw phases.  (Alternating calls would let the allocating variant's freed 16 MB slow
    # whichever call follows it.)
    times = {}
    for name in ["raw", "refconv_out", "refconv_inplace", "refconv", "raw"]:
        x[...] = 1.0
        for rep in range(args.reps + 2):  # the first two are warm-up
            comm.Barrier()
            t0 = time.perf_counter()
            calls[name]()
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if rep >= 2:
                times.setdefault(name, []).append(dt)
    if comm.rank == 0:
        gbs = {k: x.nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
        print(f"allreduce of {x.nbytes / 1e6:.1f} MB float32 on {comm.size} ranks, "
              f"median of {args.reps}:")
        print(f"  refconv.collectives.allreduce  {gbs['refconv']:.2f} GB/s")
        print(f"  refconv.collectives.allreduce(out=) {gbs['refconv_out']:.2f} GB/s (reused buffer)")
        print(f"  refconv.collectives.allreduce_ {gbs['refconv_inplace']:.2f} GB/s (in place)")
        print(f"  raw comm.Allreduce             {gbs['raw']:.2f} GB/s")
        print(f"  ratio refconv/raw              {gbs['refconv'] / gbs['raw']:.3f}")
        print(f"  ratio refconv(out=)/raw        {gbs['refconv_out'] / gbs['raw']:.3f}")
        print(f"  ratio refconv in-place/raw     {gbs['refconv_inplace'] / gbs['raw']:.3f}")


if __name__ == "__main__":
    main()
