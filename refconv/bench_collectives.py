"""Allreduce bandwidth: refconv.collectives.allreduce vs raw comm.Allreduce, same run.

    mpiexec -n 2 python -m refconv.bench_collectives [--mb 16] [--reps 15]

Bandwidth = buffer bytes / time (the "algorithm bandwidth"); the median over the
repetitions is reported.  The two variants alternate, so drift hits both alike.
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
    times = {"refconv": [], "refconv_inplace": [], "raw": []}
    for rep in range(args.reps + 2):        # the first two are warm-up
        for name in times:
            comm.Barrier()
            t0 = time.perf_counter()
            if name == "refconv":
                collectives.allreduce(comm, x)           # returns a new array
            elif name == "refconv_inplace":
                collectives.allreduce_(comm, x)          # MPI.IN_PLACE
            else:
                comm.Allreduce(x, out, op=MPI.SUM)
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if rep >= 2:
                times[name].append(dt)
    if comm.rank == 0:
        gbs = {k: x.nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
        print(f"allreduce of {x.nbytes / 1e6:.1f} MB float32 on {comm.size} ranks, "
              f"median of {args.reps}:")
        print(f"  refconv.collectives.allreduce  {gbs['refconv']:.2f} GB/s")
        print(f"  refconv.collectives.allreduce_ {gbs['refconv_inplace']:.2f} GB/s (in place)")
        print(f"  raw comm.Allreduce             {gbs['raw']:.2f} GB/s")
        print(f"  ratio refconv/raw              {gbs['refconv'] / gbs['raw']:.3f}")
        print(f"  ratio refconv in-place/raw     {gbs['refconv_inplace'] / gbs['raw']:.3f}")


if __name__ == "__main__":
    main()
