"""Write docs/paper-scale.md: the paper's strong-scaling experiments run through ``refconv simulate``.

Each configuration (a model, a rank count, a machine file) runs ``refconv simulate --plan --compare``
(the planner's per-layer strategy beside sample parallelism), through the command's own functions
(:func:`refconv.commands.simulate.execute`), and the page tabulates per configuration the step
time on the logical clock and the planner's, the allreduce time, the speedup of the plan over
sample parallelism, the memory per rank, and the calls and bytes measured; then one figure
(``docs/figures/paper_scale.png``): the speedup and the memory per rank against the ranks, for
sample parallelism and for the plan.

::

    .venv/bin/python scripts/paper_scale.py --quick     # the reduced sizes (the page in the tree)
    .venv/bin/python scripts/paper_scale.py             # the paper's sizes (make paper): needs the
                                                        # shapes-only backend (refconv.shapes)
    .venv/bin/python scripts/paper_scale.py --quick --models resnet50 --ranks 2 --machines v100-edr \\
        --out /tmp/page                                 # one configuration (the CI test)

The page says which sizes ran.  Both files are written whole (a temporary file, then renamed), after
every configuration, so a long run shows what has ended; configurations still to run are marked so.
With ``--rows FILE`` (``make paper`` passes ``paper-scale.rows.jsonl``) each configuration's row is
appended to FILE as it ends, and a run reuses the rows already there: a stopped run goes on where it
stopped.  The configurations run from the fewest ranks to the most, so a partial page covers every model.
Two processes on two cores may share the work: each with its own ``--machines`` and its own first
``--rows`` file; ``--rows A B --no-run`` then writes the page of both without running anything.
"""

import argparse
import json
import os
import subprocess
import sys

from refconv import cli, simulated
from refconv.commands import simulate, simulate_steps

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 2**20

# (models, rank counts, batch, image size): the paper's sizes (issue 39), and the reduced ones
FULL = [(("resnet50", "resnet50-wide2", "resnet50-wide4"), (16, 64, 256, 1024), 512, 224),
        (("cosmoflow",), (64, 128, 256, 512), 64, 128)]
QUICK = [(("resnet50",), (2, 4), 8, 32),
         (("cosmoflow",), (2, 4), 4, 16)]
MACHINES = ("v100-edr", "h200-node")
PAPER = [  # the paper's claims (Dryden et al., SC '19), as docs/algorithms.md section 7 gives them
    "training time for residual networks reduced by up to 4.1x at scale;",
    "allreduce overhead reduced 4x by the segmented allreduce;",
    "better ImageNet accuracy from wider models that the channel and filter decomposition made trainable.",
]


def configurations(sizes, models=None, ranks=None, machines=MACHINES):
    for names, counts, batch, image in sizes:
        for model in names:
            if models and model not in models:
                continue
            for machine in machines:
                for k in counts:
                    if not ranks or k in ranks:
                        yield model, k, batch, image, machine


def measure(model, ranks, batch, image, machine, backend, steps):
    """One configuration's row: a dict of figures, or ``{"error": why}`` where it cannot run."""
    if ranks > simulated.MAX_RANKS:
        return {"error": f"more than the simulator's {simulated.MAX_RANKS} ranks"}
    argv = ["simulate", "--model", model, "--ranks", str(ranks), "--batch", str(batch), "--image-size", str(image),
            "--machine", machine, "--backend", backend, "--steps", str(steps), "--plan", "--compare"]
    args = cli.build_parser().parse_args(argv)
    try:
        _, runs, _, _, results = simulate.execute(args)
    except ValueError as exc:          # the planner cannot plan it, or it does not fit
        return {"error": " ".join(str(exc).split())}
    return {name: figures(results[name], runs[name][1]) if name in results else None for name in runs}


def figures(ranks, plan):
    """The later steps' figures: busiest rank's step, mean allreduce in flight and exposed per rank,
    calls and bytes per rank, memory (planner's figure; measured peak or None)."""
    later = [simulate.later(r["steps"]) for r in ranks]
    n = len(later[0])
    first = len(ranks[0]["steps"]) - n
    allreduce = [s["kinds"].get("allreduce", {"in_flight": 0.0, "waited": 0.0}) for steps in later for s in steps]
    measured = [r["memory"]["peak"] for r in ranks if r["memory"] is not None]
    return {"step": sum(simulate.busiest(ranks, first + i) for i in range(n)) / n,
            "predicted": plan.overlapped_seconds,
            "allreduce": sum(a["in_flight"] for a in allreduce) / len(allreduce),
            "allreduce_exposed": sum(a["waited"] for a in allreduce) / len(allreduce),
            "calls": sum(s["calls"] for steps in later for s in steps) / len(allreduce),
            "bytes": sum(s["bytes"] for steps in later for s in steps) / len(allreduce),
            "memory_planned": plan.memory, "memory_measured": max(measured) if measured else None}


