"""``refconv plot results.jsonl``: speedup, parallel efficiency and where the time goes.

    refconv plot results.jsonl [--out-dir plots] [--machine machine.yaml]

Reads the lines ``refconv sweep`` appended (any other valid results lines are
ignored; a line that is not a results line is an error naming its line
number) and writes, with matplotlib's Agg backend:

- ``scaling.png``: per series (scaling, bench, workload), the speedup and the
  parallel efficiency against ranks, one line per strategy, the ideal dashed;
  and the median time per step, measured, with the performance model's
  prediction dotted when ``--machine`` is given;
- ``breakdown.png``: the time per pass of every (strategy, ranks) split into
  compute, each kind of collective, halos and shuffles: the slowest rank's
  mean over the extra repetitions the benchmark records (``seconds_total``),
  the time inside each kind of MPI call (``seconds``), compute the rest; with
  the prediction's total as a black tick.

The prediction comes from ``refconv plan``'s model (``refconv.pricing.search``)
with a machine file (``refconv calibrate --out machine.yaml``, or a built-in
name such as ``h200-node``); without ``--machine`` there is no overlay, and
the command says so.
"""

import os
import sys

from refconv import checks, cli, train_config
from refconv.bench import schema
from refconv.commands import sweep
from refconv.model_spec import load_spec
from refconv.pricing import machine as machines, search

NAME = "plot"
# results-line kinds -> the parts of the breakdown, in stacking order
PARTS = (("compute", ()), ("allreduce", ("allreduce",)), ("reduce-scatter", ("reduce_scatter",)),
         ("allgather", ("allgather",)), ("halo", ("halo",)), ("shuffle", ("alltoallv",)),
         ("other collectives", ("bcast", "scatter", "gather", "object", "barrier")))
COLORS = ("#9e9e9e", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


HELP = "plot speedup, efficiency and the time breakdown of a sweep"
DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p):
    p.add_argument("results", help="a JSON-lines results file from refconv sweep / refconv bench --out")
    p.add_argument("--out-dir", default=None, help="where the PNGs go (default: the results file's folder)")
    train_config.add_option(p, "machine", purpose="the predicted-vs-measured overlay", unset="the overlay is left out")


def breakdown(line):
    """``{part: seconds}`` of one repetition of a results line's main pass on the slowest rank
    (``seconds_total``, split by ``seconds``); compute is what the collectives leave."""
    total = line["seconds_total"]
    parts = {name: sum(line["seconds"].get(kind, 0.0) for kind in kinds) for name, kinds in PARTS[1:]}
    parts = {"compute": max(total - sum(parts.values()), 0.0), **parts}
    return parts


def predictor(machine_name):
    """A function ``line -> predicted seconds of its main pass`` (None when it cannot be predicted),
    or None without a machine."""
    if machine_name is None:
        return None
    machine = machines.load(machine_name)  # a missing file is a ValueError (MachineError): one line, status 2

    def predict(line):
        config = line["config"]
        if line["bench"] == "layer":
            s = config["shape"]
            spec = {"name": "layer", "in_channels": s["C"], "layers": [
                {"type": "conv", "out": s["F"], "kernel": s["K"], "stride": s["stride"], "padding": s["padding"]}]}
            shape = (config["batch"], s["C"], s["H"], s["H"])
        else:
            spec = load_spec(config["model"])
            shape = (config["batch"], spec.get("in_channels", 3), config["image_size"], config["image_size"])
        g = config["grid"]
        planner, _ = search.plan_model(spec, shape, config["ranks"], machine, None)
        plan = planner.uniform((g["sample"], g["channel"], g["height"], g["width"]), config["algorithm"],
                               config["filter_groups"] if config["algorithm"] == "stationary-w" else None)
        return None if plan is None else plan.seconds

    return predict


