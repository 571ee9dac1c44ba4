"""``python -m refconv.bench.scale``: what a simulated rank costs as the world grows (issue 39).

    python -m refconv.bench.scale [--ranks 16,64,256,1024] [--allreduces 10] [--sample 16]

Two tables, side by side in one run, and the ratios of neighbouring sizes (1.0: flat, linear in the
ranks overall; 4.0 for 4x the ranks: quadratic):

- **simulator**: the process CPU time (every thread) per rank per allreduce of 16 float32 on
  :func:`refconv.simulated.run`, free and stepped: a run of ``--allreduces`` allreduces less a run of
  none, so thread start and join are taken out;
- **binding**: the CPU time per rank of ``refconv.sharding.plan_shuffle`` both ways for a
  ResNet-50-like grid change in weak scaling (``(2K, 256, 56, 56)``, the sample grid ``(K, 1, 1, 1)``
  to ``(K/16, 4, 2, 2)``), averaged over ``--sample`` ranks spread over the world.  Each figure is
  the least of ``--repeats`` tries.  The layout
  tables every rank of a process shares (``distribution._layout``, ``sharding._holders``) are made
  once first, as the first rank of a simulated world makes them for the others.

It prints, never asserts: speed claims come from here, not from timed tests.
"""

import argparse
import time

import numpy

from refconv import collectives, simulated
from refconv.distribution import Distribution
from refconv.sharding import plan_shuffle

ACTIVATIONS = ("sample", "channel", "height", "width")


def _allreduces(comm, n):
    x = numpy.ones(16, numpy.float32)
    for _ in range(n):
        collectives.allreduce(comm, x)


def _cpu(fn, *args, **kwargs):
    start = time.process_time()
    fn(*args, **kwargs)
    return time.process_time() - start


def simulator_cost(ranks, n, stepped, repeats):
    """CPU seconds per rank per allreduce on ``ranks`` simulated ranks (the least of ``repeats`` tries:
    other processes on the cores only ever add)."""
    base = min(_cpu(simulated.run, _allreduces, ranks, args=(0,), stepped=stepped) for _ in range(repeats))
    total = min(_cpu(simulated.run, _allreduces, ranks, args=(n,), stepped=stepped) for _ in range(repeats))
    return max(total - base, 0.0) / (ranks * n)


def binding_cost(ranks, sample, repeats):
    """CPU seconds per rank of plan_shuffle there and back, for the grid change of the module's doc."""
    shape = (2 * ranks, 256, 56, 56)
    src = Distribution((ranks, 1, 1, 1), shape, ACTIVATIONS)
    dst = Distribution((ranks // 16, 4, 2, 2), shape, ACTIVATIONS)
    plan_shuffle(src, dst, 0), plan_shuffle(dst, src, 0)          # the shared tables, as rank 0 makes them
    picked = sorted({int(r) for r in numpy.linspace(0, ranks - 1, sample)})
    spent = sum(min(_cpu(lambda r: (plan_shuffle(src, dst, r), plan_shuffle(dst, src, r)), r) for _ in range(repeats))
                for r in picked)
    return spent / len(picked)


def _ratios(sizes, values):
    return "  ".join(f"{b}/{a}: {values[b] / values[a]:.2f}" for a, b in zip(sizes, sizes[1:])
                     if values.get(a) and values.get(b))


def run(sizes, n, sample, repeats=3, out=print):
    results = {}
    out(f"simulator: CPU per rank per allreduce (us), {n} allreduces of 16 float32")
    out(f"{'ranks':>6} {'free':>10} {'stepped':>10}")
    for mode in ("free", "stepped"):
        results[mode] = {}
    for k in sizes:
        for mode in ("free", "stepped"):
            results[mode][k] = simulator_cost(k, n, mode == "stepped", repeats)
        out(f"{k:>6} {results['free'][k] * 1e6:>10.1f} {results['stepped'][k] * 1e6:>10.1f}")
    for mode in ("free", "stepped"):
        out(f"  {mode:<8} ratios {_ratios(sizes, results[mode])}")
    bind_sizes = [k for k in sizes if k >= 64]
    results["binding"] = {}
    out("binding: CPU per rank of plan_shuffle there and back (ms), (2K, 256, 56, 56): (K,1,1,1) <-> (K/16,4,2,2)")
    for k in bind_sizes:
        results["binding"][k] = binding_cost(k, sample, repeats)
        out(f"{k:>6} {results['binding'][k] * 1e3:>10.2f}   all ranks: {results['binding'][k] * k:.2f} s")
    out(f"  binding  ratios {_ratios(bind_sizes, results['binding'])}")
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refconv.bench.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="16,64,256,1024", help="world sizes, comma separated (default: %(default)s)")
    p.add_argument("--allreduces", type=int, default=10, help="allreduces per simulated run (default: %(default)s)")
    p.add_argument("--sample", type=int, default=16, help="ranks whose binding is timed (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="tries of each figure; the least is shown (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.ranks.split(",")]
    except ValueError:
        p.error(f"--ranks: comma-separated integers, got {args.ranks!r}")
    if any(not 16 <= k <= simulated.MAX_RANKS or k % 16 for k in sizes):
        p.error(f"--ranks: multiples of 16 in [16, {simulated.MAX_RANKS}], got {args.ranks!r}")
    if min(args.allreduces, args.sample, args.repeats) < 1:
        p.error("--allreduces, --sample and --repeats: at least 1")
    run(sizes, args.allreduces, args.sample, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
