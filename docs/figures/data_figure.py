"""Draw what each rank reads of a global batch (left) and the prefetch timeline (right).

    python docs/figures/data_figure.py [OUT.png]        (default: docs/figures/data.png)

The blocks come from refconv's own layout (:func:`blocks`: a model's input Distribution on
a sample=2 x height=2 grid), not drawn by hand.
"""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from refconv.commands import plot  # noqa: E402
from refconv.distribution import Distribution  # noqa: E402

BATCH, C, H, W = 4, 1, 8, 8
GRID = (2, 1, 2, 1)                                       # P_N, P_c, P_H, P_W
COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red"]


def blocks(grid=GRID, shape=(BATCH, C, H, W)):
    """Per rank: its (samples, rows, columns) ranges of the batch, as refconv reads them."""
    d = Distribution(grid, shape, ("sample", "channel", "height", "width"))
    out = []
    for rank in range(grid[0] * grid[1] * grid[2] * grid[3]):
        (n0, n1), = d.pieces(rank, 0)
        (h0, h1), = d.pieces(rank, 2)
        (w0, w1), = d.pieces(rank, 3)
        out.append(((n0, n1), (h0, h1), (w0, w1)))
    return out


def draw(path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1.25, 1]})
    store = [17, 3, 42, 8]                                 # the batch's sample numbers in the store
    for rank, ((n0, n1), (h0, h1), (w0, w1)) in enumerate(blocks()):
        for n in range(n0, n1):
            x0 = n * (W + 2)
            left.add_patch(plt.Rectangle((x0 + w0, H - h1), w1 - w0, h1 - h0, color=COLOURS[rank], alpha=0.45))
            left.text(x0 + (w0 + w1) / 2, H - (h0 + h1) / 2, f"rank {rank}", ha="center", va="center", fontsize=8)
    for n in range(BATCH):
        x0 = n * (W + 2)
        left.add_patch(plt.Rectangle((x0, 0), W, H, fill=False, lw=1.2))
        left.text(x0 + W / 2, H + 0.6, f"batch[{n}] = sample {store[n]}", ha="center", fontsize=8)
    left.set_xlim(-1, BATCH * (W + 2))
    left.set_ylim(-1.2, H + 2)
    left.set_aspect("equal")
    left.axis("off")
    left.set_title("sample=2 x height=2: each rank reads only its samples' rows\n"
                   "(memory-mapped .npy or HDF5 hyperslabs); nothing else is read", fontsize=10)
    left.text(0, -1, "the global batch (same order on every rank: seed, epoch) never exists in memory", fontsize=8)

    right.add_patch(plt.Rectangle((0, 0), 0.9, 0.7, color="tab:orange", alpha=0.5))
    right.text(0.45, 0.35, "read 0", ha="center", va="center", fontsize=8)
    for k in range(4):                                     # step k trains while the thread reads block k+1
        start = k * 3 + 0.9
        right.add_patch(plt.Rectangle((start, 1), 2.8, 0.7, color="tab:blue", alpha=0.5))
        right.text(start + 1.4, 1.35, f"step {k}", ha="center", va="center", fontsize=9)
        right.add_patch(plt.Rectangle((start, 0), 1.3, 0.7, color="tab:orange", alpha=0.5))
        right.text(start + 0.65, 0.35, f"read {k + 1}", ha="center", va="center", fontsize=8)
    right.text(-0.3, 1.35, "training", ha="right", va="center", fontsize=9)
    right.text(-0.3, 0.35, "prefetch\nthread", ha="right", va="center", fontsize=9)
    right.set_xlim(-2.2, 13.2)
    right.set_ylim(-0.8, 2.4)
    right.axis("off")
    right.set_title("--prefetch 1: block k+1 is read while step k trains;\n"
                    "held at most: prefetch + 1 blocks, reused", fontsize=10)
    plot.save(fig, path)


if __name__ == "__main__":
    plot.figure_script(draw, os.path.join(os.path.dirname(__file__), "data.png"))
