"""Per-rank communication of one convolution layer, predicted, and the cheapest algorithm.

The calls are not written down here: each algorithm module lists its own in
``records()`` (:mod:`refconv.algorithms`), in the order its code makes them and
with the bytes :data:`refconv.collectives.stats` records
(``tests/mpi/test_cost_model.py`` checks them against the measurement).  This
module prices them with the alpha-beta model of :class:`refconv.algorithms.Call`:

    ring allgather / reduce-scatter   (q-1) * alpha + (q-1)/q * m * beta
    ring allreduce                    2 (q-1) * alpha + 2 (q-1)/q * m * beta
    halo (point to point)             one alpha per message + bytes * beta

Local compute is the same for X, Y and W (each rank does ``1/P`` of the
FLOPs), so :func:`choose_algorithm` (:func:`refconv.algorithms.choose`)
compares communication alone.  ``DistConv2d(algorithm="auto")`` prices the
same records together with compute, with a machine file
(:func:`refconv.plan.choose_for_layer`), grouped layers too (among the classes
that run them, :func:`refconv.algorithms.candidates`).

The functions live with the registry in :mod:`refconv.algorithms` (so that
importing refconv does not import this module, and ``python -m
refconv.cost_model`` runs cleanly); this module names them and adds the table
on the command line.
"""

import argparse

from refconv import algorithms
from refconv.algorithms.base import ALPHA, BETA, Call, ConvGeometry

__all__ = ["ALPHA", "BETA", "Call", "layer_records", "candidates", "choose_algorithm", "main"]


layer_records = algorithms.layer_records
candidates = algorithms.candidates
choose_algorithm = algorithms.choose


def main(argv=None):
    """``python -m refconv.cost_model --shape N C H W --F 64 --K 3 --grid 1 4 1 1``: a table."""
    parser = argparse.ArgumentParser(prog="python -m refconv.cost_model", description=main.__doc__)
    parser.add_argument("--shape", type=int, nargs=4, default=(32, 64, 56, 56), metavar=("N", "C", "H", "W"))
    parser.add_argument("--F", type=int, default=64)
    parser.add_argument("--K", type=int, default=3)
    parser.add_argument("--grid", type=int, nargs=4, default=(1, 4, 1, 1), metavar=("P_N", "P_c", "P_H", "P_W"))
    parser.add_argument("--alpha", type=float, default=ALPHA, help="seconds per message step")
    parser.add_argument("--beta", type=float, default=BETA, help="seconds per byte")
    args = parser.parse_args(argv)
    shape, grid_shape = tuple(args.shape), tuple(args.grid)
    geom = ConvGeometry.of(shape, (args.F, shape[1], args.K, args.K), padding=args.K // 2)
    best, best_p_f, table = choose_algorithm(geom, grid_shape, alpha=args.alpha, beta=args.beta)
    print(f"layer x{shape} F={args.F} K={args.K} 'same' padding on grid {grid_shape}, float32")
    for (algorithm, p_f), seconds in sorted(table.items(), key=lambda item: item[1]):
        wire = sum(c.wire_bytes for c in algorithms.records(algorithm, geom, grid_shape, (0, 0, 0, 0), p_f))
        label = algorithm + (f" p_f={p_f}" if p_f else "")
        mark = "  <- chosen" if (algorithm, p_f) == (best, best_p_f) else ""
        print(f"  {label:20s} {wire / 1e6:10.3f} MB on the wire {seconds * 1e3:9.3f} ms{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
