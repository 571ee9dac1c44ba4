"""The paper's claims at its scale, predicted: ResNet-50 and its 2x and 4x wide variants on
4 to 1024 GPUs of the paper-class machine file (V100 + EDR, 16 GiB per GPU).

    python -m refconv.plan.project [--machine v100-edr] [--figures docs/figures]

For each model and GPU count it plans the model (``refconv plan``'s search, with the
16 GiB limit) and prices pure sample parallelism on the same machine:

- weak scaling: 32 samples per GPU;
- strong scaling: a global batch of 256, so that sample parallelism runs out of
  samples past 256 GPUs while the planner can still split channels and space.

It prints one table (step time and weight-gradient allreduce time of both, and the
ratios) and draws ``planning_weak.png`` and ``planning_strong.png``.  Every number is
a MODEL PREDICTION from datasheet figures, not a measurement.
"""

import argparse
import time

from refconv import train_config
from refconv.model_spec import load_spec
from refconv.pricing import machine as machine_mod, search
from refconv.pricing.search import NoFeasiblePlan

MODELS = ("resnet50", "resnet50-wide2", "resnet50-wide4")
GPUS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
PER_GPU, GLOBAL_BATCH, IMAGE, MEMORY_GIB = 32, 256, 224, 16


def project(model, P, batch, machine, memory_gib=MEMORY_GIB):
    """A dict of predicted seconds for the plan and for pure sample parallelism (None where
    it cannot run: fewer samples than GPUs, or over the memory limit)."""
    limit = memory_gib * 2**30
    spec = load_spec(model)
    try:
        planner, plan = search.plan_model(spec, (batch, 3, IMAGE, IMAGE), P, machine, limit)
    except NoFeasiblePlan:
        return {"model": model, "P": P, "batch": batch, "plan": None, "sample": None}
    sample = planner.uniform((P, 1, 1, 1), "stationary-x") if P <= batch else None
    if sample is not None and sample.memory > limit:
        sample = None
    row = {"model": model, "P": P, "batch": batch, "plan": plan.seconds, "plan_grad": plan.grad_seconds,
           "plan_overlapped": plan.overlapped_seconds, "plan_strategies": _strategies(plan),
           "sample": None}
    if sample is not None:
        row.update(sample=sample.seconds, sample_grad=sample.grad_seconds,
                   sample_overlapped=sample.overlapped_seconds)
    return row


def _strategies(plan):
    """How many stages ran with a channel split, a spatial split, samples only."""
    convs = [r.cost.grid for r in plan.rows if r.kind == "conv"]
    return (sum(g[1] > 1 for g in convs), sum(g[2] * g[3] > 1 for g in convs), len(convs))


def _fmt(seconds):
    return "—" if seconds is None else f"{seconds * 1e3:.1f}"


def table(rows):
    lines = [f"{'model':15s} {'GPUs':>5s} {'batch':>6s} {'sample ms':>10s} {'planned ms':>11s} {'speedup':>8s} "
             f"{'sample AR ms':>13s} {'planned AR ms':>14s} {'AR ratio':>9s} {'convs ch/sp/all':>16s}"]
    for r in rows:
        s, p = r["sample"], r["plan"]
        speed = f"{s / p:.2f}x" if s and p else "—"
        ar = f"{r['sample_grad'] / r['plan_grad']:.1f}x" if s and p and r["plan_grad"] > 0 else "—"
        mix = "/".join(map(str, r["plan_strategies"])) if p else "—"
        lines.append(f"{r['model']:15s} {r['P']:5d} {r['batch']:6d} {_fmt(s):>10s} {_fmt(p):>11s} {speed:>8s} "
                     f"{_fmt(r.get('sample_grad')):>13s} {_fmt(r.get('plan_grad')):>14s} {ar:>9s} {mix:>16s}")
    return "\n".join(lines)


def plot(rows, title, path, machine_name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, model in enumerate(MODELS):
        mine = [r for r in rows if r["model"] == model]
        color = f"C{i}"
        for ax, key in ((a, ""), (b, "_grad")):
            pts = [(r["P"], r["sample" + key]) for r in mine if r["sample"] is not None]
            if pts:
                ax.plot(*zip(*pts), "--o", color=color, ms=3, label=f"{model} sample-parallel")
            pts = [(r["P"], r["plan" + key]) for r in mine if r["plan"] is not None]
            ax.plot(*zip(*pts), "-s", color=color, ms=3, label=f"{model} planned")
    for ax, what in ((a, "step time"), (b, "weight-gradient allreduce per step")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel(f"predicted {what} (s)")
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=7)
    fig.suptitle(f"{title} — MODEL PREDICTIONS (machine file {machine_name}), not measurements", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.plan.project", description=__doc__.splitlines()[0])
    train_config.add_option(parser, "machine", default="v100-edr")
    parser.add_argument("--figures", default="docs/figures", help="where to write the two PNGs ('' for none)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--gpus", nargs="+", type=int, default=list(GPUS))
    args = parser.parse_args(argv)
    machine = machine_mod.load(args.machine)
    started = time.perf_counter()
    for title, batch_of in (("weak scaling, 32 samples per GPU", lambda P: PER_GPU * P),
                            (f"strong scaling, global batch {GLOBAL_BATCH}", lambda P: GLOBAL_BATCH)):
        rows = [project(m, P, batch_of(P), machine) for m in args.models for P in args.gpus]
        print(f"{title} (predicted; AR = weight-gradient allreduce; convs ch/sp/all: convs the plan splits "
              f"by channel / by space / in all)")
        print(table(rows))
        print()
        if args.figures:
            plot(rows, title, f"{args.figures}/planning_{'weak' if 'weak' in title else 'strong'}.png", machine.name)
    print(f"(planned in {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
