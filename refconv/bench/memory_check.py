"""``python -m refconv.bench.memory_check``: each preset's memory peak per rank, measured on simulated ranks
with shapes-only arrays under the planner's own per-layer strategy, beside ``refconv plan``'s figure.

::

    python -m refconv.bench.memory_check --ranks 64 [--batch 64] [--image-size 32] [--models resnet50 ...]

Per preset: the plan (``plan_model``, machine v100-edr) is built on ``--ranks`` simulated ranks with
backend "shapes" (:mod:`refconv.shapes`), the parameters made under kind "weights", SGD with momentum 0.9,
and two training steps run (the first binds the model).  Each rank tracks its live bytes
(:mod:`refconv.shapes.memory`); the table prints the largest rank's peak, the planner's ``Plan.memory``
(Σ per stage ``StageCost.memory`` plus the largest ``workspace``), their ratio, and both split the
planner's way: kept (activations and parameters) against Σ memory, and the rest (communication and
workspace) against the largest workspace.  Sizes are float32, as the planner counts them.

``--stages`` adds, per preset, the same comparison stage by stage: each of the planner's rows (a stage:
a conv or pooling with the batch norms and activations that follow it on its grid; a residual block's
sum with what follows it) beside the bytes its layers kept at their peak on that rank.
"""

import argparse
import sys

import numpy

from refconv import simulated
from refconv.model import Model
from refconv.model_spec import PRESETS
from refconv.optim import SGD
from refconv.pricing import graph
from refconv.pricing import machine as machine_mod
from refconv.pricing.search import plan_model, to_spec
from refconv.shapes import memory
from refconv.shapes.array import ShapeArray
from refconv.train import load_model_spec, step

KEPT = ("activations", "parameters")


def planned(model, ranks, batch, image_size, machine="v100-edr"):
    """``(planned spec, plan, input shape)``: the planner's own choice per layer."""
    spec = load_model_spec(model)
    shape = (batch, spec["in_channels"]) + (image_size,) * spec.get("dims", 2)
    _, plan = plan_model(spec, shape, ranks, machine_mod.load(machine))
    return to_spec(spec, plan), plan, shape


def _labels(spec, batch):
    """Labels of the loss's shape: class indices, or MSE targets (the last layer's outputs)."""
    if spec.get("loss") == "mse":
        return numpy.zeros((batch, spec["layers"][-1]["out"]), numpy.float32)
    return numpy.zeros(batch, numpy.int64)


def measure(spec, ranks, shape, steps=2):
    """Per rank ``{"peak", "at_peak", "by_kind", "by_layer"}`` (bytes) over ``steps`` shapes-only steps."""
    x = ShapeArray(shape, numpy.float32)            # made before tracking: the global batch is no rank's
    y = _labels(spec, shape[0])

    def body(comm):
        with memory.tracking() as tracker:
            with memory.kind("weights"):
                model = Model.from_spec(spec, comm=comm, backend="shapes", dtype=numpy.float32, seed=0)
            tracker.name_layers(model)
            optimizer = SGD(model.bind(shape), 0.01, momentum=0.9)
            for _ in range(steps):
                step(model, optimizer, x, y)
            model.close()
            return {"peak": tracker.peak(), "at_peak": dict(tracker.at_peak), "by_kind": tracker.peak_by_kind(),
                    "by_layer": tracker.peak_by_layer()}
    return simulated.run(body, ranks)


def layer_name(path):
    """The model's name of the layer at spec ``path``: ``("layers", 4, "layers", 0)`` is ``"4.body.0"``."""
    return ".".join("body" if p == "layers" else str(p) for p in path[1:])


def stage_layers(spec, shape):
    """``[(plan row name, [model layer names])]`` in the plan's order: a stage's layers, and a residual
    block's followers under its ``.sum`` row (the sum itself keeps nothing of its own)."""
    out = []

    def walk(elements):
        for e in elements:
            if isinstance(e, graph.Stage):
                out.append((e.name, [layer_name(layer.path) for layer in e.layers]))
            else:
                walk(e.body)
                walk(e.shortcut)
                out.append((e.name, [layer_name(layer.path) for layer in e.followers]))
    walk(graph.bind(spec, shape))
    return out


