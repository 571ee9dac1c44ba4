"""``refconv bench layer``: bytes per rank and time of one DistConv2d forward and backward.

    mpiexec -n 4 refconv bench layer [--shape layer --batch 8] [--grid channel=4 --algorithm stationary-y]

Without ``--grid`` it runs every strategy that fits the rank count (sample,
spatial, Stationary-X, -Y, -W, sample x Stationary-X); with it, that one.
For each it prints, per kind of collective, the bytes recorded by
``refconv.collectives.stats`` on the busiest rank (the full gathered or reduced
buffer ``m`` of each call, docs/algorithms.md), the ring-model wire bytes
``(q-1)/q * m`` (``2 (q-1)/q * m`` for allreduce), and the median times of the
forward, the backward and both.
"""

import numpy

from refconv import DistConv2d, ProcessGrid
from refconv.bench.common import (full_grid, grid_text, option, parse_shape, pause_for, record, reject,
                                  time_ranks, traffic)

PASSES = ("forward", "backward", "forward+backward")


def strategies(P):
    """(grid, algorithm, filter_groups) of the default strategies for ``P`` ranks."""
    out = [({"sample": P}, "stationary-x", None)]
    if P % 2 == 0:
        out.append(({"height": P}, "stationary-x", None))
    out += [({"channel": P}, "stationary-x", None), ({"channel": P}, "stationary-y", None)]
    if P % 2 == 0 and P > 2:
        out.append(({"channel": P}, "stationary-w", 2))
    if P % 2 == 0:
        out.append(({"sample": 2, "channel": P // 2}, "stationary-x", None))
    return out


def measure(comm, grid_sizes, algorithm, filter_groups, shape, batch, dtype, backend, repeat, warmup, pause):
    """Times of each pass, the traffic of one forward + backward on this grid, and the layer's p_f."""
    grid = ProcessGrid(comm, **grid_sizes)
    layer = DistConv2d(shape["C"], shape["F"], shape["K"], stride=shape["stride"], padding=shape["padding"],
                       grid=grid, algorithm=algorithm, filter_groups=filter_groups, backend=backend, dtype=dtype,
                       input_shape=(batch, shape["C"], shape["H"], shape["H"]))
    rng = numpy.random.default_rng(0)
    x_loc = layer.backend.asarray(  # x_loc: this rank's block of (N, C, H, W)
        rng.standard_normal(layer.input_distribution.local_shape(grid.rank)).astype(dtype))
    dy_loc = layer.backend.asarray(  # dy_loc: this rank's block of (N, F, H_out, W_out)
        rng.standard_normal(layer.output_distribution.local_shape(grid.rank)).astype(dtype))
    layer.forward(x_loc)  # so that a backward timed first has its forward's state
    times = time_ranks(comm, {"forward": lambda: layer.forward(x_loc),
                              "backward": lambda: layer.backward(dy_loc),
                              "forward+backward": lambda: (layer.forward(x_loc), layer.backward(dy_loc))},
                       repeat, warmup, pause)
    traffic_ = traffic(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), repeat)
    grid.free()
    return times, traffic_, layer.filter_groups  # stationary-w's p_f, resolved


def run(args, comm, env):
    """One results line per strategy."""
    reject(args, ("model",), "bench layer times one convolution; give --shape (bench step takes a model)")
    if args.algorithm is not None and args.grid is None:
        reject(args, ("algorithm",), "give --grid with it (without --grid every strategy runs)")
    shapes = args.shape or [parse_shape("layer")]
    batch = option(args, "batch", 8)
    repeat = option(args, "repeat", 5)
    warmup = option(args, "warmup", 1, minimum=0)
    dtype = numpy.dtype(args.dtype)
    P = comm.Get_size()
    runs = [(args.grid, args.algorithm or "stationary-x", args.filter_groups)] if args.grid else strategies(P)
    runs = [(full_grid(g, P), a, f) for g, a, f in runs]  # every grid checked before the first one runs
    lines = []
    for shape in shapes:
        if comm.Get_rank() == 0:
            print(f"one layer N={batch} C={shape['C']} F={shape['F']} H=W={shape['H']} K={shape['K']} "
                  f"{dtype.name}, {P} ranks; bytes per rank on the busiest rank (recorded m | ring-model wire "
                  f"bytes); median ms over {repeat}")
            print(f"{'strategy':32s} {'kind':15s} {'recorded B':>12s} {'wire B':>12s} "
                  f"{'fwd ms':>8s} {'bwd ms':>8s} {'both ms':>8s}")
        for grid, algorithm, filter_groups in runs:
            times, moved, p_f = measure(comm, grid, algorithm, filter_groups, shape, batch, dtype,
                                          env["ranks"][comm.Get_rank()]["backend"], repeat, warmup,
                                          pause_for(env))
            label = f"{grid_text(grid)} {algorithm}" + (f" p_f={p_f}" if algorithm == "stationary-w" else "")
            config = {"ranks": P, "grid": grid, "algorithm": algorithm, "filter_groups": p_f, "batch": batch,
                      "shape": shape, "dtype": dtype.name, "repeat": repeat, "warmup": warmup,
                      "backend": env["ranks"][0]["backend"], "sweep": args.sweep}
            line = record("layer", label, env, config, times, moved)
            lines.append(line)
            if comm.Get_rank() == 0:
                print_rows(label, line)
    return lines


def print_rows(label, line):
    medians = [f"{line['passes'][p]['median'] * 1e3:8.1f}" for p in PASSES]
    kinds = list(line["bytes"]) or ["(none)"]
    for i, kind in enumerate(kinds):
        recorded, wired = line["bytes"].get(kind, 0), line["wire_bytes"].get(kind, 0)
        times = " ".join(medians) if i == 0 else ""
        print(f"{label if i == 0 else '':32s} {kind:15s} {recorded:12d} {wired:12.0f} {times}")

