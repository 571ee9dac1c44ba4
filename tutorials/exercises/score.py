"""The score of a passing answer: what each rank moved, held and spent, beside the reference solution's.

One run of ``body(comm, *args)`` on simulated ranks priced with the machine file
:data:`MACHINE` (``refconv/pricing/machines/v100-edr.yaml``: four V100s a node, EDR
InfiniBand between nodes).  Per rank:

- **bytes moved**: the bytes ``refconv.collectives`` records for the rank's calls
  (``collectives.stats.recording()``; the buffer sizes of docs/algorithms.md's cost table,
  halo messages as sent);
- **peak memory**: the largest total of the arrays your function allocated that are alive
  at one of its calls to ``refconv.collectives`` or at its return.  It is measured with
  ``tracemalloc`` on the priced run, where one rank runs at a time and the turn passes only
  at a call: each allocation's traceback says which rank's function made it, so the ranks'
  totals are separable.  A temporary freed between two calls is not seen, so this is a lower
  bound of the true peak, the same bound for yours and the reference's.  Inputs the checker
  hands you are not counted;
- **time**: the rank's logical clock at the end (:mod:`refconv.simulated.clock`): each local
  convolution priced by the machine file (when it runs through :mod:`tutorials.exercises.kit`),
  each call by its record; Python's own time is free.
"""

import tracemalloc

from refconv import collectives, simulated

MACHINE = "v100-edr"
FRAMES = 64  # tracemalloc's traceback depth: enough to reach the rank's own frame from numpy's allocator
NUMPY_DOMAIN = 389047  # the tracemalloc domain NumPy reports its array data in (numpy/core/src/multiarray/alloc.c)


def _rank_frame(rank):
    """A function whose frame is recognisable in a traceback as rank ``rank``'s."""
    source = "def on_rank(fn, sample, *args):\n    result = fn(*args)\n    sample()\n    return result\n"
    scope = {}
    exec(compile(source, f"<exercise rank {rank}>", "exec"), scope)
    return scope["on_rank"]


class _Sampled(list):
    """A recording region's list of records that samples the rank's memory at each call."""

    def __init__(self, sample):
        super().__init__()
        self.sample = sample

    def append(self, record):
        self.sample()
        super().append(record)


def measure(body, ranks, *args):
    """Per rank ``{"bytes", "memory", "seconds"}`` of ``body(comm, *args)`` (see the module)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(FRAMES)
    frames = [_rank_frame(r) for r in range(ranks)]

    def rank(comm, *rest):
        mine = [tracemalloc.Filter(True, f"<exercise rank {comm.rank}>", all_frames=True, domain=NUMPY_DOMAIN)]
        peak = [0]

        def sample():
            live = tracemalloc.take_snapshot().filter_traces(mine)
            peak[0] = max(peak[0], sum(t.size for t in live.traces))

        with collectives.stats.recording() as region:
            region.records = _Sampled(sample)
            frames[comm.rank](body, sample, comm, *rest)
        return {"bytes": sum(s["bytes"] for s in region.summary(moved_only=True).values()), "memory": peak[0]}

    try:
        results = simulated.run(rank, ranks, args=args, machine=MACHINE, timeout=60)
    finally:
        if started:
            tracemalloc.stop()
    return [dict(value, seconds=clock.t) for value, clock in results]


def table(case, yours, reference):
    """The score's lines: per rank, yours and (in brackets) the reference solution's."""
    lines = [f"score on {case} (machine file {MACHINE}; the reference solution's in brackets):",
             "  rank   bytes moved            peak memory            time on the clock"]
    for r, (a, b) in enumerate(zip(yours, reference)):
        lines.append(f"  {r:<6} {_pair(a['bytes'], b['bytes'], 'B'):22} {_pair(a['memory'], b['memory'], 'B'):22} "
                     f"{a['seconds'] * 1e6:.1f} us ({b['seconds'] * 1e6:.1f} us)")
    verdict = []
    for key, what in (("bytes", "moves"), ("memory", "holds"), ("seconds", "takes")):
        mine, ref = max(a[key] for a in yours), max(b[key] for b in reference)
        if mine > ref * 1.001:
            verdict.append(f"yours {what} {mine / ref:.2f}x the reference's at the busiest rank" if ref else
                           f"yours {what} {mine:.3g} where the reference's {what} nothing")
    lines.append("  " + ("; ".join(verdict) if verdict else "as good as the reference on all three"))
    return lines


def _pair(a, b, unit):
    return f"{a:,} ({b:,}) {unit}"


def compare(case, body_of, module, solution, ranks, *args):
    """The score's lines for ``body_of(module)`` against ``body_of(solution)`` on ``ranks`` ranks."""
    return table(case, measure(body_of(module), ranks, *args), measure(body_of(solution), ranks, *args))
