"""Side-by-side timing that spinning BLAS threads cannot fool.

The whole API::

    from refconv.bench import timing

    timing.check(outputs, reference="refconv", reduction_length=K)   # before timing: outputs agree
    spans = timing.compare({"refconv": f, "torch": g}, rounds=7)      # {name: Span of seconds}
    spans["refconv"].median, spans["refconv"].min, spans["refconv"].max
    timing.ratio(spans, "torch", "refconv")   # Span of torch's time / refconv's, round by round
    str(spans["refconv"])                     # "12.3 ms (11.9-13.0)": median (min-max)

Why it is built this way:

- OpenBLAS (and OpenMP) worker threads keep spinning for about 0.1 s after a
  call returns.  A contender started in that window shares the cores with
  them and runs 3-30x slower.  So :func:`compare` sleeps ``pause`` seconds
  (0.25 s by default) before every timed call.
- The machines are shared and noisy, so contenders alternate inside each
  round (the one that goes first rotates) and every figure is the min,
  median and max over rounds, never one run.  A ratio is taken per round, from
  the two times measured seconds apart.
- Warm-up calls (caches, allocator, torch's kernel selection) run before
  the rounds and are not recorded.
- :func:`check` compares every contender's output with the reference before
  anything is timed: a fast wrong answer is an error, not a figure.
"""

import dataclasses
import statistics
import sys
import time

import numpy

from refconv import threads
from refconv.testing.asserts import assert_close

PAUSE = 0.25  # seconds: longer than the ~0.1 s that BLAS threads spin after a call


def spin_pause():
    """The pause before each timed call that this process needs: :data:`PAUSE` when one of its thread
    pools (BLAS, OpenMP, and torch's if torch is imported) runs more than one thread, whose workers spin
    after a call, else 0 (one thread a pool starts no workers, so nothing spins: ``OMP_NUM_THREADS=1``)."""
    counts = list(threads.current().values())
    torch = sys.modules.get("torch")
    if torch is not None:
        counts.append(torch.get_num_threads())
    return PAUSE if any(count > 1 for count in counts) else 0.0


@dataclasses.dataclass(frozen=True)
class Span:
    """Values over rounds (seconds, or ratios): ``min``, ``median``, ``max`` and all of them."""

    values: tuple

    @property
    def min(self):
        return min(self.values)

    @property
    def median(self):
        return statistics.median(self.values)

    @property
    def max(self):
        return max(self.values)

    def as_dict(self):
        return {"min": self.min, "median": self.median, "max": self.max, "values": list(self.values)}

    def format(self, scale=1e3, unit=" ms", digits=1):
        """``"12.3 ms (11.9-13.0)"``: median (min-max), times ``scale``."""
        m, lo, hi = (v * scale for v in (self.median, self.min, self.max))
        return f"{m:.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"

    def __str__(self):
        return self.format()


def compare(contenders, *, rounds=5, warmup=1, pause=None, calls=1, sync=None, settle=0, progress=None,
            clock=time.perf_counter):
    """Time each of ``contenders`` (``{name: fn}``, ``fn()`` does one unit of work) in
    ``rounds`` interleaved rounds; returns ``{name: Span of seconds per call}``.

    Each timed sample is ``calls`` back-to-back calls divided by ``calls``, started
    ``pause`` seconds after the previous contender finished (by default :func:`spin_pause`), and after ``settle``
    untimed calls (they bring the caches and the clock back to a busy core's after
    the pause).  ``calls`` and ``settle`` are an int or ``{name: int}``.  ``sync``, if
    given, is called before the clock is read at both ends (e.g. a device
    synchronize or a barrier).  ``progress``, if given, is called with the number of
    rounds done after each round (for a progress line on long runs).  ``clock`` reads the time:
    wall seconds by default, ``time.process_time`` for this process's CPU seconds (robust to
    other jobs on a shared machine, blind to waiting).
    """
    if not contenders:
        raise ValueError("contenders: expected at least one {name: callable}")
    names = list(contenders)
    pause = spin_pause() if pause is None else pause
    calls, settle = (v if isinstance(v, dict) else dict.fromkeys(names, v) for v in (calls, settle))
    if rounds < 1 or min(calls.values()) < 1 or warmup < 0 or pause < 0 or min(settle.values()) < 0:
        raise ValueError(f"compare: expected rounds >= 1, calls >= 1, warmup >= 0, pause >= 0, settle >= 0; "
                         f"got rounds={rounds}, calls={calls}, warmup={warmup}, pause={pause}, settle={settle}")
    sync = sync or (lambda: None)
    for _ in range(warmup):
        for name in names:
            time.sleep(pause)
            contenders[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # who goes first rotates
            time.sleep(pause)
            for _ in range(settle[name]):
                contenders[name]()
            sync()
            start = clock()
            for _ in range(calls[name]):
                contenders[name]()
            sync()
            times[name].append((clock() - start) / calls[name])
        if progress is not None:
            progress(r + 1)
    return {name: Span(tuple(t)) for name, t in times.items()}


def ratio(spans, numerator, denominator):
    """``spans[numerator] / spans[denominator]`` round by round, as a Span: with
    ``ratio(spans, "torch", "refconv")`` above 1 refconv is faster."""
    a, b = spans[numerator].values, spans[denominator].values
    if len(a) != len(b):
        raise ValueError(f"ratio: {numerator} has {len(a)} rounds and {denominator} {len(b)}; "
                         f"time them in one compare() call")
    return Span(tuple(x / y for x, y in zip(a, b)))


def check(outputs, reference, *, reduction_length=1, rtol=None, atol=None):
    """Raise AssertionError unless every output of ``outputs`` (``{name: array or tuple of
    arrays}``, torch tensors included) matches ``outputs[reference]`` within
    :func:`refconv.testing.assert_close`'s tolerance for that reduction length."""
    if reference not in outputs:
        raise ValueError(f"reference: expected one of {sorted(outputs)}, got {reference!r}")
    expected = _arrays(outputs[reference])
    for name, out in outputs.items():
        actual = _arrays(out)
        if len(actual) != len(expected):
            raise AssertionError(f"{name}: {len(actual)} outputs, {reference}: {len(expected)}")
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol=rtol, atol=atol, reduction_length=reduction_length,
                         name=f"{name} vs {reference}, output {k}")


def _arrays(out):
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [numpy.asarray(a.detach() if hasattr(a, "detach") else a) for a in items]
