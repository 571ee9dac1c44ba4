"""``refconv sweep``: a scaling series over rank counts and strategies, one results file.

    refconv sweep --ranks 1,2,4 --strategies sample,stationary-x,stationary-y,stationary-w \\
                  --scaling strong --bench layer --shape wide --batch 16 --out results.jsonl
    refconv plot results.jsonl

For every rank count P and strategy it launches ``refconv bench`` on P ranks
(``--launcher mpiexec``: ``mpiexec -n P`` on this machine; ``srun``: ``srun -n P``
inside a Slurm allocation) and appends the line to ``--out``:

- strong scaling keeps the global batch (``--batch``) fixed;
- weak scaling keeps the batch per rank fixed: the run on P ranks has ``--batch x P``.

A strategy names a grid for P ranks: ``sample`` (sample=P), ``spatial``
(height=P), ``stationary-x``/``-y``/``-w`` (channel=P with that algorithm).
The sweep itself runs as one process, not under mpiexec.  At the end it prints
the speedup and parallel efficiency of each series (:func:`series`).
"""

import json
import shlex
import subprocess
import sys
import uuid

from mpi4py import MPI

from refconv import checks, cli, train_config
from refconv.bench import schema
from refconv.bench.common import SHAPES, STRATEGIES, grid_text, parse_shape, strategy_grid
from refconv.testing.mpirun import find_mpiexec

NAME = "sweep"
MAIN_PASS = {"layer": "forward+backward", "step": "step"}  # the time a series is made of


def _ints(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--ranks: expected rank counts like 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--ranks: expected rank counts >= 1, got {text!r}")
    return values


HELP = "strong or weak scaling series over rank counts and strategies"
DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p):
    p.add_argument("--ranks", default="1,2,4", help="rank counts, e.g. 1,2,4,8")
    p.add_argument("--strategies", default="sample,stationary-x,stationary-y,stationary-w",
                   help=f"comma-separated, from {', '.join(STRATEGIES)}")
    p.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                   help="strong: the global batch stays --batch; weak: the batch per rank stays --batch")
    p.add_argument("--bench", choices=tuple(MAIN_PASS), default="layer", help="what one point times")
    p.add_argument("--shape", type=parse_shape, default="wide", help=f"bench layer's shape: {sorted(SHAPES)} or C=..,F=..,H=..,K=..")
    train_config.add_option(p, "model", purpose="bench step's model")
    p.add_argument("--batch", type=int, default=16, help="global batch (strong) or batch per rank (weak)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds per point")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--launcher", choices=("mpiexec", "srun"), default="mpiexec",
                   help="mpiexec: mpiexec -n P on this machine; srun: srun -n P inside a Slurm allocation")
    p.add_argument("--launcher-args", default="",
                   help="extra launcher arguments, written with '=': --launcher-args='--gpus-per-task=1'")
    p.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="srun: start P ranks on ceil(P / N) nodes (srun -N), so that they fill one node before "
                        "the next; unset: srun's default, every node of the allocation")
    train_config.add_option(p, "backend")
    p.add_argument("--out", default="results.jsonl", help="results file (appended to)")
    p.add_argument("--dry-run", action="store_true", help="print the launch commands only")


def plan(args):
    """The points of the sweep: ``(ranks, strategy, refconv bench arguments)``; checks every
    argument first, so a bad one fails before anything is launched."""
    ranks = _ints(args.ranks)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"--strategies: unknown {unknown}; expected some of {', '.join(STRATEGIES)}")
    for name, minimum in (("batch", 1), ("repeat", 1), ("warmup", 0)):
        checks.integer(getattr(args, name), f"--{name}", minimum=minimum)
    if args.ranks_per_node is not None:
        checks.integer(args.ranks_per_node, "--ranks-per-node", minimum=1)
        if args.launcher != "srun":
            raise ValueError("--ranks-per-node: only with --launcher srun (mpiexec here runs on this machine)")
    workload = ["--shape", args.shape["name"]] if args.bench == "layer" else ["--model", args.model]
    sweep_id = uuid.uuid4().hex[:12]
    points = []
    for P in ranks:
        batch = args.batch if args.scaling == "strong" else args.batch * P
        for strategy in strategies:
            grid, algorithm = strategy_grid(strategy, P)
            tag = {"id": sweep_id, "scaling": args.scaling, "strategy": strategy}
            bench = [args.bench, *workload, "--grid", grid_text(grid) if P > 1 else "sample=1",
                     "--algorithm", algorithm, "--batch", str(batch), "--dtype", args.dtype, "--repeat",
                     str(args.repeat), "--warmup", str(args.warmup), "--backend", args.backend, "--out", args.out,
                     "--sweep", json.dumps(tag, separators=(",", ":"))]
            points.append((P, strategy, bench))
    return points


