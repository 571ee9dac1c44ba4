"""Draw the 2x2x2 grid (sample x channel x height, 8 ranks): channel groups and weight peers.

    python docs/figures/grid_figure.py [OUT.png]        (default: docs/figures/grid.png)
"""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from refconv.commands import plot  # noqa: E402


def rank_of(n, c, h, P_c=2, P_H=2):
    return (n * P_c + c) * P_H + h          # ProcessGrid's row-major layout (P_W = 1)


def draw(path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, title, group in [
        (axes[0], "channel groups (same n, h; vary c)", lambda n, c, h: n * 2 + h),
        (axes[1], "weight peers (same c; vary n, h)", lambda n, c, h: c),
    ]:
        for n in range(2):
            for c in range(2):
                for h in range(2):
                    x, y = n * 2.6 + c, 1 - h
                    g = group(n, c, h)
                    ax.add_patch(plt.Rectangle((x, y), 0.9, 0.9, color=colours[g], alpha=0.35))
                    ax.text(x + 0.45, y + 0.45, f"rank {rank_of(n, c, h)}\n(n{n}, c{c}, h{h})",
                            ha="center", va="center", fontsize=9)
        for n in range(2):
            ax.text(n * 2.6 + 0.95, 2.05, f"sample n={n}", ha="center", fontsize=10)
            for c in range(2):
                ax.text(n * 2.6 + c + 0.45, -0.2, f"c={c}", ha="center", fontsize=9)
        ax.text(-0.25, 1.45, "h=0", ha="right", va="center", fontsize=9)
        ax.text(-0.25, 0.45, "h=1", ha="right", va="center", fontsize=9)
        ax.set_xlim(-0.8, 5.3)
        ax.set_ylim(-0.5, 2.4)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=11)
    fig.suptitle("ProcessGrid(sample=2, channel=2, height=2): rank = (n*P_c + c)*P_H + h; "
                 "one colour = one communicator", fontsize=10)
    plot.save(fig, path)


if __name__ == "__main__":
    plot.figure_script(draw, os.path.join(os.path.dirname(__file__), "grid.png"))
