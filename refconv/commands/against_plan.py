"""``python -m refconv.commands.against_plan``: a plan's training step on simulated ranks, on the
logical clock, beside what ``refconv plan`` predicts for the same grid and machine file.

::

    python -m refconv.commands.against_plan --model digits-cnn --ranks 4 --grid sample=2,channel=2 \\
        --batch 32 --image-size 32 --machine v100-edr [--timeline overlap.png]

It plans the model on ``--grid`` for every layer (``Planner.uniform``; without ``--grid`` the
planner's own choice, as ``refconv plan --out`` writes it), builds the planned model on
``--ranks`` simulated ranks priced by ``--machine`` (:mod:`refconv.simulated.clock`), and times a
training step blocking (as ``--no-overlap`` trains) and one overlapped, each after a step that
binds the model.  It prints the busiest rank's step time beside the planner's, and per call kind
the communication the overlapped step hid and exposed, with what the planner predicts overlap
hides (its blocking step less its overlapped one).  So what overlap hides on 64 ranks of a
cluster can be seen, and checked against the planner, on a laptop.
"""

import argparse
import sys

import numpy

from refconv import simulated, train_config
from refconv.grid import axes_of
from refconv.model import Model
from refconv.overlap import draw_timeline, hidden_by_kind
from refconv.optim import SGD
from refconv.pricing import machine as machine_mod
from refconv.pricing.search import Planner, plan_model, to_spec
from refconv.simulated import clock as clock_mod
from refconv.train import load_model_spec, step

STEPS = ("blocking", "overlap")
DESCRIPTION = ("A plan's training step on simulated ranks, timed on the logical clock of a machine file, beside what "
               "refconv plan predicts for the same grid and machine: the step blocking and overlapped, and what "
               "overlap hid per kind of call.")


def planned(model, ranks, batch, image_size, machine, grid=None):
    """``(spec, plan, input_shape)``: the model planned on ``grid`` (a tuple of axis sizes) for every
    layer, or as the planner chooses when ``grid`` is None."""
    spec = load_model_spec(model)
    shape = (batch, spec["in_channels"]) + (image_size,) * spec.get("dims", 2)
    if grid is None:
        _, plan = plan_model(spec, shape, ranks, machine)
    else:
        plan = Planner(spec, shape, ranks, machine).uniform(tuple(grid))
        if plan is None:
            raise ValueError(f"grid: {spec.get('name', 'the model')} cannot run every layer on {tuple(grid)}")
    return to_spec(spec, plan), plan, shape


def clocked_steps(spec, ranks, shape, machine):
    """Per rank, ``{"blocking" | "overlap": {"seconds", "calls"}}``: one training step of each, after
    a step that binds the model, with its calls' times (seconds from the step's start)."""
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=numpy.float32)
    y = rng.integers(0, 10, shape[0])

    def body(comm):
        model = Model.from_spec(spec, comm=comm, backend="numpy", dtype=numpy.float32, seed=0)
        optimizer, clock, out = SGD(model, 0.01, momentum=0.9), clock_mod.current(), {}
        for name in STEPS:
            model.set_overlap(name == "overlap")
            step(model, optimizer, x, y)
            start, first = clock.t, len(clock.events)
            step(model, optimizer, x, y)
            out[name] = {"seconds": clock.t - start,
                         "calls": [{**e, **{k: e[k] - start for k in ("started", "waited", "ended")}}
                                   for e in clock.events[first:]]}
        return out
    return [value for value, _ in simulated.run(body, ranks, machine=machine)]


def compare(model, ranks, batch, image_size, machine, grid=None):
    """The clocked steps and the planner's figures: ``{"plan": {...}, "clock": {...}, "ranks": [...]}``,
    seconds; ``hidden`` is what overlap takes off the blocking step."""
    machine = machine if isinstance(machine, machine_mod.Machine) else machine_mod.load(machine)
    spec, plan, shape = planned(model, ranks, batch, image_size, machine, grid)
    steps = clocked_steps(spec, ranks, shape, machine)
    busiest = {name: max(r[name]["seconds"] for r in steps) for name in STEPS}
    calls = hidden_by_kind([c for r in steps for c in r["overlap"]["calls"]])
    return {"plan": {"blocking": plan.seconds, "overlap": plan.overlapped_seconds,
                     "hidden": plan.seconds - plan.overlapped_seconds},
            "clock": {**busiest, "hidden": busiest["blocking"] - busiest["overlap"], "calls": calls},
            "ranks": steps}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refconv.commands.against_plan", description=DESCRIPTION)
    train_config.add_option(p, "model")
    p.add_argument("--ranks", type=int, required=True, help="simulated ranks")
    train_config.add_option(p, "grid", purpose="every layer's grid", unset="the planner's choice of grid per layer")
    p.add_argument("--batch", type=int, default=32, help="global batch size (default 32)")
    p.add_argument("--image-size", type=int, default=32, help="height and width (depth too for volumes; default 32)")
    train_config.add_option(p, "machine", default=machine_mod.DEFAULT_MACHINE, unset=None)
    p.add_argument("--timeline", default=None, metavar="PNG", help="draw both steps' calls per rank into this PNG")
    args = p.parse_args(argv)
    grid = None if args.grid is None else _grid_tuple(args.grid, args.model)
    out = compare(args.model, args.ranks, args.batch, args.image_size, args.machine, grid)
    plan, clock = out["plan"], out["clock"]
    grid = "as planned" if grid is None else "x".join(map(str, grid)) + f" ({' x '.join(axes_of(len(grid)))})"
    print(f"{args.model} on {args.ranks} simulated ranks, grid {grid}, machine {args.machine}, batch {args.batch}")
    print(f"{'':10s} {'plan ms':>9s} {'clock ms':>9s} {'clock/plan':>10s}")
    for name in ("blocking", "overlap", "hidden"):
        ratio = clock[name] / plan[name] if plan[name] else float("nan")
        print(f"{name:10s} {plan[name] * 1e3:9.3f} {clock[name] * 1e3:9.3f} {ratio:10.2f}")
    print("overlapped step, every rank's calls summed: kind, calls, in flight, exposed (waited), hidden (ms)")
    for kind, k in clock["calls"].items():
        print(f"  {kind:15s} {k['calls']:5d} {k['in_flight'] * 1e3:9.3f} {k['waited'] * 1e3:9.3f} {k['hidden'] * 1e3:9.3f}")
    if args.timeline:
        draw_timeline(out["ranks"], f"{args.model}, {args.ranks} simulated ranks on {args.machine}", args.timeline)
        print(f"wrote {args.timeline}")
    return 0


def _grid_tuple(sizes, model):
    """``--grid``'s {axis: size} as the tuple of the model's grid axes (four, five for volumes)."""
    axes = axes_of(load_model_spec(model).get("dims", 2) + 2)
    return tuple(sizes.get(axis, 1) for axis in axes)


if __name__ == "__main__":
    sys.exit(main())
