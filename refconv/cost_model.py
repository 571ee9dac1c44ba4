"""Per-rank communication of one convolution layer, predicted, and the algorithm ``auto`` takes.

The calls are not written down here: each algorithm module lists its own in
``records()`` (:mod:`refconv.algorithms`), in the order its code makes them and
with the bytes :data:`refconv.collectives.stats` records
(``tests/on_ranks/test_cost_model.py`` checks them against the measurement).  The
alpha-beta model of :class:`refconv.algorithms.Call` prices one call:

    ring allgather / reduce-scatter   (q-1) * alpha + (q-1)/q * m * beta
    ring allreduce                    2 (q-1) * alpha + 2 (q-1)/q * m * beta
    halo (point to point)             one alpha per message + bytes * beta

There is one chooser, :func:`refconv.pricing.choose_for_layer`: it prices these records
with a machine file's links, together with the local convolution (which differs
between X, Y and W in its im2col columns), and ``DistConv2d(algorithm="auto")``
takes its answer.  ``python -m refconv.cost_model`` prints its table for one layer, 2-D or,
with ``--shape N C D H W``, 3-D (``--grid`` may then split depth).

The records live with the registry in :mod:`refconv.algorithms` (so that importing
refconv does not import this module); this module names them and adds the table
on the command line.
"""

import argparse

from refconv import algorithms
from refconv.algorithms.base import ALPHA, BETA, Call, ConvGeometry
from refconv.grid import DEPTH, axes_of
from refconv.pricing import choose_for_layer
from refconv.pricing.machine import DEFAULT_MACHINE
from refconv.train_config import add_option

__all__ = ["ALPHA", "BETA", "Call", "layer_records", "candidates", "main"]


layer_records = algorithms.layer_records
candidates = algorithms.candidates


def main(argv=None):
    """``python -m refconv.cost_model --shape N C H W --F 64 --K 3 --grid channel=4``: the table of ``auto``
    (``--shape N C D H W``: a 3-D layer, ``K x K x K``)."""
    parser = argparse.ArgumentParser(prog="python -m refconv.cost_model", description=main.__doc__)
    parser.add_argument("--shape", type=int, nargs="+", default=(32, 64, 56, 56), metavar="SIZE",
                        help="the global input: N C H W, or N C D H W for a 3-D layer (default 32 64 56 56)")
    parser.add_argument("--F", type=int, default=64)
    parser.add_argument("--K", type=int, default=3)
    add_option(parser, "grid", default={"channel": 4}, unset=None, purpose="the layer's grid (default channel=4)")
    add_option(parser, "machine", default=DEFAULT_MACHINE, purpose="what the table prices with")
    args = parser.parse_args(argv)
    if len(args.shape) not in (4, 5):
        parser.error(f"argument --shape: expected N C H W (a 2-D layer) or N C D H W (3-D), got {args.shape}")
    shape = tuple(args.shape)
    axes, dims = axes_of(len(shape)), len(shape) - 2
    if set(args.grid) - set(axes):
        parser.error(f"argument --grid: a {dims}-D layer splits the axes {', '.join(axes)}"
                     + (f" ({DEPTH} needs --shape N C D H W)" if DEPTH in args.grid else ""))
    grid_shape, kernel = tuple(args.grid.get(axis, 1) for axis in axes), (args.K,) * dims
    geom = ConvGeometry.of(shape, (args.F, shape[1]) + kernel, padding=args.K // 2, dims=dims)
    best, best_p_f, table = choose_for_layer(shape, args.F, kernel, grid_shape=grid_shape, padding=geom.padding,
                                             machine=args.machine)
    print(f"layer x{shape} F={args.F} K={args.K} 'same' padding on grid {grid_shape}, float32, machine {args.machine}")
    for (algorithm, p_f), seconds in sorted(table.items(), key=lambda item: item[1]):
        wire = sum(c.wire_bytes for c in algorithms.records(algorithm, geom, grid_shape, (0,) * len(shape), p_f))
        label = algorithm + (f" p_f={p_f}" if p_f else "")
        mark = "  <- chosen" if (algorithm, p_f) == (best, best_p_f) else ""
        print(f"  {label:20s} {wire / 1e6:10.3f} MB on the wire {seconds * 1e3:9.3f} ms{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
