"""What the ``refconv bench`` subcommands share: flags, named shapes, timing
across ranks, and the results line each appends to ``--out``.

A results line (one JSON object per line, schema in ``refconv.bench.schema``)::

    {"schema": "refconv.bench/1", "bench": "layer", "label": "channel=4 stationary-x",
     "env": <refconv info's record>, "config": {"ranks": 4, "grid": {...}, ...},
     "passes": {"forward": {"min": s, "median": s, "max": s, "times": [...]}, ...},
     "bytes": {"allreduce": B, ...}, "calls": {...}, "wire_bytes": {...},
     "seconds_total": s, "seconds": {"allreduce": s, ...}, "extra": {...}}

Times are seconds; under MPI one repetition's time is the slowest rank's.
``bytes``/``calls``/``wire_bytes`` are per repetition on the busiest rank, as
``refconv.collectives.stats`` records them.  ``seconds_total`` and ``seconds``
split ``repeat`` extra repetitions on the slowest rank: its mean time per
repetition, and the time it spent inside each kind of MPI call (:func:`traffic`).
"""

import argparse
import datetime
import json
import math
import statistics
import time

import numpy

from refconv import arrays, checks, collectives, cost_model
from refconv.bench import timing
from refconv.algorithms import channel_algorithms
from refconv.train_config import GRID_AXES, add_option, check_grid_ranks

ALGORITHMS = channel_algorithms()
STRATEGIES = ("sample", "spatial") + ALGORITHMS  # what --strategies takes: strategy_grid knows each
# name: (C, F, H=W, K, stride, padding)
SHAPES = {
    "conv2": (64, 64, 56, 3, 1, 1),      # the ResNet-50-like shapes of the kernels issue
    "conv3": (128, 128, 28, 3, 1, 1),
    "conv4": (256, 256, 14, 3, 1, 1),
    "conv5": (512, 512, 7, 3, 1, 1),
    "conv1": (3, 64, 224, 7, 2, 3),
    "foundation": (64, 64, 32, 3, 1, 1),  # the layer the foundation issue measures the CPU path on
    "layer": (64, 64, 16, 3, 1, 1),       # bench layer's default
    "wide": (256, 256, 16, 3, 1, 1),      # the wide layer of the scaling sweep
    "tiny": (8, 8, 8, 3, 1, 1),           # smoke tests
    "quick3x3": (8, 8, 8, 3, 1, 1),
    "quick7x7s2": (3, 8, 16, 7, 2, 3),
}
SHAPE_KEYS = ("C", "F", "H", "K", "stride", "padding")


class BenchError(ValueError):
    """Bad benchmark input; the message names the flag and what would be right."""


