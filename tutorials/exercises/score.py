"""The score of a passing answer: what each rank moved, held and spent, beside the reference solution's.

One run of ``body(comm, *args)`` on simulated ranks priced with the machine file
:data:`MACHINE` (``refconv/pricing/machines/v100-edr.yaml``: four V100s a node, EDR
InfiniBand between nodes).  Per rank:

- **bytes moved**: what the rank sends, from the records ``refconv.collectives`` makes of its
  calls (``collectives.stats.recording()``), as docs/algorithms.md's cost table counts them for
  ring collectives: ``(q-1)/q m`` for an allgather or reduce-scatter of a full buffer ``m`` over
  ``q`` ranks, twice that for an allreduce, a halo's messages as sent
  (:attr:`refconv.algorithms.Call.wire_bytes`);
- **peak memory**: the largest total of the distinct arrays (counted once per buffer) that the
  rank holds at one of its calls to ``refconv.collectives`` or at its return: those in the local
  variables of every frame of the rank's stack, from its function down to the call, and in the
  lists, tuples, dicts and objects they hold (``layer.saved`` too).  The arrays the checker hands
  the rank (its inputs) are not counted.  An array made and dropped between two calls is not
  seen, so this is a lower bound of the true peak, measured alike for yours and the reference's.
  (``tracemalloc`` cannot separate threads, and tracing deep enough to tell the ranks apart by
  their stacks made a score take seconds.)
- **time**: the rank's logical clock at the end (:mod:`refconv.simulated.clock`): each local
  convolution priced by the machine file (when it runs through :mod:`tutorials.exercises.kit`),
  each call by its record; Python's own time is free.
"""

import sys
import threading

import numpy

from refconv import collectives, simulated
from refconv.algorithms import Call

MACHINE = "v100-edr"
DEPTH = 3  # how deep into lists, dicts and objects the arrays a frame holds are looked for
_RANK = threading.local()  # on a measured rank: .frame, the rank's own frame; .inputs, the roots not counted


def _root(a):
    """The array that owns ``a``'s buffer."""
    while isinstance(a.base, numpy.ndarray):
        a = a.base
    return a


def _arrays(value, found, depth=DEPTH):
    """Every array in ``value`` (and in what it holds, ``depth`` levels down), by root: ``found[id] = root``."""
    if isinstance(value, numpy.ndarray):
        root = _root(value)
        found[id(root)] = root
    elif depth and isinstance(value, (list, tuple, set)):
        for v in value:
            _arrays(v, found, depth - 1)
    elif depth and isinstance(value, dict):
        for v in value.values():
            _arrays(v, found, depth - 1)
    elif depth and hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value) \
            and type(value).__module__ not in ("builtins",) and not type(value).__module__.startswith("refconv"):
        _arrays(vars(value), found, depth - 1)


def given(*values):
    """Inputs a checker hands the rank (not counted in its memory); a no-op outside a measured run."""
    if getattr(_RANK, "inputs", None) is not None:
        _arrays(values, _RANK.inputs)


def checkpoint():
    """Sample the rank's memory now (a checker calls it as a function of yours returns, holding its result)."""
    if getattr(_RANK, "frame", None) is not None:
        _sample(_RANK.peak, sys._getframe(1))


def _sample(peak, frame=None):
    """The arrays the rank holds now, from the frame that called a collective down to its own frame."""
    found, frame = {}, frame or sys._getframe(1)
    while frame is not None:
        free = frame.f_code.co_freevars  # a closure's variables are the enclosing function's, not this frame's
        _arrays([v for k, v in frame.f_locals.items() if k not in free], found)
        if frame is _RANK.frame:
            break
        frame = frame.f_back
    held = sum(a.nbytes for key, a in found.items() if key not in _RANK.inputs)
    peak[0] = max(peak[0], held)


class _Sampled(list):
    """A recording region's list of records that samples the rank's memory at each call."""

    def __init__(self, peak):
        super().__init__()
        self.peak = peak

    def append(self, record):
        _sample(self.peak)
        super().append(record)


def measure(body, ranks, *args):
    """Per rank ``{"bytes", "memory", "seconds"}`` of ``body(comm, *args)`` (see the module)."""
    def rank(comm, *rest):
        peak = [0]
        _RANK.frame, _RANK.inputs, _RANK.peak = sys._getframe(), {}, peak
        _arrays(rest, _RANK.inputs)
        try:
            with collectives.stats.recording() as region:
                region.records = _Sampled(peak)
                result = body(comm, *rest)
                _sample(peak)  # what the rank returns, and still holds
            del result
        finally:
            _RANK.frame = _RANK.inputs = _RANK.peak = None
        sent = sum(Call(r.kind, r.comm_size, r.bytes, r.messages).wire_bytes for r in region.records if r.comm_size > 1)
        return {"bytes": round(sent), "memory": peak[0]}

    results = simulated.run(rank, ranks, args=args, machine=MACHINE, timeout=60)
    return [dict(value, seconds=clock.t) for value, clock in results]


def table(case, yours, reference):
    """The score's lines: per rank, yours and (in brackets) the reference solution's."""
    lines = [f"score on {case} (machine file {MACHINE}; the reference solution's in brackets):",
             "  rank   bytes moved            peak memory            time on the clock"]
    for r, (a, b) in enumerate(zip(yours, reference)):
        lines.append(f"  {r:<6} {_pair(a['bytes'], b['bytes'], 'B'):22} {_pair(a['memory'], b['memory'], 'B'):22} "
                     f"{a['seconds'] * 1e6:.1f} us ({b['seconds'] * 1e6:.1f} us)")
    pairs = [(what, max(a[key] for a in yours), max(b[key] for b in reference), " at the busiest rank")
             for key, what in (("bytes", "moves"), ("memory", "holds"), ("seconds", "takes"))]
    return lines + ["  " + verdict(pairs)]


def verdict(pairs):
    """The score's last line.  ``pairs``: ``(verb, yours, the reference's, where)``, smaller better; each of
    yours past the reference's is said as a ratio, ``where`` saying what it is of."""
    worse = [f"yours {verb} {mine / ref:.2f}x the reference's{where}" if ref else
             f"yours {verb} {mine:.3g} where the reference's {verb} nothing"
             for verb, mine, ref, where in pairs if mine > ref * 1.001]
    everything = {2: "both", 3: "all three", 4: "all four"}.get(len(pairs), f"all {len(pairs)}")
    return "; ".join(worse) if worse else f"as good as the reference on {everything}"


def _pair(a, b, unit):
    return f"{a:,} ({b:,}) {unit}"


def compare(case, body_of, module, solution, ranks, *args):
    """The score's lines for ``body_of(module)`` against ``body_of(solution)`` on ``ranks`` ranks."""
    return table(case, measure(body_of(module), ranks, *args), measure(body_of(solution), ranks, *args))
