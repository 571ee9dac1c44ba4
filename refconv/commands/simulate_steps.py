"""The training steps ``refconv simulate`` runs on simulated ranks, and what each rank spent per layer.

:func:`run_steps` builds the model on every rank of a priced simulated world
(``refconv.simulated.run(..., machine=...)``) and trains ``steps`` steps on one global batch.
Each rank keeps a :class:`Ledger`: per leaf layer (``Model.named_layers``), over each step,

    compute   seconds charged to the rank's logical clock inside the layer's forward and
              backward, and for its kernel's price (``Clock.layer``, charged just after a pass)
    exposed   seconds the rank stood waiting inside the layer (its time there less its compute)
    hidden    seconds of calls started inside the layer that ran behind compute
              (:func:`refconv.overlap.hidden_by_kind` of those calls)
    bytes     what the calls recorded inside the layer carry (``collectives.stats``)

What no leaf layer holds (the shuffles between grids, the loss, the optimizer's wait for the
gradients) is the step's total less the layers', the row :data:`OUTSIDE`.

Memory is measured by :mod:`refconv.shapes.memory` (a rank's live bytes of shapes-only arrays, by
kind and by layer) when the backend is ``"shapes"``; with values (``"numpy"``) it is not
measured, and the figures are None: never zeros.
"""

import bisect
import contextlib
import gc
import time

import numpy

from refconv import simulated
from refconv.backend import get_backend
from refconv.collectives import local
from refconv.model import Model
from refconv.optim import SGD
from refconv.overlap import hidden_by_kind
from refconv.shapes import memory
from refconv.simulated import clock as clock_mod
from refconv.train import step

OUTSIDE = "(between-layers)"   # shuffles between grids, the loss, the optimizer's waits
FIELDS = ("compute", "exposed", "hidden", "bytes", "calls")


@contextlib.contextmanager
def memory_tracking(backend):
    """On a simulated rank: its memory tracker while the block runs (``refconv.shapes.memory``),
    or None where memory is not measured (a backend with values)."""
    if backend != "shapes":
        yield None
        return
    with memory.tracking():
        yield memory.current()