def ms(seconds):
    return f"{seconds * 1e3:.3f}"


def commit():
    """The repository's commit, with ``+changes`` where its tracked files differ from it."""
    def git(*cmd):
        return subprocess.run(["git", "-C", ROOT, *cmd], capture_output=True, text=True, check=False)
    head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else "")


def load_rows(path):
    """The rows an earlier run kept in ``path`` (JSON lines), by configuration; {} without the file."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {tuple(row["config"]): row for row in map(json.loads, filter(str.strip, f))}


def table(rows):
    out = ["| model | ranks | machine | strategy | step ms (clock) | step ms (plan) | allreduce ms in flight "
           "(exposed) | speedup over sample (clock, plan) | memory per rank MiB (planned; measured) "
           "| calls per rank-step | MiB sent per rank-step |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (model, k, batch, image, machine), row in rows:
        head = f"| {model} | {k} | {machine} "
        if row is None:
            out.append(head + "| not run yet | | | | | | | |")
            continue
        if "error" in row:
            out.append(head + f"| cannot run: {row['error']} | | | | | | | |")
            continue
        for name in ("sample", "plan"):
            f = row.get(name)
            if f is None:
                out.append(head + f"| {name} | cannot run: more ranks than samples ({batch}) | | | | | | |")
                continue
            speedup = "1.00x (baseline)"
            if name == "plan" and row.get("sample"):
                s = row["sample"]
                speedup = f"{s['step'] / f['step']:.2f}x, {s['predicted'] / f['predicted']:.2f}x"
            elif name == "plan":
                speedup = "no sample baseline"
            measured = "not measured" if f["memory_measured"] is None else f"{f['memory_measured'] / MiB:.1f}"
            out.append(head + f"| {name} | {ms(f['step'])} | {ms(f['predicted'])} | {ms(f['allreduce'])} "
                       f"({ms(f['allreduce_exposed'])}) | {speedup} | {f['memory_planned'] / MiB:.1f}; {measured} "
                       f"| {f['calls']:.0f} | {f['bytes'] / MiB:.2f} |")
    return out


def draw(rows, path):
    """Speedup (over sample parallelism at each model's smallest rank count) and memory per rank
    against ranks, sample parallelism dashed and the plan solid, a colour per model and a marker per
    machine."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    series = {}
    for (model, k, _, _, machine), row in rows:
        for name in ("sample", "plan"):
            if row is not None and "error" not in row and row.get(name):
                series.setdefault((model, machine, name), []).append((k, row[name]))
    models = sorted({model for model, _, _ in series})
    machines = sorted({machine for _, machine, _ in series})
    for (model, machine, name), points in series.items():
        base = series.get((model, machine, "sample"), points)[0][1]["step"]
        look = dict(linestyle="--" if name == "sample" else "-", color=f"C{models.index(model) % 10}",
                    marker="os^v"[machines.index(machine) % 4], label=f"{model} {machine} {name}")
        left.plot([k for k, _ in points], [base / f["step"] for _, f in points], **look)
        right.plot([k for k, _ in points], [(f["memory_measured"] or f["memory_planned"]) / MiB for _, f in points],
                   **look)
    for ax, what in ((left, "speedup over sample parallelism at the fewest ranks"), (right, "memory per rank, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_title(what, fontsize="medium")
    right.set_yscale("log")
    left.legend(fontsize="x-small")
    fig.tight_layout()
    tmp = os.path.join(os.path.dirname(path), f".{os.getpid()}.{os.path.basename(path)}")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def page(rows, sizes_label, backend, figure, commits):
    measured_memory = backend == "shapes"
    waiting = sum(row is None for _, row in rows)
    return "\n".join([
        "# The paper's scale, through refconv's own code",
        "",
        "<!-- generated by scripts/paper_scale.py: edit the script, not this page -->",
        "",
        "Dryden et al. (SC '19) trained residual networks on hundreds of GPUs with channel and filter",
        "parallelism. This page runs their strong-scaling experiments through `refconv simulate`: every",
        "layer, collective and optimizer step that `refconv train` runs, on simulated ranks in one process,",
        "with the planner's per-layer strategy (`--plan`) beside sample parallelism (`--compare`).",
        "",
        "## What ran",
        "",
        f"{sizes_label}. Backend `{backend}`; two training steps each, the second reported (the first binds "
        f"the model). Measured at commit {', '.join(sorted(commits)) or '(none yet)'}."
        + (f" **{waiting} of {len(rows)} configurations have not run yet** (marked so below)." if waiting else ""),
        "",
        "To make it: `make paper` (the paper's sizes, hours of one core: each configuration's row goes to",
        "`paper-scale.rows.jsonl` as it ends and the page is rewritten, so a stopped run goes on where it",
        "stopped), or `python scripts/paper_scale.py --quick` (reduced sizes with real values, a minute);",
        "`scripts/paper_scale.py`'s docstring says how two processes share the work.",
        "",
        "## The paper's claims (the paper's, not measured here)",
        "",
        "The paper reports, on a cluster whose nodes had four 16 GB V100 GPUs each:",
        "",
        *[f"- *The paper:* {claim}" for claim in PAPER],
        "",
        "## Measured and priced",
        "",
        "- **Measured**, by running the code: the calls each rank makes and the bytes they carry"
        + (", and each rank's memory peak (shapes-only arrays)." if measured_memory else
           ". Memory was not measured here: the backend computes real values and tracks no bytes, so the "
           "memory column shows the planner's figure only."),
        "- **Priced**, from a machine file (`v100-edr`, the paper's kind of machine; `h200-node`): every time,",
        "  on each rank's logical clock (`refconv.simulated.clock`), with the planner's own formulas. The",
        "  clock and the plan share prices; they differ in what runs (the order of calls, busy links, the",
        "  slowest rank).",
        "",
        "## Results",
        "",
        "Per configuration, the busiest rank's step on the clock and the planner's overlapped step; the",
        "allreduce time per rank and step, in flight and exposed; the speedup of the plan over sample",
        "parallelism at the same ranks; the memory per rank; the calls and bytes per rank and step.",
        "",
        *table(rows),
        "",
        f"![Speedup and memory per rank against ranks](figures/{os.path.basename(figure)})",
        "",
        "The figure: speedup over sample parallelism at each model's fewest ranks (left) and memory per rank",
        "(right, the measured peak where measured, else the planner's figure), sample parallelism dashed,",
        "the plan solid, a colour per model and a marker per machine.",
        "",
    ])


def write(path, text):
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.getpid()}.{os.path.basename(path)}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the reduced sizes, with real values (backend numpy)")
    p.add_argument("--models", nargs="*", help="only these models")
    p.add_argument("--ranks", nargs="*", type=int, help="only these rank counts")
    p.add_argument("--machines", nargs="*", default=list(MACHINES))
    p.add_argument("--out", default=os.path.join(ROOT, "docs"), help="the folder of paper-scale.md (figures/ in it)")
    p.add_argument("--rows", metavar="JSONL", nargs="+", help="append each configuration's row to the first file "
                   "as it ends, and reuse the rows already in these files")
    p.add_argument("--no-run", action="store_true", help="run nothing: write the page of the rows kept (--rows)")
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    backend = "numpy" if args.quick else "shapes"
    chosen = list(configurations(sizes, args.models, args.ranks, args.machines))
    loaded = {}
    for path in args.rows or ():
        loaded.update(load_rows(path))
    kept = {config: row for config, row in loaded.items() if config[:5] in chosen and config[5] == backend}
    results = {config[:5]: row for config, row in kept.items()}
    commits = {row["commit"] for row in kept.values()}
    measured_at = commit()             # before the page (a tracked file) is rewritten
    todo = [] if args.no_run else sorted((c for c in chosen if c not in results), key=lambda c: (c[1], chosen.index(c)))
    if kept:
        print(f"paper_scale.py: {len(results)} of {len(chosen)} configurations kept from {', '.join(args.rows)}",
              file=sys.stderr)
    for n, config in enumerate(todo, 1):
        print(f"paper_scale.py: {n} of {len(todo)}: {config[0]} on {config[1]} ranks, {config[4]}", file=sys.stderr,
              flush=True)
        results[config] = measure(*config, backend, steps=2)
        commits.add(measured_at)
        if args.rows:
            with open(args.rows[0], "a") as f:
                f.write(json.dumps({"config": [*config, backend], "commit": measured_at, **results[config]}) + "\n")
        render(args, sizes, backend, [(c, results.get(c)) for c in chosen], commits)
    if not todo:
        render(args, sizes, backend, [(c, results.get(c)) for c in chosen], commits)
    return 0


def render(args, sizes, backend, rows, commits):
    """Write the page and its figure for ``rows`` (a row of None: not run yet)."""
    label = "; ".join(f"{', '.join(m for m in names if not args.models or m in args.models)} at "
                      f"{', '.join(str(k) for k in counts if not args.ranks or k in args.ranks)} ranks, global batch "
                      f"{batch}, {image}x{image}{'x' + str(image) if names == ('cosmoflow',) else ''}"
                      for names, counts, batch, image in sizes
                      if any(not args.models or m in args.models for m in names))
    label = ("The reduced sizes (`--quick`), not the paper's: " if args.quick else "The paper's sizes: ") + label
    os.makedirs(os.path.join(args.out, "figures"), exist_ok=True)
    figure = os.path.join(args.out, "figures", "paper_scale.png")
    draw(rows, figure)
    write(os.path.join(args.out, "paper-scale.md"), page(rows, label, backend, figure, commits))
    print(f"wrote {os.path.join(args.out, 'paper-scale.md')} and {figure}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
