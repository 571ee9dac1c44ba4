"""Bytes per rank and time of one DistConv2d forward + backward, for each algorithm.

    mpiexec -n 4 python -m mpi4py -m refconv.bench_layer [--N 8 --C 64 --F 64 --H 16 --K 3]

For each strategy it prints, per kind of collective, the bytes recorded by
``refconv.collectives.stats`` on the busiest rank (the full gathered or reduced
buffer ``m`` of each call, see ALGORITHMS.md section 4), the ring-model wire
bytes ``(q-1)/q * m`` (``2 (q-1)/q * m`` for allreduce), and the median time of
a forward + backward.
"""

import argparse
import time

import numpy
from mpi4py import MPI

from refconv import collectives
from refconv.conv import DistConv2d
from refconv.grid import ProcessGrid


def strategies(P):
    """(label, grid shape, algorithm, filter_groups) for ``P`` ranks."""
    out = [("sample", (P, 1, 1, 1), "stationary-x", None)]
    if P % 2 == 0:
        out.append(("spatial (height)", (1, 1, P, 1), "stationary-x", None))
    out += [("stationary-x", (1, P, 1, 1), "stationary-x", None),
            ("stationary-y", (1, P, 1, 1), "stationary-y", None)]
    if P % 2 == 0 and P > 2:
        out.append((f"stationary-w p_f=2", (1, P, 1, 1), "stationary-w", 2))
    if P % 2 == 0:
        out.append(("sample x stationary-x", (2, P // 2, 1, 1), "stationary-x", None))
    return out


def wire(record):
    q = record.comm_size
    factor = 2 if record.kind == "allreduce" else 1
    return record.bytes if record.kind == "halo" else factor * (q - 1) / q * record.bytes


def measure(comm, shape, algorithm, filter_groups, args, repeats=5):
    grid = ProcessGrid(comm, **dict(zip(("sample", "channel", "height", "width"), shape)))
    layer = DistConv2d(args.C, args.F, args.K, padding=args.K // 2, grid=grid, algorithm=algorithm,
                       filter_groups=filter_groups, backend="numpy", dtype=numpy.float32,
                       input_shape=(args.N, args.C, args.H, args.H))
    rng = numpy.random.default_rng(0)
    x_loc = rng.standard_normal(layer.input_distribution.local_shape(grid.rank)).astype(numpy.float32)
    dy_loc = rng.standard_normal(layer.output_distribution.local_shape(grid.rank)).astype(numpy.float32)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        with collectives.stats.recording() as region:
            layer.forward(x_loc)
            layer.backward(dy_loc)
        times.append(time.perf_counter() - t)
    per_kind, per_kind_wire = {}, {}
    for r in region.records:  # the last repetition
        per_kind[r.kind] = per_kind.get(r.kind, 0) + r.bytes
        per_kind_wire[r.kind] = per_kind_wire.get(r.kind, 0) + wire(r)
    grid.free()
    return per_kind, per_kind_wire, float(numpy.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="refconv.bench_layer", description=__doc__.splitlines()[0])
    for name, default in (("N", 8), ("C", 64), ("F", 64), ("H", 16), ("K", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"one layer N={args.N} C={args.C} F={args.F} H=W={args.H} K={args.K} float32, {comm.size} ranks; "
              f"bytes per rank on the busiest rank (recorded m | ring-model wire bytes)")
        print(f"{'strategy':28s} {'kind':15s} {'recorded B':>12s} {'wire B':>12s} {'fwd+bwd ms':>11s}")
    for label, shape, algorithm, p_f in strategies(comm.size):
        per_kind, per_wire, t = measure(comm, shape, algorithm, p_f, args)
        everyone = comm.gather((per_kind, per_wire, t), root=0)
        if comm.rank == 0:
            kinds = sorted({k for pk, _, _ in everyone for k in pk})
            tmax = max(e[2] for e in everyone)
            for i, kind in enumerate(kinds):
                rec = max(e[0].get(kind, 0) for e in everyone)
                wr = max(e[1].get(kind, 0) for e in everyone)
                print(f"{label if i == 0 else '':28s} {kind:15s} {rec:12d} {wr:12.0f} {f'{tmax * 1e3:.1f}' if i == 0 else '':>11s}")


if __name__ == "__main__":
    main()