@contextlib.contextmanager
def few_collections(young=20_000):
    """Python's garbage collector paced for a world of simulated ranks while the block runs: a
    collection of the youngest objects every ``young`` allocations (Python's default: 700) and
    next to no full ones.  A shapes-only step makes some 10^5 short-lived objects a rank and no
    reference cycles (tests/simulator/test_sparse_blocks.py), so collections find next to nothing,
    but at the default pace they took 3.4 s of a 16 s run of digits-cnn on 256 ranks, the full
    ones (which walk every rank's objects) growing with the world; paced, 0.6 s."""
    before = gc.get_threshold()
    gc.set_threshold(young, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def memory_figures(tracker):
    """A tracker's peaks in bytes: ``{"peak", "by_kind": {...}, "by_layer": {...}}``, or None."""
    if tracker is None:
        return None
    return {"peak": tracker.peak(), "by_kind": dict(tracker.peak_by_kind()), "by_layer": dict(tracker.peak_by_layer())}


def _zero():
    return dict.fromkeys(FIELDS, 0)


class Ledger:
    """One rank's account per leaf layer of ``model`` on ``clock``, a step at a time (:meth:`take`).

    It wraps each leaf layer's ``forward`` and ``backward`` (on the instance: the model's code is
    unchanged) and the clock's ``layer`` price, which ``Sequential`` charges after each pass."""

    def __init__(self, model, clock):
        self.clock, self.stats = clock, local.current().stats
        self.rows, self.spans, self._names, self.kinds = {}, [], {}, {}
        for name, layer in model.named_layers():
            self.rows[name], self.kinds[name] = _zero(), type(layer).__name__
            self._names[id(layer)] = name
            for direction in ("forward", "backward"):
                setattr(layer, direction, self._timed(name, direction, getattr(layer, direction)))
        priced = clock.layer

        def layer_priced(layer, x_size, y_size, direction):
            before = self.computed()
            priced(layer, x_size, y_size, direction)
            name = self._names.get(id(layer))
            if name is not None:
                self.rows[name]["compute"] += self.computed() - before
        clock.layer = layer_priced

    def computed(self):
        return sum(self.clock.compute.values())

    def _timed(self, name, direction, inner):
        def call(*args, **kwargs):
            t0, c0 = self.clock.t, self.computed()
            with self.stats.recording() as region:
                out = inner(*args, **kwargs)
            row, compute = self.rows[name], self.computed() - c0
            row["compute"] += compute
            row["exposed"] += self.clock.t - t0 - compute
            for figures in region.summary().values():
                row["bytes"] += figures["bytes"]
                row["calls"] += figures["calls"]
            self.spans.append((t0, self.clock.t, name, direction))
            return out
        return call

    def take(self, events):
        """This step's rows (then reset), with each call of ``events`` (the step's) hidden time
        given to the layer it started in."""
        rows, spans = self.rows, self.spans
        starts = [s[0] for s in spans]
        for e in events:
            at = bisect.bisect_right(starts, e["started"]) - 1
            name = spans[at][2] if at >= 0 and e["started"] <= spans[at][1] else None
            if name is not None:
                rows[name]["hidden"] += hidden_by_kind([e])["total"]["hidden"]
        self.rows = {name: _zero() for name in rows}
        self.spans = []
        return rows, spans


def inputs(spec, shape, backend):
    """One global batch ``(x, y)`` of ``shape``: seeded normal images, and class labels (targets of
    the head's width for a regression, ``"loss": "mse"``).  Shapes-only arrays for ``"shapes"``."""
    rng = numpy.random.default_rng(0)
    if spec.get("loss") == "mse":
        y = rng.standard_normal((shape[0], _head_width(spec)), dtype=numpy.float32)
    else:
        y = rng.integers(0, 10, shape[0])
    if backend == "shapes":
        xp = get_backend("shapes").xp
        return xp.empty(shape, dtype=numpy.float32), y
    return rng.standard_normal(shape, dtype=numpy.float32), y


def _head_width(spec):
    """The width (``out``) of the last linear layer of ``spec``."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "linear":
                found.append(node["out"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(spec.get("layers", []))
    return found[-1]


def run_steps(spec, ranks, shape, machine, steps, *, backend="numpy", overlap=True, traced=(), progress=None):
    """Per rank, per step: ``{"seconds", "compute", "exposed", "hidden", "bytes", "calls", "kinds",
    "layers"}`` (seconds on the logical clock; bytes and calls recorded; ``kinds``: per kind of call,
    :func:`refconv.overlap.hidden_by_kind`; ``layers``: the :class:`Ledger` rows), with
    ``"events"`` and ``"spans"`` (times from the run's start) on the ranks in ``traced``; and each
    rank's ``"memory"`` (:func:`memory_figures`, None when not measured) and ``"kinds"`` (each layer's
    class name); ``host_seconds``: a step's time on this machine (rank 0's: the world's, as ranks take
    turns).  ``progress(step)`` is
    called by rank 0 after each step."""
    x, y = inputs(spec, shape, backend)
    traced = set(traced)

    def body(comm):
        with memory_tracking(backend) as tracker:     # from the parameters' allocation on
            model = Model.from_spec(spec, comm=comm, backend=backend, dtype=numpy.float32, seed=0)
            if tracker is not None:
                tracker.name_layers(model)              # peaks by Model.named_layers' names
            model.set_overlap(overlap)
            optimizer, clock = SGD(model, 0.01, momentum=0.9), clock_mod.current()
            stats, ledger, out = local.current().stats, Ledger(model, clock), []
            wall = time.perf_counter()
            for i in range(steps):
                start, first, compute = clock.t, len(clock.events), ledger.computed()
                with stats.recording() as region:
                    step(model, optimizer, x, y)
                events = clock.events[first:]
                rows, spans = ledger.take(events)
                summary = region.summary().values()
                record = {"start": start, "seconds": clock.t - start, "compute": ledger.computed() - compute,
                          "hidden": hidden_by_kind(events)["total"]["hidden"], "kinds": hidden_by_kind(events),
                          "bytes": sum(f["bytes"] for f in summary), "calls": sum(f["calls"] for f in summary)}
                record["exposed"] = record["seconds"] - record["compute"]
                rows[OUTSIDE] = {k: record[k] - sum(r[k] for r in rows.values()) for k in FIELDS}
                record["layers"], record["host_seconds"] = rows, time.perf_counter() - wall
                wall = time.perf_counter()
                if comm.rank in traced:
                    record["events"], record["spans"] = [dict(e) for e in events], spans
                out.append(record)
                if progress is not None and comm.rank == 0:
                    progress(i + 1)
            memory = memory_figures(tracker)
        model.close()
        return {"steps": out, "memory": memory, "kinds": ledger.kinds}
    with few_collections():
        return [value for value, _ in simulated.run(body, ranks, machine=machine)]


class Progress:
    """``refconv simulate: step 2 of 5 on rank 0, 14 s`` on stderr, at most every ``every_s`` seconds
    (a quick run prints nothing)."""

    def __init__(self, steps, say, every_s=5.0):
        self.steps, self.say, self.every_s = steps, say, every_s
        self.started = self.last = time.monotonic()

    def __call__(self, done):
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self.say(f"refconv simulate: step {done} of {self.steps} done on rank 0, {now - self.started:.0f} s")