def parse_shape(text):
    """A name of ``SHAPES`` or ``C=64,F=64,H=16,K=3[,stride=1,padding=1]`` -> a shape dict."""
    if text in SHAPES:
        return dict(zip(SHAPE_KEYS, SHAPES[text]), name=text)
    fields = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in SHAPE_KEYS or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"expected a name {sorted(SHAPES)} or C=..,F=..,H=..,K=..[,stride=..,padding=..] "
                f"with non-negative ints; got {text!r}")
        fields[key.strip()] = int(value)
    missing = [k for k in ("C", "F", "H", "K") if k not in fields]
    if missing:
        raise argparse.ArgumentTypeError(f"{text!r} lacks {', '.join(missing)}")
    fields.setdefault("stride", 1)
    fields.setdefault("padding", fields["K"] // 2)
    return dict(fields, name=text)


def add_arguments(p):
    """The flags every subcommand takes (a subcommand rejects those that do not apply to it)."""
    g = p.add_argument_group("what to run (the same flags for every subcommand)")
    add_option(g, "grid", unset="bench layer: each strategy in turn; bench step: sample=<ranks>")
    add_option(g, "algorithm", choices=ALGORITHMS, unset="stationary-x")
    g.add_argument("--filter-groups", type=int, help="p_f of stationary-w")
    g.add_argument("--batch", type=int, help="global batch size N")
    g.add_argument("--shape", "--shapes", type=parse_shape, nargs="+", metavar="SHAPE",
                   help=f"layer shapes: names {sorted(SHAPES)} or C=..,F=..,H=..,K=..")
    add_option(g, "model", default=None, unset="digits-cnn", purpose="bench step")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--repeat", type=int, help="timed repetitions (min, median and max reported)")
    g.add_argument("--warmup", type=int, help="untimed repetitions first")
    add_option(g, "backend")
    add_option(g, "threads")
    g.add_argument("--oversubscribe-gpus", action="store_true", help="allow more ranks per node than GPUs")
    g.add_argument("--out", metavar="PATH", help="append one JSON line per configuration (see refconv.bench.schema)")
    g.add_argument("--sweep", type=json.loads, default=None, help=argparse.SUPPRESS)  # set by refconv sweep


def reject(args, names, why):
    """BenchError for the first flag of ``names`` the user set: it has no meaning for this subcommand."""
    for name in names:
        if getattr(args, name.replace("-", "_")) is not None:
            raise BenchError(f"--{name}: {why}")


def option(args, name, default, minimum=1):
    """``args.<name>``, or ``default`` when unset; an int of at least ``minimum`` (``checks.integer``)."""
    value = getattr(args, name)
    return checks.integer(default if value is None else value, f"--{name.replace('_', '-')}", minimum=minimum)


def full_grid(grid, ranks):
    """``{"sample": 2}`` -> all four axes; the product must be the number of ranks."""
    grid = {axis: (grid or {}).get(axis, 1) for axis in GRID_AXES}
    check_grid_ranks(grid, ranks)  # refconv train's message
    return grid


def grid_text(grid):
    """``{"sample": 2, "channel": 1, ...}`` -> ``"sample=2"`` (axes of size 1 left out; all 1: ``"serial"``)."""
    text = ",".join(f"{axis}={size}" for axis, size in grid.items() if size > 1)
    return text or "serial"


def strategy_grid(strategy, ranks):
    """(grid, algorithm) of a named strategy on ``ranks`` ranks (refconv sweep's series)."""
    if strategy == "sample":
        return {"sample": ranks}, "stationary-x"
    if strategy == "spatial":
        return {"height": ranks}, "stationary-x"
    if strategy in ALGORITHMS:
        return {"channel": ranks}, strategy
    raise BenchError(f"--strategies: unknown {strategy!r}; expected some of {STRATEGIES}")


def summarize(times):
    """min, median and max of a list of seconds, with the list itself."""
    return {"min": min(times), "median": statistics.median(times), "max": max(times), "times": list(times)}


def pause_for(env):
    """Seconds to pause before each timed call: ``timing.PAUSE`` when BLAS worker threads
    may still spin from the previous call (more than one thread per rank on the CPU),
    else 0 (one BLAS thread per rank starts no workers; a GPU kernel leaves none)."""
    on_cpu = [r for r in env["ranks"] if r["gpu"] is None]
    return timing.PAUSE if on_cpu and max(r["threads"] for r in on_cpu) > 1 else 0.0


def time_ranks(comm, contenders, repeat, warmup, pause, *, window=0.0, settle=0.0, progress=None):
    """``{name: seconds of each round}`` of ``contenders`` (``{name: fn}``), timed by
    ``refconv.bench.timing.compare`` in alternating rounds: every rank starts a call
    together (a barrier), the device is synchronized before the clock stops, and a
    round's time is the slowest rank's.  ``pause``: see :func:`pause_for`.

    ``window`` seconds: each round runs a contender back to back about this long
    (as many calls as its first call says fit, at most 200).  On a node with more
    ranks than cores every rank then computes while the others do, as in training,
    instead of slipping into the gaps of the others.  ``settle`` seconds of untimed
    calls follow each pause (at most 50).  Every rank makes the same number of calls
    (a contender may hold collectives): the counts come from the slowest rank's first
    call, which is then also the warm-up.  ``progress``: called after each round with the
    rounds done (``timing.compare``'s)."""

    def sync():
        arrays.synchronize()
        collectives.barrier(comm)

    calls, settles = 1, 0
    if window or settle:
        first = []
        for fn in contenders.values():
            start = time.perf_counter()
            fn()
            first.append(time.perf_counter() - start)
        first = collectives.allreduce(comm, numpy.array(first), op="max")
        fit = lambda seconds, cap: {name: min(cap, max(1, math.ceil(seconds / max(t, 1e-6))))  # noqa: E731
                                    for name, t in zip(contenders, first)}
        calls, settles = fit(window, 200), (fit(settle, 50) if settle else 0)
    spans = timing.compare(contenders, rounds=repeat, warmup=warmup, pause=pause, sync=sync, calls=calls,
                           settle=settles, progress=progress)
    names = list(contenders)
    mine = numpy.array([spans[name].values for name in names], numpy.float64)  # (contenders, rounds)
    slowest = collectives.allreduce(comm, mine, op="max")
    return {name: [float(t) for t in slowest[i]] for i, name in enumerate(names)}


def traffic(comm, fn, calls, *, moved_only=False):
    """What ``calls`` more calls of ``fn()`` move and where their time goes, per call.

    Inside a ``collectives.stats`` region (no rounds, no pauses): ``bytes``, ``calls``
    and ring-model ``wire_bytes`` per kind of collective, each the busiest rank's (the
    same every call); ``seconds_total``, the mean wall time of a call on the slowest
    rank, and ``seconds``, that rank's time inside each kind of MPI call, so that
    compute is ``seconds_total - sum(seconds)``.  ``moved_only`` leaves out calls on
    one-rank communicators."""
    collectives.barrier(comm)
    start = time.perf_counter()
    with collectives.stats.recording() as region:
        for _ in range(calls):
            fn()
        arrays.synchronize()
    wall = (time.perf_counter() - start) / calls
    mine = {}
    for r in region.records:
        if moved_only and r.comm_size == 1:
            continue
        s = mine.setdefault(r.kind, {"bytes": 0, "calls": 0, "wire_bytes": 0.0})
        s["bytes"] += r.bytes
        s["calls"] += 1
        s["wire_bytes"] += cost_model.Call(r.kind, r.comm_size, r.bytes).wire_bytes  # the ring model
    seconds = {kind: t / calls for kind, t in region.seconds.items() if kind in mine}
    everyone = collectives.allgather_object(comm, (wall, mine, seconds))
    kinds = sorted({k for _, per, _ in everyone for k in per})
    out = {field: {k: max(per.get(k, {}).get(field, 0) for _, per, _ in everyone) for k in kinds}
           for field in ("bytes", "calls", "wire_bytes")}
    out = {field: {k: v // calls if field != "wire_bytes" else v / calls for k, v in per.items()}
           for field, per in out.items()}  # every call moves the same
    out["seconds_total"], _, out["seconds"] = max(everyone, key=lambda e: e[0])  # the slowest rank
    return out


def record(bench, label, env, config, passes, traffic=None, extra=None):
    """One results line (see the module docstring); ``traffic`` as :func:`traffic` returns it."""
    traffic = traffic or {}
    line = {"schema": "refconv.bench/1", "bench": bench, "label": label,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "env": env, "config": config, "passes": {name: summarize(t) for name, t in passes.items()},
            **{field: traffic.get(field, {}) for field in ("bytes", "calls", "seconds", "wire_bytes")},
            "seconds_total": traffic.get("seconds_total"),
            "extra": extra or {}}
    return line


def append_lines(path, lines):
    """Append ``lines`` (dicts) to ``path`` as JSON lines."""
    with open(path, "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
