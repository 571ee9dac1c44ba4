"""``refconv bench rank_step``: where a simulated rank's CPU time goes in one training step (issue 39).

    python -m refconv.bench rank_step --model resnet50 --ranks 16 --batch 32 --image-size 224 [--grid ...]

The model runs on ``--ranks`` simulated ranks with shapes-only arrays, priced on ``--machine``'s
logical clock, on the plan ``refconv simulate`` runs (the planner's per-layer strategy, or
``--grid`` for every layer), with the memory tracker on as there.  Building the model and binding it
(``Model.bind``: grids, layouts, sub-communicators, shuffle plans) are timed apart, per rank, and
printed last with their sum over ranks (the issue's budget: 60 s in all at 1024 ranks; ``--bind-only`` runs
no step and prints only that).  The first step
is not measured; the second (forward, backward, optimizer) is, per rank thread, in CPU seconds
(``time.thread_time``), split by :mod:`refconv.bench.thread_cpu`'s wrappers into

    backend       ShapesBackend methods (its own and NumPy's it inherits), ShapeArray operations
                  (the memory tracker's work inside them), the shapes namespace's functions
    collectives   refconv.collectives' functions, its Request and gradient buckets, the simulator
                  underneath excluded
    simulator     refconv.simulated: the communicator's calls (posting, matching, waiting, turn
                  passing, delivery: the ShapeArray operations it makes are its own) and requests;
                  "of which pricing": the logical clock's prices
    bookkeeping   the rest: layers, distributions, checks, the optimizer's loop

Each row is the mean over ranks in ms per rank-step, with the most any rank spent and the share of
the total, beside the budgets: must 469 ms (256 ranks in 120 s), goal 117 ms (256 ranks in 30 s).  The
wrappers' own cost (calls counted, times a calibrated cost per call) stays in the figures and is
printed below them, with the total less it.  ``--profile N`` instead profiles the measured step of
every rank thread with cProfile on its CPU clock (no wrappers) and prints the N functions of most self time per
rank-step: the next step of speed.  It prints, never asserts.
"""

import argparse
import cProfile
import pstats
import statistics
import time

import numpy

from refconv import collectives, simulated, train_config
from refconv.bench import thread_cpu
from refconv.collectives import buckets, requests
from refconv.commands import simulate
from refconv.commands.simulate_steps import few_collections, inputs, memory_tracking
from refconv.model import Model
from refconv.optim import SGD
from refconv.pricing import machine as machine_mod
from refconv.shapes import dispatch
from refconv.shapes.array import ShapeArray
from refconv.shapes.backend import ShapesBackend
from refconv.shapes.namespace import xp
from refconv.simulated import clock as clock_mod
from refconv.simulated import comm as comm_mod
from refconv.train import step

CATEGORIES = ("backend", "collectives", "simulator", "bookkeeping")
PRICING = "pricing"                      # the clock's part of the simulator
BOTTOM = ("simulator", PRICING)          # what the simulator calls (ShapeArray copies of delivery) is its own
MUST_S, GOAL_S = 120.0 / 256, 30.0 / 256  # per rank-step: 256 ranks in 120 s, in 30 s
BIND_S = 60.0                            # building and binding the model at 1024 ranks, in all
XP_FUNCTIONS = ["empty", "zeros", "ones", "full", "asarray", "array", "count_nonzero"]


def targets():
    """What :func:`refconv.bench.thread_cpu.wrapped` wraps, by category (the module's doc)."""
    functions = [n for n in collectives.__all__ if callable(getattr(collectives, n))
                 and not isinstance(getattr(collectives, n), type) and n != "stats"]
    return {
        "backend": [(ShapesBackend, None), (ShapeArray, None),
                    (xp, XP_FUNCTIONS + [f.__name__ for f in dispatch.FUNCTIONS])],
        "collectives": [(collectives, functions), (requests.Request, None), (buckets.Buckets, None),
                        (buckets.Slot, None), (buckets, ["plan", "bucket_calls"])],
        "simulator": [(comm_mod.Comm, None), (comm_mod.Request, None)],
        PRICING: [(clock_mod.Clock, None)],
    }


