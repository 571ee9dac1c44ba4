"""Draw rank 0's halo on a 2 x 2 x 2 (depth x height x width) spatial grid: which cells of its
window each rank sends, computed by refconv.halo.halo_plan (faces, edges, the corner).

    python docs/figures/halo3d_figure.py [OUT.png]        (default: docs/figures/halo3d.png)
"""

import os
import sys

import matplotlib
import numpy

from refconv.halo import halo_plan

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GRID, SIZE, KERNEL = (2, 2, 2), (5, 5, 5), (3, 3, 3)   # blocks of 3 and 2 cells; padding 1, stride 1
COLOURS = {0: "lightgrey", 1: "tab:blue", 2: "tab:orange", 3: "tab:red"}  # by the axes the owner lies across
KINDS = {0: "own block", 1: "face (3 ranks)", 2: "edge (3 ranks)", 3: "corner (1 rank)"}


def owners(reader=0):
    """Per cell of ``reader``'s window: the spatial rank whose block fills it (-1: zero padding)."""
    _, window, pieces = halo_plan(GRID, SIZE, SIZE, KERNEL, (1, 1, 1), (1, 1, 1), (1, 1, 1))
    owner = numpy.full(window[reader].shape, -1)
    for (sender, to), piece in pieces.items():
        if to == reader:
            owner[piece.window_index()[2:]] = sender
    return window[reader], owner


def draw(path):
    window, owner = owners()
    across = numpy.where(owner >= 0, sum(numpy.unravel_index(numpy.maximum(owner, 0), GRID)[a] > 0
                                         for a in range(3)), -1)
    fig = plt.figure(figsize=(10, 4.8))
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    filled = numpy.transpose(owner >= 0, (2, 1, 0))          # voxels' axes: (w, h, d) as x, y, z
    colours = numpy.empty(filled.shape, dtype=object)
    for kind, colour in COLOURS.items():
        colours[numpy.transpose(across == kind, (2, 1, 0))] = colour
    # corners of the voxels at the volume's coordinates: the window starts at -1 along each axis
    w, h, d = numpy.meshgrid(*(numpy.arange(lo, hi + 1) for lo, hi in zip(window.lo[::-1], window.hi[::-1])),
                             indexing="ij")
    ax.voxels(w, h, d, filled, facecolors=colours, edgecolor="k", linewidth=0.3, alpha=0.9)
    ax.view_init(elev=28, azim=40)                         # from the far side: the halo shell in front
    ax.set_xlabel("w")
    ax.set_ylabel("h")
    ax.set_zlabel("d")
    ax.set_title(f"rank 0's window: [{window.d0}, {window.d1}) x [{window.h0}, {window.h1}) x "
                 f"[{window.w0}, {window.w1})", fontsize=10)
    side = fig.add_subplot(1, 2, 2)
    counts = [(KINDS[k], int((across == k).sum()), COLOURS[k]) for k in range(4)]
    side.barh([c[0] for c in counts], [c[1] for c in counts], color=[c[2] for c in counts])
    for y, (_, n, _) in enumerate(counts):
        side.text(n + 0.5, y, str(n), va="center")
    side.set_xlabel("cells of rank 0's window")
    side.set_title(f"zero padding (not drawn): {int((owner < 0).sum())} cells", fontsize=10)
    fig.suptitle("A 5x5x5 volume on depth=2 x height=2 x width=2 ranks, a 3x3x3 kernel with padding 1: "
                 "rank 0 receives 3 faces, 3 edges and 1 corner", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {KINDS[k]: n for k, n, _ in ((k, int((across == k).sum()), None) for k in range(4))}


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "halo3d.png")
    print(draw(out))
    print(out)
