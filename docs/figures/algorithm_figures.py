"""Draw the layouts and collectives of each distributed-convolution algorithm.

    python docs/figures/algorithm_figures.py [OUTDIR]     (default: this script's directory)

writes ``spatial.png``, ``stationary_x.png``, ``stationary_y.png`` and
``stationary_w.png``.  Nothing is hand-placed: which rank holds which channel,
filter or pixel is read from the objects the layer itself uses
(:class:`refconv.distribution.Distribution` with each algorithm's
``weight_dims``, and :class:`refconv.halo.Halo`), and the communicator of each
collective is the set of ranks whose held blocks the collective joins.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from refconv.distribution import Distribution  # noqa: E402
from refconv.halo import Halo  # noqa: E402
from refconv.algorithms.spatial import SampleSpatial  # noqa: E402
from refconv.algorithms.stationary_w import StationaryW  # noqa: E402
from refconv.algorithms.stationary_x import StationaryX  # noqa: E402
from refconv.algorithms.stationary_y import StationaryY  # noqa: E402

COLOURS = plt.get_cmap("tab10").colors
CELL = 0.42          # side of one channel cell in the channel figures
GAP = 2.9            # room between two panels for an arrow and its label


# ------------------------------------------------------------------ channel algorithms
def channel_layouts(algorithm_class, C, F, P_c, filter_groups=None):
    """Per rank of the channel group: the channel ranges of every tensor the algorithm touches.

    ``x_loc``/``y_loc`` come from the activations' layout; the channels the local
    convolution reads (``conv_in``) and writes (``conv_out``) are the weight
    shard's C and F pieces, from ``algorithm_class.weight_dims``.
    """
    grid_shape = (1, P_c, 1, 1)          # a channel group on its own is enough to lay out blocks
    x = Distribution.activations(grid_shape, (1, C, 1, 1))
    y = Distribution.activations(grid_shape, (1, F, 1, 1))
    w = Distribution(grid_shape, (F, C, 1, 1), algorithm_class.weight_dims(P_c, filter_groups),
                     names=("F", "C", "Kh", "Kw"))
    ranks = range(P_c)
    return {
        "x_loc": [x.pieces(r, 1) for r in ranks],
        "y_loc": [y.pieces(r, 1) for r in ranks],
        "conv_in": [w.pieces(r, 1) for r in ranks],   # channels of x the local conv reads
        "conv_out": [w.pieces(r, 0) for r in ranks],  # filters of y it writes (partial unless conv_in is all of C)
        "weight": w,
    }


def groups_of(held):
    """Ranks holding identical blocks after a gather (or before a reduce-scatter): its communicators."""
    by_blocks = {}
    for r, pieces in enumerate(held):
        by_blocks.setdefault(tuple(pieces), []).append(r)
    return sorted(by_blocks.values())


def _group_text(groups):
    if len(groups) == 1:
        return "{" + ",".join(map(str, groups[0])) + "}\n(the channel group)"
    return " ".join("{" + ",".join(map(str, g)) + "}" for g in groups)


def holder_panel(ax, x0, length, held, title, partial=False, symbol="c"):
    """A ``length x P_c`` table at ``x0``: cell (channel, rank) filled when the rank holds it.

    Returns the panel's right edge.  ``partial`` hatches the cells: a partial sum
    still to be reduced across ranks.
    """
    P = len(held)
    for r, pieces in enumerate(held):
        for s, e in pieces:
            ax.add_patch(Rectangle((x0 + r * CELL, -e * CELL), CELL, (e - s) * CELL,
                                   facecolor=COLOURS[r], alpha=0.45 if partial else 0.8,
                                   hatch="///" if partial else None, edgecolor="black", lw=0.8))
    for i in range(length + 1):
        ax.plot([x0, x0 + P * CELL], [-i * CELL] * 2, color="0.75", lw=0.4, zorder=0)
    for r in range(P):
        ax.text(x0 + (r + 0.5) * CELL, 0.12, f"r{r}", ha="center", va="bottom", fontsize=7)
    for i in range(length):
        ax.text(x0 - 0.06, -(i + 0.5) * CELL, f"{symbol}{i}", ha="right", va="center", fontsize=6)
    ax.text(x0 + P * CELL / 2, 0.55, title, ha="center", va="bottom", fontsize=8.5)
    return x0 + P * CELL


def arrow(ax, x0, x1, y, label, colour="black"):
    ax.annotate("", xy=(x1 - 0.4, y), xytext=(x0 + 0.1, y),
                arrowprops=dict(arrowstyle="->", lw=1.4, color=colour))
    ax.text((x0 + x1 - 0.3) / 2, y + 0.12, label, ha="center", va="bottom", fontsize=7.5, color=colour,
            wrap=True)


def flow_row(ax, steps, height):
    """Draw ``steps`` left to right: (length, held, title, partial, symbol) panels joined by arrows.

    Between two panels, the arrow's label is the collective that turns one into the
    other (given in ``steps`` as a string).
    """
    x, prev_end = 0.4, None
    pending = None
    for step in steps:
        if isinstance(step, str):
            pending = step
            continue
        length, held, title, partial, symbol = step
        if prev_end is not None:
            x = prev_end + GAP
            colour = "black" if pending.startswith("local") else "tab:red"
            arrow(ax, prev_end, x, -height / 2, pending, colour)
        prev_end = holder_panel(ax, x, length, held, title, partial, symbol)
    ax.set_xlim(-0.2, prev_end + 0.3)
    ax.set_ylim(-height - 0.3, 1.2)
    ax.set_aspect("equal")
    ax.axis("off")


def collective(before, after, kind, what):
    """Label of the collective between two holder tables; checks that it really is one."""
    if before == after:
        return f"local {what}"
    groups = groups_of(after if kind == "allgather" else before)
    return f"{kind}\nover {_group_text(groups)}"


def weight_panel(ax, w, C, F, title):
    """``w`` as an F x C matrix: every piece of each rank's shard, labelled with the rank."""
    P = w.grid_shape[1]
    for r in range(P):
        for f0, f1 in w.pieces(r, 0):
            for c0, c1 in w.pieces(r, 1):
                ax.add_patch(Rectangle((c0, -f1), c1 - c0, f1 - f0, facecolor=COLOURS[r], alpha=0.8,
                                       edgecolor="black", lw=1.2))
                ax.text((c0 + c1) / 2, -(f0 + f1) / 2, f"r{r}", ha="center", va="center", fontsize=9,
                        weight="bold")
    for c in range(C + 1):
        ax.plot([c, c], [0, -F], color="white", lw=0.4)
    for f in range(F + 1):
        ax.plot([0, C], [-f, -f], color="white", lw=0.4)
    ax.set_xticks([c + 0.5 for c in range(C)], [f"c{c}" for c in range(C)], fontsize=7)
    ax.set_yticks([-f - 0.5 for f in range(F)], [f"f{f}" for f in range(F)], fontsize=7)
    ax.xaxis.tick_top()
    ax.set_xlim(0, C)
    ax.set_ylim(-F, 0)
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=9, pad=22)
    for side in ax.spines.values():
        side.set_visible(False)