def measure(spec, ranks, shape, machine, overlap=True, profile=False, bind_only=False):
    """Each rank's account of its second step (:func:`refconv.bench.thread_cpu.stop`), or with
    ``profile`` its ``cProfile.Profile`` of that step (nothing wrapped), or with ``bind_only`` None (no
    step runs), and ``{"wall_run", "cpu_run", "build", "bind"}``: the whole run's wall and process CPU
    seconds, and each rank's CPU seconds building and binding the model."""
    x, y = inputs(spec, shape, "shapes")

    def body(comm):
        with memory_tracking("shapes") as tracker:
            start = time.thread_time()
            model = Model.from_spec(spec, comm=comm, backend="shapes", dtype=numpy.float32, seed=0)
            built = time.thread_time()
            model.bind(x.shape)                         # grids, layouts, sub-communicators, shuffle plans
            binding = (built - start, time.thread_time() - built)
            if bind_only:
                model.close()
                return None, binding
            tracker.name_layers(model)
            model.set_overlap(overlap)
            optimizer = SGD(model, 0.01, momentum=0.9)
            step(model, optimizer, x, y)                # the first step: not measured
            if profile:
                profiler = cProfile.Profile(time.thread_time)   # CPU: not the turns waited for
                profiler.runcall(step, model, optimizer, x, y)
                model.close()
                return profiler, binding
            thread_cpu.start(bottom=BOTTOM)
            step(model, optimizer, x, y)
            account = thread_cpu.stop()
            model.close()
            return account, binding

    with thread_cpu.wrapped({} if profile else targets()), few_collections():
        wall, cpu = time.perf_counter(), time.process_time()
        results = [value for value, _ in simulated.run(body, ranks, machine=machine)]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return [r for r, _ in results], {"wall_run": wall, "cpu_run": cpu, "build": [b[0] for _, b in results],
                                     "bind": [b[1] for _, b in results]}


def binding_line(extra, ranks):
    """Building and binding the model, per rank and in all (the issue's budget: 60 s in all at 1024 ranks)."""
    build, bind = extra["build"], extra["bind"]
    total = sum(build) + sum(bind)
    return (f"building and binding the model (CPU per rank, mean and max; before the first step): build "
            f"{statistics.fmean(build) * 1e3:.1f} ms ({max(build) * 1e3:.1f}), bind {statistics.fmean(bind) * 1e3:.1f} "
            f"ms ({max(bind) * 1e3:.1f}); all {ranks} ranks: {total:.1f} s CPU"
            + (f", {total / BIND_S:.2f} of the 60-s budget at 1024 ranks" if ranks == 1024 else ""))


def rows(results):
    """``{row: (mean s, max s)}`` over ranks for each category, pricing, the total and calls."""
    def figure(get):
        values = [get(r) for r in results]
        return statistics.fmean(values), max(values)
    out = {c: figure(lambda r, c=c: r["seconds"].get(c, 0.0)) for c in CATEGORIES if c != "simulator"}
    out["simulator"] = figure(lambda r: r["seconds"].get("simulator", 0.0) + r["seconds"].get(PRICING, 0.0))
    out[PRICING] = figure(lambda r: r["seconds"].get(PRICING, 0.0))
    out["total"] = figure(lambda r: r["total"])
    out["calls"] = figure(lambda r: r["calls"])
    return out


def table(results, ranks, per_call, extra):
    """The printed lines (module doc)."""
    f = rows(results)
    total = f["total"][0]
    lines = [f"CPU per rank-step (ms), {ranks} ranks, the second step (the first binds), mean and max over ranks",
             f"{'':<26} {'mean':>9} {'max':>9} {'share':>7}"]
    for name in CATEGORIES:
        mean, top = f[name]
        lines.append(f"{name:<26} {mean * 1e3:>9.2f} {top * 1e3:>9.2f} {mean / total:>7.1%}")
        if name == "simulator":
            mean, top = f[PRICING]
            lines.append(f"{'  of which pricing':<26} {mean * 1e3:>9.2f} {top * 1e3:>9.2f} {mean / total:>7.1%}")
    lines.append(f"{'total':<26} {total * 1e3:>9.2f} {f['total'][1] * 1e3:>9.2f} {1:>7.1%}")
    for label, budget in (("must", MUST_S), ("goal", GOAL_S)):
        lines.append(f"{label + ' budget':<26} {budget * 1e3:>9.2f} {'':>9} {'':>7}   mean total / budget: "
                     f"{total / budget:.2f}")
    calls = f["calls"][0]
    lines.append(f"wrapped calls per rank-step: {calls:.0f} mean; their cost at {per_call * 1e6:.2f} us each: "
                 f"{calls * per_call * 1e3:.2f} ms (in the figures above)")
    bare = total - calls * per_call
    lines.append(f"total less the wrappers' cost: {bare * 1e3:.2f} ms, must {bare / MUST_S:.2f}, goal {bare / GOAL_S:.2f}")
    busiest = max(range(len(results)), key=lambda r: results[r]["total"])
    lines.append(f"the busiest rank: {busiest}, " + ", ".join(f"{c} {results[busiest]['seconds'].get(c, 0.0) * 1e3:.1f}"
                                                          for c in (*CATEGORIES, PRICING)) + " ms")
    lines.append(f"the run (binding, both steps, threads): {extra['wall_run']:.1f} s wall, {extra['cpu_run']:.1f} s "
                 f"CPU; the measured step on all ranks: {total * ranks:.2f} s CPU")
    lines.append(binding_line(extra, ranks))
    return lines


