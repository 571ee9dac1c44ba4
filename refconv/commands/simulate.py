"""``refconv simulate``: a plan's training steps on simulated ranks, priced on a machine file's
logical clock, beside what ``refconv plan`` predicts for the same plan.

::

    refconv simulate --model resnet50 --ranks 16 --batch 32 --image-size 32 --machine v100-edr \\
        --steps 3 [--grid sample=4,channel=4 | --plan] [--compare] [--trace run.json]

The model is a preset or a planned model file (``refconv plan --out``).  It runs on ``--grid``
for every layer, or on the plan's own per-layer strategy (``--plan``, the default: a planned
file's own, or the planner's for a preset), on ``--ranks`` simulated ranks in this one process
(:mod:`refconv.simulated`), each rank's compute and calls priced by ``--machine``
(:mod:`refconv.simulated.clock`).  It trains ``--steps`` steps and prints

- per step, the busiest rank's time beside the planner's: the first step, which binds the model
  (the grids, splits and shuffles are made), apart from the later ones;
- per layer, over the later steps, per rank and step (mean over ranks): compute, communication
  exposed and hidden, the bytes its calls carry, and its memory peak
  (:mod:`refconv.commands.simulate_steps`);
- the memory per rank: the planner's figure, and the measured peak by kind with the shapes-only
  backend (with ``--backend numpy`` memory is not measured, and it says so).

``--compare`` runs sample parallelism the same way beside the plan.  ``--trace run.json`` writes
the timeline of a few ranks (``--trace-ranks``; at 1024 ranks every rank would be a million
events) as a Chrome trace that Perfetto opens, with a track of every rank's mean per layer, and
draws the same ranks' calls beside it (``run.png``); each file is whole or absent.

Bad input ends with one line and status 2 before anything runs: more ranks than the simulator's
cap (``refconv.simulated.MAX_RANKS``), a grid that does not multiply to the ranks, a planned file
made for another rank count, and (once planned) a plan whose memory per rank exceeds
``--memory-per-rank``.
"""

import os
import sys

from mpi4py import MPI

from refconv import checks, simulated, train_config
from refconv.commands import simulate_steps
from refconv.commands.simulate_steps import OUTSIDE, Progress, run_steps
from refconv.grid import axes_of
from refconv.overlap import draw_timeline, write_chrome_trace
from refconv.pricing import machine as machine_mod
from refconv.pricing.search import Planner, plan_model, to_spec
from refconv.train import load_model_spec

HELP = "run a plan's training steps on simulated ranks, priced on a machine file's logical clock"
DESCRIPTION = ("Train a model a few steps on simulated ranks in this process, on --grid for every layer or the plan's "
               "own per-layer strategy, each rank's compute and calls priced by a machine file, and print per step the "
               "time beside refconv plan's prediction and per layer compute, communication exposed and hidden, bytes "
               "and memory. See docs/simulate.md.")
MiB = 2**20
DEFAULTS = {"batch": 32, "image_size": 32}   # a preset's; a planned file's are those it was planned for


