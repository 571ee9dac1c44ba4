"""``python -m refconv.bench.ranks``: a Hypothesis example of ``check_layer`` on simulated ranks
against the same example under ``mpiexec``, side by side.

    python -m refconv.bench.ranks [--ranks 4] [--examples 12] [--rounds 3]

The examples are the first ``--examples`` that ``dist_conv_cases(ranks)`` draws derandomized
(X, Y and W on drawn grids, uneven blocks), written to a file both contenders read.  First one
``mpiexec -n K python -m mpi4py`` launch runs every example ``--rounds`` times, each timed from a
barrier to the slowest rank's end (the launch, imports and MPI's start excluded); after a pause
this process runs each example as often with :func:`refconv.simulated.run`, each timed from the
call to its return (threads started and joined included).  One BLAS thread per rank in both
(``OMP_NUM_THREADS=1`` for the launch; ``simulated.run`` limits BLAS to one thread).  It prints
each example's median milliseconds and the ratio simulated / mpiexec, and their geometric mean:
below 1, an example costs less on simulated ranks.
"""

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from refconv import collectives, simulated
from refconv.bench.timing import PAUSE
from refconv.testing import mpirun
from refconv.testing.check import check_case
from refconv.testing.strategies import dist_conv_cases


def drawn_cases(ranks, count):
    """The first ``count`` cases ``dist_conv_cases(ranks)`` draws, derandomized: the same every run."""
    cases = []

    @settings(max_examples=count, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(st.data())
    def draw(data):
        cases.append(data.draw(dist_conv_cases(ranks)))
    draw()
    return cases[:count]


def time_simulated(cases, ranks, rounds):
    """Per case, the seconds of each round of ``simulated.run(check_case, ranks)``."""
    out = []
    for case in cases:
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            simulated.run(check_case, ranks, args=(case,))
            times.append(time.perf_counter() - start)
        out.append(times)
    return out


def time_mpiexec(path, ranks, rounds):
    """The same under one ``mpiexec -n ranks`` launch of :func:`_rank_side`."""
    out = path + ".json"
    env = mpirun._env() | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    subprocess.run([mpirun.find_mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "refconv.bench.ranks",
                    "--rank-side", path, out, "--rounds", str(rounds)], check=True, env=env, timeout=1800)
    with open(out) as f:
        return json.load(f)


def _rank_side(path, out, rounds):
    comm = MPI.COMM_WORLD
    with open(path, "rb") as f:
        cases = pickle.load(f)
    result = []
    for case in cases:
        times = []
        for _ in range(rounds):
            collectives.barrier(comm)
            start = time.perf_counter()
            check_case(comm, case)
            elapsed = collectives.allreduce(comm, numpy.array([time.perf_counter() - start]), op="max")[0]
            times.append(float(elapsed))
        result.append(times)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refconv.bench.ranks", description=(
        "A Hypothesis example of check_layer on simulated ranks beside the same example under one mpiexec launch "
        "(launch excluded), one BLAS thread per rank; prints the ratios."))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--examples", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rank-side", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_side:
        _rank_side(*args.rank_side, args.rounds)
        return 0
    cases = drawn_cases(args.ranks, args.examples)
    with tempfile.TemporaryDirectory(prefix="refconv-bench-ranks-") as folder:
        path = os.path.join(folder, "cases.pickle")
        with open(path, "wb") as f:
            pickle.dump(cases, f)
        real = time_mpiexec(path, args.ranks, args.rounds)
    time.sleep(PAUSE)
    sim = time_simulated(cases, args.ranks, args.rounds)
    print(f"check_layer per Hypothesis example at {args.ranks} ranks: median of {args.rounds} rounds, ms "
          f"(mpiexec: launch excluded; one BLAS thread per rank; {os.cpu_count()} cores)")
    print(f"{'example':60s} {'mpiexec':>9s} {'simulated':>10s} {'sim/mpi':>8s}")
    ratios = []
    for case, m, s in zip(cases, real, sim):
        m, s = float(numpy.median(m)), float(numpy.median(s))
        ratios.append(s / m)
        label = f"{case.algorithm} grid {case.grid_shape} x {case.problem.x_shape} w {case.problem.w_shape}"
        print(f"{label[:60]:60s} {m * 1e3:9.2f} {s * 1e3:10.2f} {s / m:8.2f}")
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean of simulated / mpiexec: {geomean:.2f} "
          f"(totals: mpiexec {sum(numpy.median(m) for m in real) * 1e3:.1f} ms, "
          f"simulated {sum(numpy.median(s) for s in sim) * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
