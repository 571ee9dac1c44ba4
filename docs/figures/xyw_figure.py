"""Draw Stationary-X, -Y and -W side by side for one layer: what stays, what moves, what is reduced.

    python docs/figures/xyw_figure.py [OUTDIR]     (default: this script's directory)

writes ``xyw.png``.  Nothing is hand-placed: each panel's weight matrix is coloured by the
rank that holds each block, read from the algorithm's own ``weight_dims`` through
:class:`refconv.distribution.Distribution`; its title is the first line of the algorithm
module's docstring ("x stays, partial y moves"); and the calls listed under it are the
algorithm's ``records()`` for rank 0, each sorted as "moves" (an allgather: a tensor
travels whole) or "reduced" (a reduce-scatter or an allreduce: partial sums finished).
"""

import os
import sys

import matplotlib
import numpy

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from refconv import algorithms  # noqa: E402
from refconv.algorithms import ConvGeometry  # noqa: E402
from refconv.distribution import Distribution  # noqa: E402

C, F, P_C, P_F = 8, 6, 4, 2  # the layer's channels and filters; a channel group of 4, W's p_f = 2
P_N = 2  # two channel groups (sample x channel = 2 x 4 ranks): each rank has one weight peer
IN_SHAPE, KERNEL = (4, C, 16, 16), (3, 3)  # the activations whose bytes the calls move (float32)
NAMES = ("stationary-x", "stationary-y", "stationary-w")
MOVES, REDUCED = ("allgather", "bcast"), ("reduce_scatter", "allreduce")
COLOURS = plt.get_cmap("tab10").colors


def owners(name):
    """``(F, C)`` array: the channel-group rank that holds each weight element under ``name``."""
    cls = algorithms.REGISTRY[name]
    p_f = P_F if name == "stationary-w" else None
    w = Distribution((1, P_C, 1, 1), (F, C, 1, 1), cls.weight_dims(P_C, p_f), names=("F", "C", "Kh", "Kw"))
    held = numpy.full((F, C), -1)
    for r in range(P_C):
        for f0, f1 in w.pieces(r, 0):
            for c0, c1 in w.pieces(r, 1):
                held[f0:f1, c0:c1] = r
    return held


def calls(name):
    """Rank 0's calls of one forward and backward, as ``(verb, text)``: verb "moves" or "reduced"."""
    geom = ConvGeometry.of(IN_SHAPE, (F, C) + KERNEL, padding=1)
    p_f = P_F if name == "stationary-w" else None
    out, grads = [], iter(("dw shard", "db block"))  # the segmented allreduce: dw, then db
    for call in algorithms.records(name, geom, (P_N, P_C, 1, 1), (0, 0, 0, 0), p_f):
        verb = "moves" if call.kind in MOVES else "reduced" if call.kind in REDUCED else "other"
        what = f"allreduce of the {next(grads)}" if call.kind == "allreduce" else call.kind.replace("_", "-")
        out.append((verb, f"{what} over {call.comm_size}: {call.bytes:,} B"))
    return out


def title(name):
    """The algorithm module's own one-line summary: "Stationary-X: ``x`` stays, partial ``y`` moves"."""
    doc = sys.modules[algorithms.REGISTRY[name].__module__].__doc__
    return doc.splitlines()[0].split(" (")[0].replace("``", "")


def draw(path):
    fig, axes = plt.subplots(1, 3, figsize=(13, 5.2))
    for ax, name in zip(axes, NAMES):
        held = owners(name)
        image = numpy.ones((F, C, 3))
        for r in range(P_C):
            image[held == r] = COLOURS[r]
        ax.imshow(image, aspect="equal")
        for f in range(F):
            for c in range(C):
                ax.text(c, f, str(held[f, c]), ha="center", va="center", fontsize=8, color="white")
        ax.set_xticks(range(C))
        ax.set_yticks(range(F))
        ax.set_xlabel("input channel c of w")
        ax.set_ylabel("filter f of w")
        head, _, rest = title(name).partition(": ")
        ax.set_title(f"{head}\n{rest}", fontsize=10)
        lines = [f"{verb:8s} {text}" for verb, text in calls(name)]
        ax.text(0.0, -0.2, "rank 0's calls (forward, backward):\n" + "\n".join(lines), transform=ax.transAxes,
                va="top", ha="left", family="monospace", fontsize=7.5)
    fig.suptitle(f"One layer (C = {C}, F = {F}, x {IN_SHAPE}, float32) on a {P_N} x {P_C} (sample x channel) grid: "
                 f"the weight block each channel rank keeps (number: its rank),\nand rank 0's calls: what moves whole "
                 f"and what is reduced (partial sums finished)", fontsize=10)
    fig.subplots_adjust(bottom=0.38, top=0.86, wspace=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(outdir=None):
    outdir = outdir or os.path.dirname(os.path.abspath(__file__))
    return draw(os.path.join(outdir, "xyw.png"))


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
