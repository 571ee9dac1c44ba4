"""The performance model against measurement on this machine, side by side in one run.

    mpiexec -n 4 python -m mpi4py -m refconv.plan.validate --machine dev-cpu

1. Layers: for each layer (narrow and wide, 3x3 and 1x1) and each strategy at
   1, 2 and 4 ranks (sample, spatial, Stationary-X, -Y, -W and sample x channel),
   the measured time of one ``DistConv2d`` forward + backward (median of repeats,
   slowest rank) next to the model's prediction for that rank count.  A world of 4
   measures P = 1 and 2 on groups of P ranks running at once, so every rank is
   busy, as when the machine file was calibrated.  Prints the median and worst
   relative error, and the fraction of (layer, P) where the model's first choice
   is the measured fastest.
2. A model: ``refconv plan``'s plan of a small wide CNN (batch 4, one sample per
   rank at 4 ranks: the strong-scaling regime) on all ranks against the same model
   purely sample-parallel, their training steps timed alternately.

Times are CPU (numpy backend) figures of this machine; one BLAS thread per rank
(``OMP_NUM_THREADS=1``) and a pause between contenders (OpenBLAS threads spin
after a call).
"""

import argparse
import statistics

import numpy
from mpi4py import MPI

from refconv import ProcessGrid
from refconv.layers import DistConv2d
from refconv.model import Model
from refconv.optim import SGD
from refconv.plan import graph, machine as machine_mod, perf, search
from refconv.plan.calibrate import time_runs
from refconv.train import step

# name: (N, C, F, H, K)
LAYERS = {"narrow 3x3": (8, 16, 16, 16, 3), "wide 3x3": (8, 128, 128, 8, 3), "wide 1x1": (8, 256, 256, 8, 1)}
PAUSE_S = 0.2
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


def strategies(P):
    """(label, grid, algorithm, p_f) measured at P ranks."""
    if P == 1:
        return [("serial", (1, 1, 1, 1), "stationary-x", None)]
    out = [("sample", (P, 1, 1, 1), "stationary-x", None), ("height", (1, 1, P, 1), "stationary-x", None),
           ("X", (1, P, 1, 1), "stationary-x", None), ("Y", (1, P, 1, 1), "stationary-y", None)]
    if P == 4:
        out += [("W pf=2", (1, 4, 1, 1), "stationary-w", 2), ("sample2 x X", (2, 2, 1, 1), "stationary-x", None)]
    return out