def add_arguments(p):
    train_config.add_option(p, "model", default=None, unset=None, required=True)
    p.add_argument("--ranks", type=int, required=True, help=f"simulated ranks (at most {simulated.MAX_RANKS})")
    how = p.add_mutually_exclusive_group()
    train_config.add_option(how, "grid", purpose="every layer's grid", unset="the plan's own per-layer strategy")
    how.add_argument("--plan", action="store_true", help="the plan's own per-layer strategy (the default): a planned "
                                                         "file's, or the planner's for a preset")
    train_config.add_option(p, "machine", default=machine_mod.DEFAULT_MACHINE, unset=None)
    p.add_argument("--steps", type=int, default=3, help="training steps, the first binding the model (default 3)")
    p.add_argument("--batch", type=int, default=None, help="global batch size (default: a planned file's, else 32)")
    p.add_argument("--image-size", type=int, default=None,
                   help="height and width (depth too for volumes; default: a planned file's, else 32)")
    train_config.add_option(p, "backend", default="shapes", choices=BACKENDS,
                            purpose="shapes (arrays of shapes and no values, memory measured) or numpy (real "
                                    "values, small sizes)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="wait for every call at once, as refconv train --no-overlap (default: overlap)")
    p.add_argument("--compare", action="store_true", help="also run sample parallelism the same way, beside the plan")
    p.add_argument("--memory-per-rank", type=float, default=None, metavar="GiB",
                   help="refuse a plan whose memory per rank (refconv plan's figure) exceeds this")
    p.add_argument("--trace", default=None, metavar="JSON", help="write a Chrome trace (Perfetto) here, and a PNG "
                                                                 "of the same ranks' calls beside it")
    p.add_argument("--trace-ranks", default=None, metavar="R,R,...",
                   help="the ranks in the trace (default: the first, second, middle and last)")
    return p


BACKENDS = ("shapes", "numpy")


def check(args):
    """The options alone, before anything runs (``cli.main``): a ValueError is one line, status 2."""
    if MPI.COMM_WORLD.Get_size() > 1:
        raise ValueError("refconv simulate runs its ranks in one process: run it without mpiexec")
    if not 1 <= args.ranks <= simulated.MAX_RANKS:
        raise ValueError(f"--ranks: expected 1 to {simulated.MAX_RANKS} simulated ranks "
                         f"(refconv.simulated.MAX_RANKS), got {args.ranks}")
    for name in ("steps", "batch", "image_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive int, got {v}")
    if args.memory_per_rank is not None and not args.memory_per_rank > 0:
        raise ValueError(f"--memory-per-rank: expected a positive number of GiB, got {args.memory_per_rank}")
    if args.grid is not None:
        product = 1
        for size in args.grid.values():
            product *= size
        if product != args.ranks:
            text = ",".join(f"{a}={s}" for a, s in args.grid.items())
            raise ValueError(f"--grid: {text} multiplies to {product} ranks, not --ranks {args.ranks}")
    spec = load_model_spec(args.model)
    planned = spec.get("plan") if isinstance(spec, dict) else None
    if planned and planned.get("ranks") != args.ranks:
        raise ValueError(f"--model: {args.model} was planned for {planned.get('ranks')} ranks, not --ranks "
                         f"{args.ranks} (plan it again: refconv plan --ranks {args.ranks} --out ...)")
    if args.trace is not None:
        if not args.trace.endswith(".json"):
            raise ValueError(f"--trace: expected a .json path (the .png is drawn beside it), got {args.trace!r}")
        checks.output_file(args.trace, "--trace")
    args.traced = trace_ranks(args.trace_ranks, args.ranks)


def trace_ranks(text, ranks):
    """``--trace-ranks``: the ranks named, or the first, second, middle and last."""
    if text is None:
        return sorted({0, min(1, ranks - 1), ranks // 2, ranks - 1})
    try:
        chosen = sorted({int(r) for r in text.split(",")})
    except ValueError:
        raise ValueError(f"--trace-ranks: expected comma-separated rank numbers, got {text!r}") from None
    if chosen[0] < 0 or chosen[-1] >= ranks:
        raise ValueError(f"--trace-ranks: expected ranks 0 to {ranks - 1}, got {text!r}")
    return chosen


def planned(args, machine):
    """``(label, {name: (spec, plan)}, shape)``: the model's spec for the run and the planner's Plan
    of it, the plan's and (``--compare``) sample parallelism's."""
    spec = load_model_spec(args.model)
    file_plan = spec.pop("plan", None)
    spec.pop("train", None)
    batch = args.batch or (file_plan or {}).get("batch") or DEFAULTS["batch"]
    size = args.image_size or (file_plan or {}).get("image_size") or DEFAULTS["image_size"]
    shape = (batch, spec["in_channels"]) + (size,) * spec.get("dims", 2)
    limit = args.memory_per_rank * 2**30 if args.memory_per_rank else None
    if args.grid is not None:
        axes = axes_of(spec.get("dims", 2) + 2)
        grid = tuple(args.grid.get(axis, 1) for axis in axes)
        planner = Planner(spec, shape, args.ranks, machine)
        plan = planner.uniform(grid)
        if plan is None:
            raise ValueError(f"--grid: {spec.get('name', 'the model')} cannot run every layer on "
                             f"{'x'.join(map(str, grid))} ({' x '.join(axes)})")
        label = f"grid {'x'.join(map(str, grid))} ({' x '.join(axes)}) for every layer"
    elif file_plan is not None:
        planner = Planner(spec, shape, args.ranks, machine)
        plan, label = planner.of_spec(spec), f"the planned file's own per-layer strategy"
    else:
        planner, plan = plan_model(spec, shape, args.ranks, machine, limit)
        label = "the planner's per-layer strategy"
    if limit is not None and plan.memory > limit:
        raise ValueError(f"--memory-per-rank: the plan needs {plan.memory / 2**30:.2f} GiB per rank (refconv plan's "
                         f"figure), above {args.memory_per_rank:g} GiB")
    runs = {"plan": (spec if file_plan is not None and args.grid is None else to_spec(spec, plan), plan)}
    if args.compare:
        sample = planner.sample_parallel()
        runs["sample"] = None if sample is None else (to_spec(spec, sample), sample)
    return label, runs, shape


def execute(args, say=None):
    """``(label, runs, shape, machine, results)``: the plan (and ``--compare``'s sample parallelism)
    and each one's :func:`run_steps` per rank (None where sample parallelism cannot run)."""
    if not hasattr(args, "traced"):   # called without cli.main (a script)
        check(args)
    machine = machine_mod.load(args.machine)
    label, runs, shape = planned(args, machine)
    results = {}
    for name, entry in runs.items():
        if entry is not None:
            results[name] = run_steps(entry[0], args.ranks, shape, machine, args.steps, backend=args.backend,
                                      overlap=args.overlap, traced=args.traced if name == "plan" else (),
                                      progress=Progress(args.steps, say) if say else None)
    return label, runs, shape, machine, results


def run(args):
    label, runs, shape, machine, results = execute(args, lambda text: print(text, file=sys.stderr, flush=True))
    print(f"{args.model} on {args.ranks} simulated ranks, {label}, machine {machine.name}, input {shape}, "
          f"backend {args.backend}, {args.steps} steps{'' if args.overlap else ', no overlap'}")
    for line in report(results["plan"], runs["plan"][1], args.overlap, args.backend):
        print(line)
    if args.compare:
        for line in comparison(results, runs, args, shape):
            print(line)
    if args.trace:
        for line in write_trace(args.trace, results["plan"], args.traced,
                                f"{args.model}, {args.ranks} simulated ranks on {machine.name}"):
            print(line)
    return 0


def later(steps):
    """The steps after the binding one (the binding one alone when it is the only one)."""
    return steps[1:] or steps[:1]


def busiest(ranks, i):
    return max(r["steps"][i]["seconds"] for r in ranks)


def predicted(plan, overlap):
    return plan.overlapped_seconds if overlap else plan.seconds


def report(ranks, plan, overlap, backend):
    """The lines of the step table, the layer table and the memory per rank."""
    n = len(ranks[0]["steps"])
    ahead = predicted(plan, overlap)
    out = [f"step: the busiest rank's time on the clock, beside refconv plan's {'overlapped ' if overlap else ''}step",
           f"  {'step':22s} {'clock ms':>10s} {'plan ms':>10s} {'clock/plan':>10s}   simulating it here"]
    for i in range(n):
        name = "1 (binds the model)" if i == 0 else str(i + 1)
        out.append(f"  {name:22s} {busiest(ranks, i) * 1e3:10.3f} {ahead * 1e3:10.3f} {busiest(ranks, i) / ahead:10.2f}"
                   f"   {ranks[0]['steps'][i]['host_seconds']:.2f} s")
    if n > 2:
        mean = sum(busiest(ranks, i) for i in range(1, n)) / (n - 1)
        out.append(f"  {f'2-{n} (mean)':22s} {mean * 1e3:10.3f} {ahead * 1e3:10.3f} {mean / ahead:10.2f}")
    out += layer_lines(ranks)
    out += memory_lines(ranks, plan, backend)
    return out


def layer_lines(ranks):
    """Per layer, over the later steps, per rank and step (mean over ranks): ms of compute, exposed
    and hidden communication, MiB its calls carry, and the peak memory (MiB, the largest rank's)."""
    steps = [s for r in ranks for s in later(r["steps"])]
    names = list(steps[0]["layers"])
    peaks = [r["memory"] for r in ranks]
    n = len(ranks[0]["steps"])
    which = "step 1" if n == 1 else "step 2" if n == 2 else f"steps 2-{n}"
    kinds = ranks[0]["kinds"]
    width = max(len(n) for n in names + ["total"])
    kind_width = max([len(k) for k in kinds.values()] + [4])
    out = [f"per layer, {which}, per rank and step (mean over ranks): compute, communication exposed and hidden, "
           f"bytes its calls carry, memory peak (largest rank)",
           f"  {'layer':{width}s} {'kind':{kind_width}s} {'compute ms':>11s} {'exposed ms':>11s} {'hidden ms':>10s} "
           f"{'calls':>6s} "
           f"{'MiB':>9s} {'peak MiB':>9s}"]
    for name in names + ["total"]:
        rows = [s["layers"][name] if name != "total" else s for s in steps]
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("compute", "exposed", "hidden", "bytes", "calls")}
        if name == "total":
            peak = max(p["peak"] for p in peaks) if peaks[0] else None
        else:
            peak = max(p["by_layer"].get(name, 0) for p in peaks) if peaks[0] and name != OUTSIDE else None
        out.append(f"  {name:{width}s} {kinds.get(name, ''):{kind_width}s} {mean['compute'] * 1e3:11.3f} "
                   f"{max(mean['exposed'], 0.0) * 1e3:11.3f} "
                   f"{mean['hidden'] * 1e3:10.3f} {mean['calls']:6.1f} {mean['bytes'] / MiB:9.3f} "
                   f"{'-' if peak is None else f'{peak / MiB:.1f}':>9s}")
    return out


def memory_lines(ranks, plan, backend):
    memory = [r["memory"] for r in ranks]
    out = [f"memory per rank: refconv plan's figure {plan.memory / MiB:.1f} MiB"]
    if memory[0] is None:
        return out + [f"memory: not tracked with backend {backend}"]
    top = max(range(len(memory)), key=lambda r: memory[r]["peak"])
    kinds = ", ".join(f"{k} {v / MiB:.1f}" for k, v in memory[top]["by_kind"].items())
    out.append(f"memory measured: peak {memory[top]['peak'] / MiB:.1f} MiB on rank {top} ({kinds} MiB), "
               f"{memory[top]['peak'] / plan.memory:.2f}x the planner's")
    return out


def comparison(results, runs, args, shape):
    """Sample parallelism beside the plan: later steps' time, its prediction, the speedup, memory."""
    out = ["compare: sample parallelism beside the plan (later steps, busiest rank)"]
    if runs["sample"] is None:
        return out + [f"  sample parallelism: cannot run ({args.ranks} ranks, batch {shape[0]})"]
    first, k = (1 if args.steps > 1 else 0), len(later(results["sample"][0]["steps"]))
    sample_s = sum(busiest(results["sample"], first + i) for i in range(k)) / k
    plan_s = sum(busiest(results["plan"], first + i) for i in range(k)) / k
    for name, seconds, plan in (("sample", sample_s, runs["sample"][1]), ("plan", plan_s, runs["plan"][1])):
        peak = results[name][0]["memory"]
        peak = "not tracked" if peak is None else f"{max(r['memory']['peak'] for r in results[name]) / MiB:.1f} MiB"
        out.append(f"  {name:7s} clock {seconds * 1e3:10.3f} ms, plan {predicted(plan, args.overlap) * 1e3:10.3f} ms, "
                   f"memory planned {plan.memory / MiB:.1f} MiB, measured {peak}")
    out.append(f"  speedup of the plan over sample parallelism: clock {sample_s / plan_s:.2f}x, plan "
               f"{predicted(runs['sample'][1], args.overlap) / predicted(runs['plan'][1], args.overlap):.2f}x")
    return out


def write_trace(path, ranks, traced, title):
    """The Chrome trace and the PNG of the traced ranks' calls.  The trace has, per traced rank, a track
    of its layers' passes and as many tracks of its calls as it had calls in flight at once; and one
    track of every rank's mean time per layer in the later steps."""
    tracks = {}
    for r in traced:
        steps = ranks[r]["steps"]
        tracks[f"rank {r}"] = [{"name": name, "start": t0, "end": t1, "args": {"pass": direction, "step": i + 1}}
                               for i, s in enumerate(steps) for t0, t1, name, direction in s["spans"]]
        calls = [{"name": e["kind"], "start": e["started"], "end": e["ended"],
                  "args": {"overlap": e["overlap"], "waited_from": e["waited"], "step": i + 1}}
                 for i, s in enumerate(steps) for e in s["events"]]
        for lane, spans in enumerate(lanes(calls)):
            tracks[f"rank {r} calls" + (f" ({lane + 1})" if lane else "")] = spans
    steps = [s for r in ranks for s in later(r["steps"])]
    t, mean = 0.0, []
    for name in steps[0]["layers"]:
        seconds = sum(s["layers"][name]["compute"] + s["layers"][name]["exposed"] for s in steps) / len(steps)
        mean.append({"name": name, "start": t, "end": t + seconds, "args": {"ranks": len(ranks)}})
        t += seconds
    tracks[f"all {len(ranks)} ranks: mean per layer"] = mean
    write_chrome_trace(path, tracks, title)
    figure = os.path.splitext(path)[0] + ".png"
    rows = [{f"step {i + 1}": {"seconds": s["seconds"], "calls": _from(s)}
             for i, s in enumerate(ranks[r]["steps"])} for r in traced]
    tmp = os.path.join(os.path.dirname(os.path.abspath(figure)), f".{os.getpid()}.{os.path.basename(figure)}")
    try:
        draw_timeline(rows, title, tmp, labels=[f"rank {r}" for r in traced])
        os.replace(tmp, figure)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return [f"wrote {path} (ranks {', '.join(map(str, traced))}) and {figure}"]


def lanes(spans):
    """``spans`` in as few lists as keep each list's spans apart (calls in flight together overlap,
    and a trace's track shows only nested spans), each list in order of start."""
    out, ends = [], []
    for span in sorted(spans, key=lambda e: e["start"]):
        lane = next((i for i, end in enumerate(ends) if end <= span["start"]), len(out))
        if lane == len(out):
            out.append([])
            ends.append(0.0)
        out[lane].append(span)
        ends[lane] = span["end"]
    return out


def _from(step):
    """A step's calls with times from the step's start."""
    return [{**e, **{k: e[k] - step["start"] for k in ("started", "waited", "ended")}} for e in step["events"]]
