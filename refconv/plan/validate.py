"""The performance model against measurement on this machine, side by side in one run.

    mpiexec -n 4 python -m mpi4py -m refconv.plan.validate --machine dev-cpu

1. Layers: for each of six layers (narrow and wide, 3x3 and 1x1, small and large
   images) and each strategy at 1, 2 and 4 ranks (sample, spatial, Stationary-X,
   -Y, -W and sample x channel), the measured time of one ``DistConv2d`` forward +
   backward (each round the slowest rank; median, min and max over rounds) next
   to the model's prediction for that rank count, split into compute and
   communication.  A world of 4 measures P = 1 and 2 on groups of P ranks running
   at once, so every rank is busy, as when the machine file was calibrated.
   Prints the median and worst relative error, and for each (layer, P) with more
   than one strategy whether the model's first choice is the measured fastest
   (the strict pick rate, the headline) and whether its min..max range overlaps
   the fastest's (the pick is within the noise of the best).
   For a model of volumes (``--model cosmoflow``) the layers are four of volumes
   instead (VOLUMES), each a ``DistConv3d`` on grids of five axes, and the
   strategies at 2 and 4 ranks add a depth split beside the height split.
2. A model: ``refconv plan``'s plan of a small wide CNN (batch 4, one sample per
   rank at 4 ranks: the strong-scaling regime) on all ranks against the same model
   purely sample-parallel, their training steps timed alternately.  ``--model``
   times another model's plan instead, on 8x8 images or, for a model of volumes
   (``--model cosmoflow``), 8x8x8 volumes.

``--table`` first times every local convolution the model prices above (each
layer's strategies and the wide CNN's planner search) on all ranks at once, as
``refconv calibrate --model`` does, into the machine's ``conv_table``, and reports
the model with the class fit only and with the table side by side (both priced
against the same measurements; the table's plan of the wide CNN is timed too if it
differs).  The table is measured on this machine in this run, like the layers it
is checked against: that is the paper's method (cuDNN timed per local shape), not
an independent test of it.

Times are CPU (numpy backend) figures of this machine; one BLAS thread per rank
(``refconv.threads.configure``) and a pause between contenders.
"""

import argparse
import dataclasses
import os
import statistics

import numpy
from mpi4py import MPI

from refconv import ProcessGrid, threads, train_config
from refconv.backend import get_backend
from refconv.grid import axes_of
from refconv.bench.common import time_ranks
from refconv.bench.timing import Span, ratio
from refconv.layers import DistConv2d, DistConv3d
from refconv.model import Model
from refconv.optim import SGD
from refconv.plan import calibrate, measure
from refconv.pricing import graph, machine as machine_mod, perf, search
from refconv.train import load_model_spec, step