def add_arguments(p):
    train_config.add_option(p, "model", default="resnet50", unset=None)
    p.add_argument("--ranks", type=int, default=16, help="simulated ranks (default 16)")
    p.add_argument("--batch", type=int, default=32, help="global batch size (default 32)")
    p.add_argument("--image-size", type=int, default=224, help="height and width (default 224)")
    train_config.add_option(p, "grid", purpose="every layer's grid", unset="the planner's per-layer strategy")
    train_config.add_option(p, "machine", default=machine_mod.DEFAULT_MACHINE, unset=None)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="instead of the categories, the N functions of most self time (cProfile of every rank)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false", help="wait for every call at once")
    p.add_argument("--bind-only", action="store_true", help="only build and bind the model (no step): binding's line")
    return p


def planned(model, ranks, batch, image_size, grid=None, machine=machine_mod.DEFAULT_MACHINE):
    """``(label, spec, shape, machine)``: the plan ``refconv simulate`` would run (its checks first:
    bad input is a ValueError naming the option)."""
    sim = argparse.Namespace(model=model, ranks=ranks, batch=batch, image_size=image_size, grid=grid,
                             machine=machine, memory_per_rank=None, compare=False, trace=None, trace_ranks=None,
                             steps=2)
    simulate.check(sim)
    machine = machine_mod.load(machine)
    label, runs, shape = simulate.planned(sim, machine)
    return label, runs["plan"][0], shape, machine


def run(args, out=print):
    """Plan as ``refconv simulate`` does, measure, print; bad input raises ValueError (one line, status 2)."""
    label, spec, shape, machine = planned(args.model, args.ranks, args.batch, args.image_size, args.grid,
                                          args.machine)
    if args.profile < 0:
        raise ValueError(f"--profile: expected a count of functions >= 0, got {args.profile}")
    per_call = thread_cpu.overhead()
    results, extra = measure(spec, args.ranks, shape, machine, args.overlap, profile=args.profile > 0,
                             bind_only=args.bind_only)
    out(f"{args.model} on {args.ranks} simulated ranks, {label}, machine {machine.name}, input {shape}, shapes-only")
    if args.bind_only:
        out(f"the run (building and binding, threads): {extra['wall_run']:.1f} s wall, {extra['cpu_run']:.1f} s CPU")
        out(binding_line(extra, args.ranks))
        return 0
    for line in (profiled(results, args.profile) + [binding_line(extra, args.ranks)] if args.profile
                 else table(results, args.ranks, per_call, extra)):
        out(line)
    return 0


def profiled(profiles, n):
    """The ``n`` functions of most self time over every rank's profile, per rank-step (mean over ranks)."""
    stats = pstats.Stats(profiles[0])
    for p in profiles[1:]:
        stats.add(p)
    ranks = len(profiles)
    total = sum(tt for _, _, tt, _, _ in stats.stats.values())
    top = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:n]
    lines = [f"cProfile of the second step on every rank: {total / ranks * 1e3:.1f} ms per rank-step (profiled); "
             f"the {n} functions of most self time", f"{'self ms':>9} {'share':>7} {'calls':>9}  function"]
    for (path, line, name), (_, calls, tt, _, _) in top:
        lines.append(f"{tt / ranks * 1e3:>9.2f} {tt / total:>7.1%} {calls / ranks:>9.0f}  {name} ({_short(path)}:{line})")
    return lines


def _short(path):
    """``refconv/simulated/world.py`` for a file of the package, the path as it is otherwise."""
    return path[path.rindex("refconv/"):] if "refconv/" in path else path