def plot_scaling(plt, table, predict, path):
    series = _by_series(table)
    fig, axes = plt.subplots(len(series), 3, figsize=(14, 3.6 * len(series)), squeeze=False)
    for row, (scaling, bench, workload, _) in enumerate(series):
        ax_s, ax_e, ax_t = axes[row]
        ranks_all = set()
        for strategy, points in _strategies(table, scaling, bench, workload):
            ranks = [p["ranks"] for p in points]
            ranks_all.update(ranks)
            line, = ax_s.plot(ranks, [p["speedup"] for p in points], "o-", label=strategy)
            ax_e.plot(ranks, [p["efficiency"] for p in points], "o-", color=line.get_color())
            ax_t.plot(ranks, [p["seconds"] * 1e3 for p in points], "o-", color=line.get_color())
            if predict:
                predicted = [(p["ranks"], predict(p["line"])) for p in points]
                predicted = [(r, t * 1e3) for r, t in predicted if t is not None]
                if predicted:
                    ax_t.plot(*zip(*predicted), "x:", color=line.get_color())
        ranks_all = sorted(ranks_all)
        ax_s.plot(ranks_all, ranks_all, "k--", lw=0.8, label="ideal")  # speedup P (strong) or P (scaled, weak)
        ax_e.axhline(1.0, color="k", ls="--", lw=0.8)
        title = f"{scaling} scaling, bench {bench} {workload}"
        for ax, what in ((ax_s, "speedup" if scaling == "strong" else "scaled speedup"),
                         (ax_e, "parallel efficiency"), (ax_t, "median ms per pass")):
            ax.set_xlabel("ranks")
            ax.set_ylabel(what)
            ax.set_xticks(ranks_all)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
        ax_e.set_ylim(0, max(1.2, ax_e.get_ylim()[1]))
        ax_s.legend(fontsize=8)
        ax_t.set_yscale("log")
        ax_t.text(0.02, 0.97, "solid: measured" + ("; x dotted: predicted" if predict else "; no --machine: "
                                                   "no prediction"), transform=ax_t.transAxes, fontsize=7, va="top")
    save(fig, path)


def plot_breakdown(plt, table, predict, path):
    series = _by_series(table)
    fig, axes = plt.subplots(len(series), 1, figsize=(max(8, 0.9 * max(len(v) for v in series.values())) + 2,
                                                      4.2 * len(series)), squeeze=False)
    for ax, ((scaling, bench, workload, _), points) in zip(axes[:, 0], series.items()):
        labels = []
        bottoms = [0.0] * len(points)
        for (name, _), color in zip(PARTS, COLORS):
            heights = [breakdown(p["line"])[name] * 1e3 for p in points]
            ax.bar(range(len(points)), heights, bottom=bottoms, color=color, label=name, width=0.7)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for i, p in enumerate(points):
            labels.append(f"{p['strategy']}\n{p['ranks']} rank{'s' if p['ranks'] > 1 else ''}")
            predicted = predict(p["line"]) if predict else None
            if predicted is not None:
                ax.plot([i - 0.35, i + 0.35], [predicted * 1e3] * 2, "k-", lw=2,
                        label="predicted total" if i == 0 else None)
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("mean ms per pass (slowest rank)")
        ax.set_title(f"{scaling} scaling, bench {bench} {workload}: where the time goes", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def _by_series(table):
    """``{(scaling, bench, workload, ""): [point with its strategy, ...]}`` in strategy order."""
    out = {}
    for (scaling, bench, workload, strategy), points in table.items():
        out.setdefault((scaling, bench, workload, ""), []).extend(dict(p, strategy=strategy) for p in points)
    return out


def _strategies(table, scaling, bench, workload):
    return [(key[3], points) for key, points in table.items() if key[:3] == (scaling, bench, workload)]


def save(fig, path):
    """Write ``fig`` to ``path`` as refconv's figures are written (tight layout, 110 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt  # imported already by whoever drew fig

    plt.close(fig)


def figure_script(draw, default_path):
    """The command line of a ``docs/figures`` script: ``draw(path)`` to its one argument, or to
    ``default_path``, then print the path."""
    path = sys.argv[1] if len(sys.argv) > 1 else default_path
    draw(path)
    print(path)


def run(args):
    if not os.path.isfile(args.results):
        raise ValueError(f"results: {args.results!r} is not a file; give the JSON-lines file of refconv sweep --out")
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.results))
    checks.output_folder(out_dir, "--out-dir")      # one line (exit 2), not a traceback at the first PNG
    lines = schema.read_lines(args.results)  # not JSON lines: a ValueError naming the line
    table = sweep.series(lines)
    if not table:
        raise ValueError(f"{args.results}: no refconv sweep lines (bench layer or step with a sweep tag) to plot; "
                         f"run refconv sweep --out {args.results} first")
    predict = predictor(args.machine)
    import matplotlib  # an optional dependency (the test and docs extras), needed only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = [os.path.join(out_dir, "scaling.png"), os.path.join(out_dir, "breakdown.png")]
    plot_scaling(plt, table, predict, written[0])
    plot_breakdown(plt, table, predict, written[1])
    print(sweep.format_series(table))
    if predict is None:
        print("no --machine: the predicted-vs-measured overlay is left out (refconv calibrate --out machine.yaml "
              "measures one)")
    print("wrote " + ", ".join(written), flush=True)
    return 0


def main(argv=None):
    """``python -m refconv.commands.plot``: the same as ``refconv plot``."""
    return cli.main([NAME, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