# name: (N, C, F, S, K): batch, channels, filters, the side of the S x S images (S x S x S volumes in
# VOLUMES) and of the K x K (K x K x K) kernel, padded to keep the size
LAYERS = {
    "narrow 3x3": (8, 16, 16, 16, 3),
    "narrow 3x3 large": (8, 32, 32, 32, 3),   # a large image: halos are cheap beside the compute
    "narrow 1x1 large": (8, 32, 32, 32, 1),   # little compute per byte moved
    "expand 1x1": (8, 64, 256, 16, 1),        # a bottleneck's expansion: F = 4 C
    "wide 3x3": (8, 128, 128, 8, 3),
    "wide 1x1": (8, 256, 256, 8, 1),
}
VOLUMES = {  # the layers of a model of volumes (DistConv3d); a batch of 4, one sample per rank at 4
    "narrow 3x3x3": (4, 16, 16, 12, 3),
    "cosmo 4-16 3x3x3": (4, 4, 16, 16, 3),    # cosmoflow's first conv on 16^3: four input channels, a large volume
    "wide 3x3x3": (4, 64, 64, 6, 3),          # a small volume: depth and height split only 2 ways
    "wide 1x1x1": (4, 128, 128, 8, 1),        # little compute per byte moved
}
CASES = {2: LAYERS, 3: VOLUMES}  # spatial dims -> the layers measured (a model's dims choose: graph.dims_of)
CONVS = {2: DistConv2d, 3: DistConv3d}
PAUSE_S = 0.15  # between contenders: the other ranks' BLAS and MPI progress settle
SETTLE_S = 0.05  # untimed calls after the pause: caches and clock back to a busy core's
WINDOW_S = 0.02  # each sample: the layer back to back this long, as calibrate times kernels
MODEL = {  # wide enough that a weight-gradient allreduce costs as much as the layer's compute
    "name": "wide-cnn", "in_channels": 8,
    "layers": [
        {"type": "conv", "out": 256, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "conv", "out": 256, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "residual", "layers": [{"type": "conv", "out": 256, "kernel": 1, "bias": False},
                                        {"type": "batchnorm"}]},
        {"type": "relu"}, {"type": "gap"}, {"type": "linear", "out": 10},
    ],
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One (layer, P, strategy): the model's StageCost and the measured Span of seconds."""

    layer: str
    P: int
    label: str
    cost: perf.StageCost
    measured: Span

    @property
    def predicted(self):
        return self.cost.seconds

    @property
    def error(self):
        return (self.predicted - self.measured.median) / self.measured.median


@dataclasses.dataclass(frozen=True)
class Pick:
    """The model's first choice in one (layer, P) against the measured fastest."""

    layer: str
    P: int
    chosen: Row
    fastest: Row

    @property
    def strict(self):
        """The choice is the measured fastest (median)."""
        return self.chosen is self.fastest

    @property
    def within_noise(self):
        """The choice's min..max range overlaps the fastest's: the two are not told apart."""
        return self.chosen.measured.min <= self.fastest.measured.max


def strategies(P, dims=2):
    """(label, grid, algorithm, p_f) measured at P ranks, on grids of ``dims`` spatial dims
    (``axes_of``: a volume's grid has a depth axis, and its depth is split as well as its height)."""
    if P == 1:
        out = [("serial", {}, "stationary-x", None)]
    else:
        out = [("sample", {"sample": P}, "stationary-x", None)]
        out += [("depth", {"depth": P}, "stationary-x", None)] if dims == 3 else []
        out += [("height", {"height": P}, "stationary-x", None), ("X", {"channel": P}, "stationary-x", None),
                ("Y", {"channel": P}, "stationary-y", None)]
    if P == 4:
        out += [("W pf=2", {"channel": 4}, "stationary-w", 2),
                ("sample2 x X", {"sample": 2, "channel": 2}, "stationary-x", None)]
    axes = axes_of(dims + 2)
    return [(label, tuple(sizes.get(axis, 1) for axis in axes), algorithm, p_f)
            for label, sizes, algorithm, p_f in out]


def conv_layer(N, C, F, S, K, dims=2):
    """The graph.Layer of one of LAYERS (``dims=3``: of VOLUMES)."""
    spec = {"type": "conv", "out": F, "kernel": K, "padding": K // 2}
    return graph.Layer.of(spec, (N, C) + (S,) * dims)


def built_layer(sub, layer, grid_shape, algorithm, p_f):
    """(grid, a forward + backward callable) of one strategy of ``layer`` (a conv_layer) on the group ``sub``."""
    (N, C), F, K = layer.in_shape[:2], layer.spec["out"], layer.spec["kernel"]
    grid = ProcessGrid(sub, **dict(zip(axes_of(grid_shape), grid_shape)))
    conv = CONVS[len(grid_shape) - 2](C, F, K, padding=K // 2, grid=grid, algorithm=algorithm, filter_groups=p_f,
                                      backend="numpy", input_shape=layer.in_shape)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(conv.input_distribution.local_shape(grid.rank)).astype(numpy.float32)
    dy = rng.standard_normal(conv.output_distribution.local_shape(grid.rank)).astype(numpy.float32)

    def run():
        conv.forward(x)
        conv.backward(dy)

    run()  # warm-up
    return grid, run


def layer_rows(world, machine, repeats, layers=LAYERS, dims=2):
    """[Row] for P in 1, 2, 4 (as the world allows) of ``layers`` (LAYERS, or VOLUMES with ``dims=3``)."""
    rows = []
    for P in (1, 2, 4):
        if P > world.Get_size() or world.Get_size() % P:
            continue
        groups = ProcessGrid(world, sample=world.Get_size() // P, channel=P)
        sub = groups.channel_comm  # P consecutive ranks; world/P such groups measure at once
        for name, case in layers.items():
            layer = conv_layer(*case, dims=dims)
            chosen = [s for s in strategies(P, dims) if perf.feasible(layer, s[1])]
            built = {s[0]: built_layer(sub, layer, *s[1:]) for s in chosen}
            measured = time_ranks(world, {label: run for label, (_, run) in built.items()}, repeats, 0, PAUSE_S,
                                  window=WINDOW_S, settle=SETTLE_S)
            for label, grid_shape, algorithm, p_f in chosen:
                cost = perf.layer_cost(layer, grid_shape, machine, algorithm, p_f)
                rows.append(Row(name, P, label, cost, Span(tuple(measured[label]))))
            for grid, _ in built.values():
                grid.close()
        groups.close()
        groups.free()
    return rows


def reprice(rows, machine, layers=LAYERS, dims=2):
    """``rows`` with the same measurements, priced with ``machine``."""
    out = []
    for r in rows:
        _, grid_shape, algorithm, p_f = next(s for s in strategies(r.P, dims) if s[0] == r.label)
        cost = perf.layer_cost(conv_layer(*layers[r.layer], dims=dims), grid_shape, machine, algorithm, p_f)
        out.append(dataclasses.replace(r, cost=cost))
    return out


def model_input(spec, batch=4, image=8):
    """``(x, y)`` of one global batch for ``spec``: images ``(batch, C, image, image)``, or volumes
    ``(batch, C, image, image, image)`` for a model of volumes; class labels, or for a regression
    (``loss: mse``) targets ``(batch, K)``."""
    rng = numpy.random.default_rng(0)
    shape = (batch, spec.get("in_channels", 3)) + (image,) * graph.dims_of(spec)
    K = spec["layers"][-1]["out"]
    x = rng.standard_normal(shape).astype(numpy.float32)
    if spec.get("loss") == "mse":
        return x, rng.uniform(-1, 1, (batch, K)).astype(numpy.float32)
    return x, rng.integers(0, K, batch)


def priced_everywhere(machine, world_size, layers=LAYERS, spec=MODEL, dims=2):
    """The local conv shapes this validation prices: each layer's strategies at 1, 2 and 4
    ranks (those ``world_size`` measures), and the planner's whole search of the model (the
    wide CNN) on ``world_size`` ranks."""

    def price(m):
        for P in (1, 2, 4):
            if P > world_size or world_size % P:  # layer_rows measures no such P
                continue
            for case in layers.values():
                layer = conv_layer(*case, dims=dims)
                for _, grid_shape, algorithm, p_f in strategies(P, dims):
                    if perf.feasible(layer, grid_shape):
                        perf.layer_cost(layer, grid_shape, m, algorithm, p_f)

    return (calibrate.priced_shapes(machine, price)
            + calibrate.model_shapes(spec, model_input(spec)[0].shape, world_size, machine))


def with_table(world, machine, repeats, layers, say, spec=MODEL, dims=2):
    """``machine`` with a ``conv_table`` of every shape :func:`priced_everywhere` gives, timed
    here on all ranks at once (refconv calibrate's own timing)."""
    shapes = list(dict.fromkeys(priced_everywhere(machine, world.Get_size(), layers, spec, dims)))
    say(f"conv table: timing {len(shapes)} local shapes on all {world.Get_size()} ranks at once")
    entries = measure.measure_conv_table(world, get_backend("numpy"), shapes, repeats, say)
    table = {(op, machine_mod.ConvShape.of_list(e["shape"])): e[op] for e in entries for op in machine_mod.CONV_OPS}
    return dataclasses.replace(machine, conv_table=table)


def picks(rows):
    """[Pick] of every (layer, P) with more than one strategy measured, in the order of ``rows``."""
    cases = {}
    for r in rows:
        cases.setdefault((r.layer, r.P), []).append(r)
    return [Pick(layer, P, min(group, key=lambda r: r.predicted), min(group, key=lambda r: r.measured.median))
            for (layer, P), group in cases.items() if len(group) > 1]


def relative_to_sample(rows):
    """[(predicted / predicted sample) / (measured / measured sample)] of every row besides
    sample parallelism, in the (layer, P) cases that measured it (medians)."""
    sample = {(r.layer, r.P): r for r in rows if r.label == "sample"}
    return [(r.predicted / s.predicted) / (r.measured.median / s.measured.median)
            for r in rows if r.label != "sample" and (s := sample.get((r.layer, r.P)))]


def model_rows(world, machine, steps, tabled=None, spec=MODEL):
    """({name: (plan, sample-parallel prediction)}, {name | "sample": Span of seconds per step})
    of ``spec`` on :func:`model_input`'s batch.

    ``name`` is "planned" (priced with ``machine``) and with ``tabled`` (a machine with a
    table) also "planned (table)", which is timed only if it is another plan."""
    P, (x, y) = world.Get_size(), model_input(spec)
    predicted = {}
    for name, m in (("planned", machine), ("planned (table)", tabled)):
        if m is not None:
            planner, plan = search.plan_model(spec, x.shape, P, m)
            predicted[name] = plan, planner.sample_parallel()
    contenders = {"sample": dict(spec, defaults={"grid": {"sample": P}})}
    for name, (plan, _) in predicted.items():
        planned = search.to_spec(spec, plan)
        if planned not in contenders.values():
            contenders[name] = planned
    models = {k: Model.from_spec(s, comm=world, backend="numpy", seed=0) for k, s in contenders.items()}
    opts = {k: SGD(m, 0.01) for k, m in models.items()}
    runs = {k: (lambda m=m, k=k: step(m, opts[k], x, y)) for k, m in models.items()}
    measured = time_ranks(world, runs, steps, 1, PAUSE_S, settle=SETTLE_S)
    for m in models.values():
        m.close()
    return predicted, {k: Span(tuple(v)) for k, v in measured.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.plan.validate", description=__doc__.splitlines()[0])
    train_config.add_option(parser, "machine", default="dev-cpu")
    parser.add_argument("--repeats", type=int, default=7, help="measured rounds per layer contender")
    parser.add_argument("--steps", type=int, default=9, help="measured steps per model contender")
    train_config.add_option(parser, "threads")
    parser.add_argument("--quick", action="store_true", help="the first (narrow) layer once and one step: a smoke test")
    parser.add_argument("--table", action="store_true", help="first time every local conv shape priced here into "
                                                             "the machine's conv_table, and report the model with "
                                                             "and without it side by side")
    train_config.add_option(parser, "model", default=None, unset=f"{MODEL['name']}, a wide CNN",
                            purpose="the model whose plan is timed against sample parallelism (batch 4, 8x8 "
                                    "images or 8x8x8 volumes)")
    args = parser.parse_args(argv)
    spec = MODEL if args.model is None else load_model_spec(args.model)
    dims = graph.dims_of(spec)  # a model of volumes: its layers are checked on VOLUMES
    layers = dict(list(CASES[dims].items())[:1]) if args.quick else CASES[dims]
    if args.quick:
        args.repeats, args.steps = 1, 1
    world = MPI.COMM_WORLD
    machine = machine_mod.load(args.machine)
    choice = threads.configure(world, args.threads)
    say = print if world.Get_rank() == 0 else (lambda *a, **k: None)
    say(f"model vs measurement on {world.Get_size()} ranks, machine {machine.name} "
        f"({'measured ' + str(machine.measured) if machine.measured else 'not measured'}), numpy backend, float32; "
        f"{choice.describe()}; load average {os.getloadavg()[0]:.1f} at the start")
    tabled = with_table(world, machine, 2 if args.quick else 5, layers, say, spec, dims) if args.table else None
    rows = layer_rows(world, machine, args.repeats, layers, dims)
    priced = {"class fit": rows}
    if tabled is not None:
        priced["with table"] = reprice(rows, tabled, layers, dims)
    report_layers(say, priced)
    chosen = picks(rows)
    result = {"rows": rows, "picks": chosen, "errors": [abs(r.error) for r in rows]}
    if tabled is not None:
        result["table"] = {"rows": priced["with table"], "picks": picks(priced["with table"])}
    if world.Get_size() > 1:
        predicted, measured = model_rows(world, machine, args.steps, tabled=tabled, spec=spec)
        result.update(plan=predicted["planned"][0], sample=predicted["planned"][1], measured=measured,
                      predicted=predicted)
        say(f"model {spec.get('name', args.model)} on {world.Get_size()} ranks, input {model_input(spec)[0].shape}:")
        for name, (plan, sample) in predicted.items():
            say(f"  {name}: {sorted({search.strategy_label(r.cost.grid) for r in plan.rows})}"
                f"{'' if name in measured else ' (the class fit plan: not timed twice)'}; predicted "
                f"{plan.seconds * 1e3:.1f} ms, sample-parallel {sample.seconds * 1e3:.1f} ms "
                f"({sample.seconds / plan.seconds:.2f}x)")
        for name in [k for k in measured if k != "sample"]:
            say(f"  measured (median, min-max of {args.steps} steps): {name} {measured[name]}, sample-parallel "
                f"{measured['sample']}; sample / {name} {ratio(measured, 'sample', name).format(1, 'x', 2)} "
                f"per step pair")
    return result


def report_layers(say, priced):
    """The per-pair table (measured; per pricing: predicted, error, the model's pick ``<`` and
    the measured fastest ``*``), each pricing's misses, then the summaries side by side.
    ``priced``: {name: [Row]}, every list with the same measurements."""
    names = list(priced)
    first = priced[names[0]]
    marks = {name: {} for name in names}
    for name, rows in priced.items():
        for p in picks(rows):
            marks[name][p.chosen.label, p.layer, p.P] = marks[name].get((p.chosen.label, p.layer, p.P), "") + "<"
            marks[name][p.fastest.label, p.layer, p.P] = marks[name].get((p.fastest.label, p.layer, p.P), "") + "*"
    say(f"{'layer':16s} {'P':>2s} {'strategy':12s} {'measured ms (min-max)':24s} "
        + " ".join(f"| {name + ': compute comm predicted error':43s}" for name in names))
    for i, r in enumerate(first):
        cells = []
        for name in names:
            q = priced[name][i]
            compute = q.cost.fwd + q.cost.bwd
            cells.append(f"| {compute * 1e3:8.2f} {(q.predicted - compute) * 1e3:7.2f} {q.predicted * 1e3:9.2f} "
                         f"{q.error:+6.0%} {marks[name].get((r.label, r.layer, r.P), ''):8s}")
        say(f"{r.layer:16s} {r.P:2d} {r.label:12s} {r.measured.format(digits=2):24s} " + " ".join(cells))
    say("  (< the model's first choice, * the measured fastest by median)")
    for name, rows in priced.items():
        for p in picks(rows):
            if not p.strict:
                say(f"  {name}: {p.layer}, P={p.P}: model picks {p.chosen.label}, measured fastest "
                    f"{p.fastest.label}; the pick is {p.chosen.measured.median / p.fastest.measured.median:.2f}x "
                    f"slower ({'ranges overlap: within noise' if p.within_noise else 'ranges apart: a real miss'})")
    summary = {name: summarize(rows) for name, rows in priced.items()}
    say(f"{len(first)} (layer, strategy) pairs, {len(picks(first))} choices (layer, P): "
        + ", ".join(f"{name}" for name in names))
    for label in summary[names[0]]:
        say(f"  {label:88s} " + "".join(f"{summary[name][label]:>14s}" for name in names))


def summarize(rows):
    """{line label: figure} of one pricing of the measured rows; the strict pick rate is the headline."""
    errors = [abs(r.error) for r in rows]
    fastest = [abs(r.predicted - r.measured.min) / r.measured.min for r in rows]
    relative = relative_to_sample(rows)
    chosen = picks(rows)
    out = {"median relative error": f"{statistics.median(errors):.0%}", "worst relative error": f"{max(errors):.0%}",
           "against each pair's fastest round (a shared machine's load only adds time): median, worst":
               f"{statistics.median(fastest):.0%}, {max(fastest):.0%}"}
    if relative:
        out["each strategy over sample parallelism's, predicted/measured: median, in 0.8-1.25"] = \
            f"{statistics.median(relative):.2f}, {sum(0.8 <= v <= 1.25 for v in relative)}/{len(relative)}"
    out["pick rate, STRICT (the headline): the model's first choice is the measured fastest"] = \
        f"{sum(p.strict for p in chosen)}/{len(chosen)}"
    out["pick rate within noise (labelled apart): the first choice's min..max overlaps the fastest's"] = \
        f"{sum(p.within_noise for p in chosen)}/{len(chosen)}"
    return out


def run(argv=None):
    main(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
