"""The collective watchdog's cost: a 4 KB allreduce with and without a deadline, same run.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m refconv.bench.watchdog [--kb 4] [--calls 500] [--rounds 61]

Contenders, each timed over ``--calls`` back-to-back calls, in rounds that visit
them in turn with a pause between (so one's aftermath does not land on the
next) and rotate their order, reporting the median per-call time over rounds:

- ``no deadline``: ``collectives.allreduce(comm, x, out=out)`` with no timeout;
- ``deadline``: the same under ``collectives.timeout(300)``: the watchdog's cost
  is the ratio deadline / no deadline.

It also times the guard alone (no MPI call), with the deadline off and on, and
``fault_point`` with REFCONV_FAULT unset, on each rank in alternating rounds too
(``refconv.bench.timing.compare``; the allreduce rounds are
``refconv.bench.common.time_ranks``).
"""

import argparse
import statistics

import numpy
from mpi4py import MPI

from refconv import collectives
from refconv.collectives.watchdog import guard
from refconv.bench import timing
from refconv.bench.common import time_ranks


def _loop(fn, calls):
    """One contender's unit of work: ``calls`` calls of ``fn`` back to back."""
    for _ in range(calls):
        fn()


def _guards(calls, comm, x):
    """The watchdog's guard ``calls`` times around no MPI call."""
    for _ in range(calls):
        with guard("allreduce", comm, {"send": x, "recv": x}):
            pass


def _dicts(calls, x):
    """The baseline of _guards: the loop and the dict, no guard."""
    for _ in range(calls):
        {"send": x, "recv": x}


def _fault_points(calls):
    for _ in range(calls):
        collectives.fault_point("checkpoint.begin")


def _with_deadline(fn):
    """``fn`` run under a 300 s deadline (entered once per contender's loop, as training enters it once)."""
    def run():
        with collectives.timeout(300):
            fn()
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.watchdog")
    parser.add_argument("--kb", type=float, default=4.0, help="buffer size in KB (1e3 B)")
    parser.add_argument("--calls", type=int, default=500, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=61)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between contenders")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    collectives.set_timeout(None)   # the 'no deadline' contender: none (several ranks have 300 s by default)
    x = numpy.ones(int(args.kb * 1e3) // 4, numpy.float32)
    out = numpy.empty_like(x)

    per_call = lambda t: statistics.median(t) / args.calls  # noqa: E731  seconds of one call
    allreduce = lambda: _loop(lambda: collectives.allreduce(comm, x, out=out), args.calls)  # noqa: E731
    # Rounds alternate the contenders (rotating who goes first), a pause before each; a
    # round's time is the slowest rank's, all ranks starting together (time_ranks).
    times = time_ranks(comm, {"no deadline": allreduce, "deadline": _with_deadline(allreduce)}, args.rounds, 1,
                       args.pause)
    ratios = [d / n for d, n in zip(times["deadline"], times["no deadline"])]
    # The guard alone, on each rank by itself, in alternating rounds too: the bare loop and dict,
    # the guard without a deadline and with one, fault_point with REFCONV_FAULT unset.
    alone = timing.compare({"loop": lambda: _dicts(args.calls, x),
                            "guard off": lambda: _guards(args.calls, comm, x),
                            "guard on": _with_deadline(lambda: _guards(args.calls, comm, x)),
                            "fault": lambda: _fault_points(args.calls)},
                           rounds=args.rounds, warmup=1, pause=args.pause)
    loop, guard_off, guard_on, fault = (alone[k].median / args.calls for k in ("loop", "guard off", "guard on",
                                                                               "fault"))
    if comm.rank == 0:
        med = {k: per_call(v) * 1e6 for k, v in times.items()}
        print(f"allreduce of {x.nbytes} B float32 on {comm.size} ranks, median of {args.rounds} rounds "
              f"of {args.calls} calls (per call):")
        for name in times:
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