def _flow(layouts, dims, labels, op, partial):
    """The steps of one pass: ``a -> allgather -> b -> op -> c -> reduce-scatter -> d`` (a
    collective between equal layouts draws as "stays"); forward and backward mirror each other."""
    (a, b, c, d), ((n_in, k_in), (n_out, k_out)) = layouts, dims
    first, read, made, last, moved, summed, over = labels
    return [(n_in, a, first, False, k_in),
            collective(a, b, "allgather", f"({moved} stays)"),
            (n_in, b, read, False, k_in),
            op,
            (n_out, c, made + (f"\n(partial over {over})" if partial else ""), partial, k_out),
            collective(c, d, "reduce-scatter", f"({summed} complete)"),
            (n_out, d, last, False, k_out)]


def channel_figure(path, algorithm_class, title, dims_label, C=9, F=7, P_c=4, filter_groups=None, note=""):
    L = channel_layouts(algorithm_class, C, F, P_c, filter_groups)
    w = L["weight"]
    full_C, full_F = [[(0, C)]] * P_c, [[(0, F)]] * P_c
    y_partial = L["conv_in"] != full_C          # the local conv summed over only some channels
    dx_partial = L["conv_out"] != full_F        # backward-data summed over only some filters
    forward = _flow((L["x_loc"], L["conv_in"], L["conv_out"], L["y_loc"]), ((C, "c"), (F, "f")),
                    ("x[:, C_i]", "x read by the\nlocal conv", "y from the local conv", "y[:, F_i]", "x", "y", "C"),
                    "local conv\nwith w shard", y_partial)
    backward = _flow((L["y_loc"], L["conv_out"], L["conv_in"], L["x_loc"]), ((F, "f"), (C, "c")),
                     ("dy[:, F_i]", "dy read by the\nlocal backward", "dx from backward-data", "dx[:, C_i]", "dy",
                      "dx", "F"), "local backward-data\n(dw is local too)", dx_partial)
    fig = plt.figure(figsize=(15, 7.6))
    gs = fig.add_gridspec(2, 2, width_ratios=[1, 3.6], hspace=0.25, wspace=0.08)
    weight_panel(fig.add_subplot(gs[:, 0]), w, C, F,
                 f"w (F={F} x C={C}): the shard of each rank\nweight dims: {dims_label}")
    height = max(C, F) * CELL
    for k, (steps, name) in enumerate([(forward, "forward"), (backward, "backward")]):
        ax = fig.add_subplot(gs[k, 1])
        flow_row(ax, steps, height)
        ax.set_title(name, fontsize=10, loc="left")
    fig.suptitle(title, fontsize=12)
    fig.text(0.5, 0.012, note + "After backward: dw, db are allreduced among the weight peers (the "
             "segmented allreduce: ranks with the same channel coordinate;\nwith sample or spatial splits "
             "too, each of the P_c peer sets allreduces its own shard; in this figure P = P_c, so each set "
             "is one rank).", ha="center", fontsize=9, color="tab:red")
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ spatial
class RankOnly:
    """A stand-in communicator for :class:`Halo`: its constructor only asks for the rank."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size


def conv_out(length, k, s, p, d):
    return (length + 2 * p - d * (k - 1) - 1) // s + 1


def halo_of(grid_hw, in_hw, kernel, stride, padding, dilation, rank=0):
    out_hw = tuple(conv_out(L, k, s, p, d) for L, k, s, p, d in zip(in_hw, kernel, stride, padding, dilation))
    return Halo(RankOnly(rank, grid_hw[0] * grid_hw[1]), grid_hw, in_hw, out_hw, kernel, stride, padding, dilation)


def spatial_panel(ax, halo, in_hw, r, title):
    """Owned blocks coloured by rank; rank ``r``'s window dashed, with the piece it receives from each owner."""
    H, W = in_hw
    ax.add_patch(Rectangle((0, 0), W, H, fill=False, lw=2, edgecolor="black"))
    for s, box in enumerate(halo.owned):
        ax.add_patch(Rectangle((box.w0, box.h0), box.w1 - box.w0, box.h1 - box.h0, facecolor=COLOURS[s],
                               alpha=0.3, edgecolor=COLOURS[s], lw=1))
        ax.text(box.w0 + 0.1, box.h0 + 0.1, f"r{s}: {box.h1 - box.h0}x{box.w1 - box.w0}",
                ha="left", va="top", fontsize=7.5, weight="bold")
    win = halo.window[r]
    for s, own in enumerate(halo.owned):        # what r receives from s: s's block inside r's window
        piece = own.intersect(win)
        if piece is None or s == r:
            continue
        ax.add_patch(Rectangle((piece.w0, piece.h0), piece.w1 - piece.w0, piece.h1 - piece.h0,
                               fill=False, hatch="...", edgecolor=COLOURS[s], lw=0))
        ax.text((piece.w0 + piece.w1) / 2, (piece.h0 + piece.h1) / 2,
                f"{piece.h1 - piece.h0}x{piece.w1 - piece.w0} from r{s}", ha="center", va="center",
                fontsize=7, bbox=dict(facecolor="white", alpha=0.85, lw=0, pad=1))
    ax.add_patch(Rectangle((win.w0, win.h0), win.w1 - win.w0, win.h1 - win.h0, fill=False, lw=2.4,
                           linestyle="--", edgecolor="black"))
    ax.text(win.w0, win.h1 + 0.15, f"window of r{r}: rows [{win.h0}, {win.h1}), cols [{win.w0}, {win.w1})",
            ha="left", va="top", fontsize=7.5, bbox=dict(facecolor="white", alpha=0.85, lw=0, pad=1))
    lo_h, hi_h = min(win.h0, 0) - 0.5, max(win.h1, H) + 1.3
    lo_w, hi_w = min(win.w0, 0) - 0.5, max(win.w1, W) + 0.5
    ax.set_xlim(lo_w, hi_w)
    ax.set_ylim(hi_h, lo_h)     # row 0 at the top
    ax.set_aspect("equal")
    ax.set_xticks(range(0, W + 1, 2))
    ax.set_yticks(range(0, H + 1, 2))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("W (columns)", fontsize=8)
    ax.set_ylabel("H (rows)", fontsize=8)
    ax.set_title(title, fontsize=9)