def launch_command(launcher, P, bench_args, extra="", ranks_per_node=None):
    """The command line that runs ``refconv bench BENCH_ARGS`` on P ranks (srun: on
    ``ceil(P / ranks_per_node)`` nodes when that is given)."""
    program = [sys.executable, "-m", "mpi4py", "-m", "refconv.bench", *bench_args]
    if launcher == "srun":
        nodes = ["-N", str(-(-P // ranks_per_node))] if ranks_per_node else []
        return ["srun", *nodes, "-n", str(P), *shlex.split(extra), *program]
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise ValueError("--launcher mpiexec: no mpiexec next to this Python or on PATH; "
                         "install the mpich extra or load your MPI module")
    return [mpiexec, "-n", str(P), *shlex.split(extra), *program]


def run(args):
    if MPI.COMM_WORLD.Get_size() > 1:
        raise ValueError("refconv sweep launches its own ranks: run it as one process, without mpiexec/srun")
    points = plan(args)
    for P, strategy, bench_args in points:
        command = launch_command(args.launcher, P, bench_args, args.launcher_args, args.ranks_per_node)
        print(f"== {args.scaling} scaling, {P} rank(s), {strategy}: {shlex.join(command)}", flush=True)
        if args.dry_run:
            continue
        status = subprocess.run(command).returncode
        if status != 0:
            print(f"refconv sweep: error: the point ({P} ranks, {strategy}) exited with status {status}; "
                  f"its output is above", file=sys.stderr, flush=True)
            return 2 if status == 2 else 1
    if not args.dry_run:
        print(format_series(series(schema.read_lines(args.out))), flush=True)
    return 0


def series(lines):
    """``{(scaling, bench, workload, strategy): [(P, median seconds, speedup, efficiency), ...]}``
    from the sweep lines of a results file (the latest line wins where a point was measured twice).

    The base is the series' smallest rank count P0 (normally 1), taken as ideal:
    strong scaling: speedup = P0 t(P0) / t(P), efficiency = speedup / P;
    weak scaling: efficiency = t(P0) / t(P), speedup = P x efficiency (the scaled speedup).
    """
    points = {}
    for line in lines:
        tag = line["config"].get("sweep")
        if not tag or line["bench"] not in MAIN_PASS:
            continue
        config = line["config"]
        workload = config["shape"]["name"] if line["bench"] == "layer" else config["model"]
        key = (tag["scaling"], line["bench"], workload, tag["strategy"])
        points.setdefault(key, {})[config["ranks"]] = (line["passes"][MAIN_PASS[line["bench"]]]["median"], line)
    out = {}
    for key, by_ranks in sorted(points.items()):
        scaling = key[0]
        P0 = min(by_ranks)
        t0 = by_ranks[P0][0]
        rows = []
        for P in sorted(by_ranks):
            t = by_ranks[P][0]
            if scaling == "strong":
                speedup = P0 * t0 / t
                efficiency = speedup / P
            else:
                efficiency = t0 / t
                speedup = P * efficiency
            rows.append({"ranks": P, "seconds": t, "speedup": speedup, "efficiency": efficiency,
                         "line": by_ranks[P][1]})
        out[key] = rows
    return out


def format_series(table):
    lines = [f"{'scaling':<8}{'bench':<7}{'workload':<12}{'strategy':<15}{'ranks':>6}{'median ms':>11}"
             f"{'speedup':>9}{'efficiency':>11}"]
    for (scaling, bench, workload, strategy), rows in table.items():
        for r in rows:
            lines.append(f"{scaling:<8}{bench:<7}{workload[:11]:<12}{strategy:<15}{r['ranks']:>6}"
                         f"{r['seconds'] * 1e3:>11.2f}{r['speedup']:>9.2f}{r['efficiency']:>11.2f}")
    return "\n".join(lines)


def main(argv=None):
    """``python -m refconv.commands.sweep``: the same as ``refconv sweep``."""
    return cli.main([NAME, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