def conv_layer(N, C, F, H, K):
    spec = {"type": "conv", "out": F, "kernel": K, "padding": K // 2}
    shape = (N, C, H, H)
    return graph.Layer("conv", spec, ("layer",), shape, graph._out_shape("conv", spec, shape, "layer"))


def built_layer(sub, dims, grid_shape, algorithm, p_f):
    """(grid, a forward + backward callable) of one strategy on the group ``sub``."""

    N, C, F, H, K = dims
    grid = ProcessGrid(sub, **dict(zip(perf.AXES, grid_shape)))
    layer = DistConv2d(C, F, K, padding=K // 2, grid=grid, algorithm=algorithm, filter_groups=p_f, backend="numpy",
                       input_shape=(N, C, H, H))
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(layer.input_distribution.local_shape(grid.rank)).astype(numpy.float32)
    dy = rng.standard_normal(layer.output_distribution.local_shape(grid.rank)).astype(numpy.float32)

    def run():
        layer.forward(x)
        layer.backward(dy)

    run()  # warm-up
    return grid, run


def layer_rows(world, machine, repeats, layers=LAYERS):
    """[(layer, P, label, predicted, measured)] for P in 1, 2, 4 (as the world allows)."""
    rows = []
    for P in (1, 2, 4):
        if P > world.Get_size() or world.Get_size() % P:
            continue
        groups = ProcessGrid(world, sample=world.Get_size() // P, channel=P)
        sub = groups.channel_comm  # P consecutive ranks; world/P such groups measure at once
        for name, dims in layers.items():
            layer = conv_layer(*dims)
            chosen = [s for s in strategies(P) if perf.feasible(layer, s[1])]
            built = [built_layer(sub, dims, grid_shape, algorithm, p_f) for _, grid_shape, algorithm, p_f in chosen]
            measured = time_runs(world, [run for _, run in built], repeats, PAUSE_S, WINDOW_S)
            for (label, grid_shape, algorithm, p_f), t in zip(chosen, measured):
                predicted = perf.layer_cost(layer, grid_shape, machine, algorithm, p_f).seconds
                rows.append((name, P, label, predicted, t))
            for grid, _ in built:
                grid.free()
        groups.free()
    return rows


def model_rows(world, machine, steps, batch=4, image=8):
    """Measured seconds per step of the planned model and of pure sample parallelism."""

    P = world.Get_size()
    planner, plan = search.plan_model(MODEL, (batch, 8, image, image), P, machine)
    sample = planner.uniform((P, 1, 1, 1), "stationary-x")
    contenders = {"planned": search.to_spec(MODEL, plan),
                  "sample": dict(MODEL, defaults={"grid": {"sample": P}})}
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, 8, image, image)).astype(numpy.float32)
    y = rng.integers(0, 10, batch)
    models = {k: Model.from_spec(s, comm=world, backend="numpy", seed=0) for k, s in contenders.items()}
    opts = {k: SGD(m, 0.01) for k, m in models.items()}
    runs = [lambda m=m, k=k: step(m, opts[k], x, y) for k, m in models.items()]
    for run in runs:
        run()  # warm-up
    measured = dict(zip(models, time_runs(world, runs, steps, PAUSE_S)))
    return plan, sample, measured


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.plan.validate", description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default="dev-cpu", help="a machine file or built-in name")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=9, help="measured steps per model contender")
    parser.add_argument("--quick", action="store_true", help="the narrow layer once and one step: a smoke test")
    args = parser.parse_args(argv)
    layers = {"narrow 3x3": LAYERS["narrow 3x3"]} if args.quick else LAYERS
    if args.quick:
        args.repeats, args.steps = 1, 1
    world = MPI.COMM_WORLD
    machine = machine_mod.load(args.machine)
    say = print if world.Get_rank() == 0 else (lambda *a, **k: None)
    say(f"model vs measurement on {world.Get_size()} ranks, machine {machine.name} "
        f"({'measured ' + str(machine.measured) if machine.measured else 'not measured'}), numpy backend, float32")
    rows = layer_rows(world, machine, args.repeats, layers)
    say(f"{'layer':12s} {'P':>2s} {'strategy':12s} {'predicted ms':>13s} {'measured ms':>12s} {'error':>7s}")
    errors = []
    for name, P, label, pred, meas in rows:
        errors.append(abs(pred - meas) / meas)
        say(f"{name:12s} {P:2d} {label:12s} {pred * 1e3:13.2f} {meas * 1e3:12.2f} {(pred - meas) / meas:+7.0%}")
    picks, near = [], []  # the pick is the measured fastest; it is within 10% of it
    for name in layers:
        for P in (2, 4):
            group = [r for r in rows if r[0] == name and r[1] == P]
            if len(group) > 1:
                chosen = min(group, key=lambda r: r[3])
                fastest = min(group, key=lambda r: r[4])
                picks.append(chosen is fastest)
                near.append(chosen[4] <= 1.1 * fastest[4])
                say(f"  {name}, P={P}: model picks {chosen[2]}, measured fastest {fastest[2]}"
                    + ("" if chosen is fastest else f" (the pick is {chosen[4] / fastest[4]:.2f}x slower)"))
    say(f"{len(rows)} (layer, strategy) pairs: median relative error {statistics.median(errors):.0%}, "
        f"worst {max(errors):.0%}; the model's first choice is the measured fastest on "
        f"{sum(picks)}/{len(picks)} (layer, P), within 10% of it on {sum(near)}/{len(near)}")
    result = {"rows": rows, "errors": errors, "picks": picks, "near": near}
    if world.Get_size() > 1:
        plan, sample, measured = model_rows(world, machine, args.steps)
        result.update(plan=plan, sample=sample, measured=measured)
        say(f"model {MODEL['name']} on {world.Get_size()} ranks, batch 4, 8x8: planned "
            f"{sorted({search.strategy_label(r.cost.grid) for r in plan.rows})}")
        say(f"  predicted: planned {plan.seconds * 1e3:.1f} ms, sample-parallel {sample.seconds * 1e3:.1f} ms "
            f"({sample.seconds / plan.seconds:.2f}x)")
        say(f"  measured:  planned {measured['planned'] * 1e3:.1f} ms, sample-parallel "
            f"{measured['sample'] * 1e3:.1f} ms ({measured['sample'] / measured['planned']:.2f}x)")
    return result


def run(argv=None):
    main(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