def spatial_figure(path):
    assert SampleSpatial.weight_dims(1) == (None, None, None, None)  # weights replicated
    fig, axes = plt.subplots(1, 3, figsize=(15, 6.2), gridspec_kw=dict(width_ratios=[1, 1, 0.55]))
    in_hw, k, d, p = (11, 9), (3, 3), (2, 2), (2, 2)
    halo = halo_of((2, 2), in_hw, k, (1, 1), p, d)
    for ax, r in zip(axes[:2], (0, 3)):
        spatial_panel(ax, halo, in_hw, r,
                      f"H x W = {in_hw[0]} x {in_hw[1]} on height 2 x width 2 (uneven blocks);\n"
                      f"3x3 conv, dilation 2, padding 2: rank {r}'s window")
    in_hw2 = (9, 4)
    halo2 = halo_of((4, 1), in_hw2, (3, 1), (1, 1), (3, 0), (3, 1))
    reach = [sum(o.intersect(w) is not None for o in halo2.owned) for w in halo2.window]
    spatial_panel(axes[2], halo2, in_hw2, 1,
                  f"H = 9 on height 4; Kh = 3,\ndilation 3, padding 3: rank 1's\n"
                  f"window spans {reach[1]} owners")
    fig.suptitle("Spatial parallelism: halo exchange (forward) · halo return (backward-data) · "
                 "allreduce of dw", fontsize=12)
    fig.text(0.5, 0.02, "dashed: the input rows and columns a rank's outputs read (outside the image: zeros). "
             "The dotted pieces are received from their owners (refconv.halo.Halo.extend);\n"
             "in backward-data the same pieces of dx go back to their owners and are added (Halo.reduce). "
             "Weights are replicated: dw, db are allreduced over all ranks.", ha="center", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ entry point
def main(outdir=None):
    """Write the four figures into ``outdir`` (default: this directory); return their paths."""
    outdir = outdir or os.path.dirname(os.path.abspath(__file__))
    os.makedirs(outdir, exist_ok=True)
    paths = {name: os.path.join(outdir, f"{name}.png")
             for name in ("spatial", "stationary_x", "stationary_y", "stationary_w")}
    spatial_figure(paths["spatial"])
    channel_figure(paths["stationary_x"], StationaryX,
                   "Stationary-X on a channel group of P_c = 4 (C = 9, F = 7: uneven blocks): "
                   "x stays, partial y moves", '(None, "channel", None, None): w[:, C_i]')
    channel_figure(paths["stationary_y"], StationaryY,
                   "Stationary-Y on a channel group of P_c = 4 (C = 9, F = 7: uneven blocks): "
                   "y stays, x moves", '("channel", None, None, None): w[F_i, :]')
    channel_figure(paths["stationary_w"], StationaryW,
                   "Stationary-W, P_c = 4 = p_f 2 x p_c' 2 (C = 9, F = 7): w stays, x and y move; "
                   "rank i = a*p_c' + b holds w[F_a, C_b], C_b not contiguous",
                   "(Split.stationary_w_filters(4, 2),\n Split.stationary_w_channels(4, 2), None, None)",
                   filter_groups=2,
                   note="forward: allgather over the p_f ranks (., b), reduce-scatter over the p_c' ranks (a, .); "
                        "backward: the mirror pair.\n")
    return list(paths.values())


if __name__ == "__main__":
    for path in main(sys.argv[1] if len(sys.argv) > 1 else None):
        print(path)
