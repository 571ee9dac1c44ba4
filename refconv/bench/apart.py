"""refconv's convolution passes against torch's, each framework timed alone in a process of its own.

    python -m refconv.bench.apart [--dims 3] [--shapes cosmo1 ...] [--batch 4] [--rounds 9] [--threads 2]

``python -m refconv.bench.torch_step passes`` (and ``passes3d``) alternates refconv, torch and
the GEMM in one process.  There the frameworks' idle threads disturb each other: OpenBLAS's
threads spin for a while after numpy's call, torch's OpenMP team after torch's, and the next
contender runs beside them.  On 2 cores that moved single figures by 2-10x, in both directions
(docs/benchmarks.md, 2026-12-02 09:30).  Here each contender runs in a fresh Python process, one
after the other (refconv's never imports torch), ``--repeat`` times each, alternating; every pass
is warmed up once and timed ``--rounds`` times.  A third process times each pass's GEMM alone
(``torch_step.gemm_passes``: numpy's matrix product on ready columns, without the copies around
it), the ceiling of any im2col formulation through numpy's BLAS.  The figures are the medians
(min-max) over all of a contender's timings; "vs torch" is torch's median over refconv's, and
"GEMM vs torch" torch's over the GEMM's.  The passes' results are checked against torch by
``torch_step passes``/``passes3d`` and the tests, not here.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from refconv import train_config
from refconv.bench.torch_step import (PASSES, QUICK_SHAPES, QUICK_SHAPES3D, SHAPES, SHAPES3D, gemm_passes,
                                     import_torch, layer_arrays, refconv_passes, torch_passes)


def shapes_of(dims, names=None, quick=False):
    """``{name: (C, F, H, K, stride, padding)}`` of torch_step's tables for ``dims``."""
    table = (QUICK_SHAPES3D if quick else SHAPES3D) if dims == 3 else (QUICK_SHAPES if quick else SHAPES)
    unknown = sorted(set(names or ()) - set(table))
    if unknown:
        raise SystemExit(f"--shapes: unknown {unknown} for --dims {dims}; expected some of {sorted(table)}")
    return {n: table[n] for n in (names or table)}


def passes_of(who, dims, C, F, H, K, stride, padding, batch):
    """``{pass: fn}`` of one framework on one layer's random fp32 arrays (torch_step's, for the same layer)."""
    x, w, dy = layer_arrays(C, F, H, K, stride, padding, batch, dims=dims)
    g = dict(stride=stride, padding=padding)
    if who == "torch":
        return torch_passes(import_torch(), x, w, dy, g, dims)  # only in torch's own process
    return (gemm_passes if who == "GEMM" else refconv_passes)(x, w, dy, g, dims)


def child(args):
    """One framework's timings, one JSON line per (shape, pass): ``{"shape", "pass", "ms": [...]}``."""
    if args.child == "torch":
        import_torch().set_num_threads(args.threads)
    for name, shape in shapes_of(args.dims, args.shapes, args.quick).items():
        for p, fn in passes_of(args.child, args.dims, *shape, args.batch).items():
            fn()  # warm-up
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            print(json.dumps({"shape": name, "pass": p, "ms": times}), flush=True)
    print(json.dumps({"torch imported": "torch" in sys.modules}), flush=True)
    return 0


def run(args):
    """Both frameworks in turn, ``--repeat`` processes each, then the table."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    times = {"refconv": {}, "GEMM": {}, "torch": {}}
    for _ in range(args.repeat):
        for who in times:
            command = [sys.executable, "-m", "refconv.bench.apart", "--child", who, "--dims", str(args.dims),
                       "--batch", str(args.batch), "--rounds", str(args.rounds), "--threads", str(args.threads)]
            command += (["--shapes", *args.shapes] if args.shapes else []) + (["--quick"] if args.quick else [])
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                raise SystemExit(f"refconv.bench.apart: the {who} process failed (status {done.returncode})")
            lines = [json.loads(line) for line in done.stdout.splitlines()]
            if lines[-1]["torch imported"] != (who == "torch"):
                raise SystemExit(f"refconv.bench.apart: the {who} process imported torch: {lines[-1]}")
            for row in lines[:-1]:
                times[who].setdefault((row["shape"], row["pass"]), []).extend(row["ms"])
        time.sleep(0.2)
    print(f"{args.dims}-D passes, batch {args.batch}, {args.threads} threads each, each framework alone in its "
          f"own process ({args.repeat} x {args.rounds} timings); median (min-max) ms")
    print(f"{'shape':<11}{'pass':<17}{'refconv ms':>24}{'GEMM alone ms':>24}{'torch ms':>24}{'vs torch':>10}"
          f"{'GEMM vs torch':>15}")
    ratios = {who: {p: [] for p in PASSES} for who in ("refconv", "GEMM")}
    for (name, p), ours in times["refconv"].items():
        gemm, theirs = times["GEMM"][(name, p)], times["torch"][(name, p)]
        r, r_gemm = (statistics.median(theirs) / statistics.median(t) for t in (ours, gemm))
        ratios["refconv"][p].append(r)
        ratios["GEMM"][p].append(r_gemm)
        print(f"{name:<11}{p:<17}{_span(ours):>24}{_span(gemm):>24}{_span(theirs):>24}{r:>10.2f}{r_gemm:>15.2f}")
    for p in PASSES:
        mean, mean_gemm = (math.exp(statistics.fmean(math.log(r) for r in ratios[who][p])) for who in ratios)
        print(f"geometric mean vs torch, {p}: {mean:.2f} (the GEMM alone: {mean_gemm:.2f})")
    return 0


def _span(ms):
    return f"{statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f})"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.apart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, choices=(2, 3), default=3)
    parser.add_argument("--shapes", nargs="+", help="names of torch_step's shapes (default: all of --dims)")
    parser.add_argument("--quick", action="store_true", help="torch_step's quick shapes (a smoke test)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=9, help="timings of each pass in each process")
    parser.add_argument("--repeat", type=int, default=2, help="processes of each framework, alternating")
    train_config.add_option(parser, "threads", default=2, unset=None, purpose="each process's (torch's too)")
    parser.add_argument("--child", choices=("refconv", "GEMM", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batch, args.rounds, args.repeat, args.threads) < 1:
        parser.error("--batch, --rounds, --repeat and --threads: expected positive integers")
    shapes_of(args.dims, args.shapes, args.quick)  # an unknown name: one line, before any process starts
    return child(args) if args.child else run(args)


if __name__ == "__main__":
    sys.exit(main())