def by_stage(spec, shape, plan, by_layer):
    """Per plan row ``{"name", "kind", "planned", "measured"}``: the planner's kept bytes (``StageCost.memory``)
    beside the sum of its layers' kept peaks (``by_layer``); a layer no row claims raises ValueError."""
    left = dict(by_layer)
    rows = {row.name: row for row in plan.rows}
    out = [{"name": name, "kind": rows[name].kind, "planned": rows[name].cost.memory,
            "measured": sum(left.pop(layer, 0) for layer in layers)} for name, layers in stage_layers(spec, shape)]
    if any(left.values()):
        raise ValueError(f"by_layer: layers kept bytes that no stage of the plan holds: {sorted(left)}")
    return out


def compare(model, ranks, batch, image_size):
    """``{"model", "measured", "least", "planned", "ratio", "kept", "planned_kept", "rest", "planned_rest",
    "by_kind", "stages"}``: the rank with the largest peak against ``Plan.memory`` (``least``: the smallest
    rank's peak), and its kept bytes stage by stage (:func:`by_stage`)."""
    spec, plan, shape = planned(model, ranks, batch, image_size)
    per_rank = measure(spec, ranks, shape)
    top = max(per_rank, key=lambda r: r["peak"])
    planned_kept = sum(r.cost.memory for r in plan.rows)
    return {"model": model, "measured": top["peak"], "least": min(r["peak"] for r in per_rank),
            "planned": plan.memory, "ratio": top["peak"] / plan.memory,
            "kept": sum(top["at_peak"][k] for k in KEPT), "planned_kept": planned_kept,
            "rest": sum(v for k, v in top["at_peak"].items() if k not in KEPT),
            "planned_rest": plan.memory - planned_kept, "by_kind": top["by_kind"],
            "stages": by_stage(spec, shape, plan, top["by_layer"])}


def worst(stages):
    """The stage whose measured kept bytes are furthest from the planner's (by ratio), or None."""
    scored = [s for s in stages if s["planned"] or s["measured"]]
    return max(scored, key=lambda s: abs(ratio(s) - 1), default=None)


def ratio(stage):
    return stage["measured"] / stage["planned"] if stage["planned"] else float("inf")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refconv.bench.memory_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=64, help="simulated ranks (default 64)")
    p.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    p.add_argument("--image-size", type=int, default=32, help="height and width, depth too for volumes (default 32)")
    p.add_argument("--models", nargs="*", default=list(PRESETS), help="presets (default: all)")
    p.add_argument("--stages", action="store_true", help="and each preset's kept bytes stage by stage")
    args = p.parse_args(argv)
    unknown = sorted(set(args.models) - set(PRESETS))
    if unknown:
        p.error(f"--models: unknown {unknown}; expected some of {sorted(PRESETS)}")
    mib = 2 ** 20
    print(f"{args.ranks} simulated ranks, batch {args.batch}, image {args.image_size}, shapes-only, plan on v100-edr;"
          " MiB, the largest rank's peak (least: the smallest rank's); worst stage: the stage whose kept bytes are"
          " furthest from the planner's")
    print(f"{'model':16s} {'measured':>9s} {'least':>9s} {'planned':>9s} {'ratio':>6s}   {'kept':>8s} {'planned':>8s}"
          f"   {'comm+ws':>8s} {'planned':>8s}   worst stage (of n): ratio")
    for model in args.models:
        r = compare(model, args.ranks, args.batch, args.image_size)
        w = worst(r["stages"])
        print(f"{model:16s} {r['measured'] / mib:9.2f} {r['least'] / mib:9.2f} {r['planned'] / mib:9.2f} "
              f"{r['ratio']:6.3f}   {r['kept'] / mib:8.2f} {r['planned_kept'] / mib:8.2f}   {r['rest'] / mib:8.2f} "
              f"{r['planned_rest'] / mib:8.2f}   {w['name'] if w else '-'} (of {len(r['stages'])}): "
              f"{ratio(w) if w else float('nan'):.3f}", flush=True)
        if args.stages:
            print(f"  {'stage':14s} {'kind':9s} {'planned':>9s} {'measured':>9s} {'ratio':>6s}")
            for st in r["stages"]:
                print(f"  {st['name']:14s} {st['kind']:9s} {st['planned'] / mib:9.3f} {st['measured'] / mib:9.3f} "
                      f"{ratio(st):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
