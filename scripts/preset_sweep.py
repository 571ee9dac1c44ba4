"""Look for scale bugs: every preset, one shapes-only training step under its plan, at 16 to 1024 ranks (issue 39).

Each configuration (a preset, a rank count) runs ``refconv simulate --plan --steps 1 --backend shapes`` through
the command's own functions (:func:`refconv.commands.simulate.execute`), in a process of its own, so that one
configuration's memory and failure do not reach the next.  A row says one of three things:

- **ran**: the step's time on the logical clock beside the plan's, the memory per rank measured (the busiest
  rank's peak) beside the plan's, the calls per rank, and what simulating it cost here (CPU seconds, peak
  resident memory of the process);
- **refused**: the planner cannot plan it, or the command refuses it (a ``ValueError``), in their own words
  (e.g. no grid fits the memory, or more ranks than the simulator's cap);
- **failed**: the error and the last lines of its traceback: a scale bug to fix.

::

    .venv/bin/python scripts/preset_sweep.py                          # every preset at 16, 64, 256, 1024
    .venv/bin/python scripts/preset_sweep.py --ranks 16 64 --models resnet50 digits-cnn
    .venv/bin/python scripts/preset_sweep.py --table sweep.jsonl      # the table of rows already written

Rows are appended to ``--jsonl`` (default ``preset_sweep.jsonl``) as each configuration ends, smallest rank
counts first, so a sweep stopped early keeps what it measured; the table goes to stdout at the end.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from paper_scale import figures  # noqa: E402  (the paper page's figures of a run: step, plan, memory, calls)

from refconv import cli  # noqa: E402
from refconv.model_spec import PRESETS  # noqa: E402

MiB = 2**20
RANKS = (16, 64, 256, 1024)
# (global batch, image size) of each preset: the paper's for the ImageNet models and cosmoflow, the simulate
# command's default image for the digits CNN
SIZES = {"digits-cnn": (512, 32), "cosmoflow": (64, 128)}
IMAGENET = (512, 224)


def child(model, ranks, machine):
    """One configuration, in this process: prints one JSON row."""
    from refconv.commands import simulate

    batch, image = SIZES.get(model, IMAGENET)
    argv = ["simulate", "--model", model, "--ranks", str(ranks), "--batch", str(batch), "--image-size", str(image),
            "--machine", machine, "--backend", "shapes", "--steps", "1", "--plan"]
    row = {"model": model, "ranks": ranks, "batch": batch, "image": image, "machine": machine}
    start = time.process_time()
    try:
        _, runs, _, _, results = simulate.execute(cli.build_parser().parse_args(argv))
        row["ran"] = figures(results["plan"], runs["plan"][1])
    except ValueError as exc:            # the planner cannot plan it, or the command refuses it: their own words
        row["refused"] = " ".join(str(exc).split())
    except Exception as exc:  # noqa: BLE001 -- a scale bug: reported in the row, with where it came from
        row["failed"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        row["traceback"] = traceback.format_exc().splitlines()[-12:]
    row["cpu_s"] = time.process_time() - start
    row["max_rss_MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(row), flush=True)


def table(rows):
    out = ["| model | ranks | batch, image | result | step ms clock (plan) | memory per rank MiB measured "
           "(plan) | calls per rank | simulating it: CPU s, peak RSS MiB |",
           "| --- | ---: | --- | --- | --- | --- | ---: | --- |"]
    for r in rows:
        head = f"| {r['model']} | {r['ranks']} | {r['batch']}, {r['image']} "
        cost = f"{r.get('cpu_s', 0):.1f}, {r.get('max_rss_MiB', 0):.0f}"
        if "ran" in r:
            f = r["ran"]
            measured = "-" if f["memory_measured"] is None else f"{f['memory_measured'] / MiB:.1f}"
            out.append(head + f"| ran | {f['step'] * 1e3:.2f} ({f['predicted'] * 1e3:.2f}) | {measured} "
                       f"({f['memory_planned'] / MiB:.1f}) | {f['calls']:.0f} | {cost} |")
        elif "refused" in r:
            out.append(head + f"| refused: {r['refused'][:300]} | | | | {cost} |")
        else:
            out.append(head + f"| **failed**: {r.get('failed', 'no row')} | | | | {cost} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=list(PRESETS), help="presets (default: every one)")
    p.add_argument("--ranks", nargs="*", type=int, default=list(RANKS))
    p.add_argument("--machine", default="v100-edr")
    p.add_argument("--jsonl", default="preset_sweep.jsonl", help="the rows, appended as they end")
    p.add_argument("--table", metavar="JSONL", help="print the table of the rows in this file, run nothing")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "RANKS", "MACHINE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.child[2])
        return 0
    if args.table:
        with open(args.table) as f:
            print(table([json.loads(line) for line in f if line.strip()]))
        return 0
    unknown = sorted(set(args.models) - set(PRESETS))
    if unknown:
        p.error(f"--models: unknown {unknown}; expected some of {sorted(PRESETS)}")
    configs = [(m, k) for k in sorted(args.ranks) for m in args.models]
    rows = []
    for n, (model, ranks) in enumerate(configs, 1):
        print(f"preset_sweep.py: {n} of {len(configs)}: {model} on {ranks} ranks ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", model, str(ranks), args.machine],
                              capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if lines:
            row = json.loads(lines[-1])
        else:                            # the process died without a row (killed, out of memory)
            row = {"model": model, "ranks": ranks, "batch": SIZES.get(model, IMAGENET)[0],
                   "image": SIZES.get(model, IMAGENET)[1], "machine": args.machine,
                   "failed": f"the process ended with status {done.returncode} and no row: "
                             f"{' '.join(done.stderr.split()[-40:])}"}
        rows.append(row)
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        outcome = "ran" if "ran" in row else "refused" if "refused" in row else "FAILED"
        print(f"preset_sweep.py: {model} on {ranks} ranks: {outcome}, {row.get('cpu_s', 0):.0f} CPU s",
              file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
