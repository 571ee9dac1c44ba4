"""The collective watchdog's cost: a 4 KB allreduce with and without a deadline, same run.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m refconv.bench.watchdog [--kb 4] [--calls 500] [--rounds 61]

Contenders, each timed over ``--calls`` back-to-back calls, in rounds that visit
them in turn with a pause between (so one's aftermath does not land on the
next) and rotate their order, reporting the median per-call time over rounds:

- ``no deadline``: ``collectives.allreduce(comm, x, out=out)`` with no timeout;
- ``deadline``: the same under ``collectives.timeout(300)``: the watchdog's cost
  is the ratio deadline / no deadline.

It also times the guard alone (no MPI call), with the deadline off and on, and
``fault_point`` with REFCONV_FAULT unset.
"""

import argparse
import statistics
import time

import numpy
from mpi4py import MPI

from refconv import collectives


def _per_call(comm, fn, calls):
    """Seconds per call of ``fn``, the slowest rank's, all ranks starting together."""
    collectives.barrier(comm)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = numpy.array([time.perf_counter() - t0])
    return float(collectives.allreduce(comm, elapsed, op="max")[0]) / calls


def _guard_alone(calls, comm, x):
    t0 = time.perf_counter()
    for _ in range(calls):
        with collectives._watchdog("allreduce", comm, {"send": x, "recv": x}):
            pass
    return (time.perf_counter() - t0) / calls


def _loop_alone(calls, comm, x):
    """The baseline of _guard_alone: the loop and the dict, no guard."""
    t0 = time.perf_counter()
    for _ in range(calls):
        {"send": x, "recv": x}
    return (time.perf_counter() - t0) / calls


def _fault_point_alone(calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        collectives.fault_point("checkpoint.begin")
    return (time.perf_counter() - t0) / calls


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.watchdog")
    parser.add_argument("--kb", type=float, default=4.0, help="buffer size in KB (1e3 B)")
    parser.add_argument("--calls", type=int, default=500, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=61)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between contenders")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    if collectives.get_timeout() is not None:
        raise SystemExit("unset REFCONV_TIMEOUT: the 'no deadline' contender needs none")
    x = numpy.ones(int(args.kb * 1e3) // 4, numpy.float32)
    out = numpy.empty_like(x)

    def with_deadline():
        with collectives.timeout(300):
            return _per_call(comm, lambda: collectives.allreduce(comm, x, out=out), args.calls)

    contenders = {
        "no deadline": lambda: _per_call(comm, lambda: collectives.allreduce(comm, x, out=out), args.calls),
        "deadline": with_deadline,
    }
    times = {name: [] for name in contenders}
    for name in contenders:                     # warm-up round, not recorded
        contenders[name]()
    names = list(contenders)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:   # each contender goes first in turn
            time.sleep(args.pause)
            times[name].append(contenders[name]())
    ratios = [d / n for d, n in zip(times["deadline"], times["no deadline"])]

    guard_off = statistics.median(_guard_alone(args.calls, comm, x) for _ in range(args.rounds))
    with collectives.timeout(300):
        guard_on = statistics.median(_guard_alone(args.calls, comm, x) for _ in range(args.rounds))
    loop = statistics.median(_loop_alone(args.calls, comm, x) for _ in range(args.rounds))
    fault = statistics.median(_fault_point_alone(args.calls) for _ in range(args.rounds))
    if comm.rank == 0:
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(f"allreduce of {x.nbytes} B float32 on {comm.size} ranks, median of {args.rounds} rounds "
              f"of {args.calls} calls (per call):")
        for name in contenders:
            print(f"  {name:<12} {med[name]:7.2f} us")
        print(f"  ratio deadline / no deadline: median {statistics.median(ratios):.3f}, "
              f"rounds {min(ratios):.3f}-{max(ratios):.3f}")
        call = med["no deadline"] * 1e-6
        print(f"  the guard alone (no MPI call, less the bare loop): {(guard_off - loop) * 1e9:.0f} ns "
              f"without a deadline, {(guard_on - loop) * 1e9:.0f} ns with one; the deadline adds "
              f"{(guard_on - guard_off) / call:.1%} of the call, the whole guard {(guard_on - loop) / call:.1%}")
        print(f"  fault_point with REFCONV_FAULT unset: {fault * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
