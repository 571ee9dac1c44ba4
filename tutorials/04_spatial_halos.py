# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Spatial parallelism and halos
#
# *One process, then 4 ranks simulated in the notebook, and the same function under mpiexec.*
#
# Spatial parallelism splits the image height (and/or width) over ranks. A
# rank's output rows read input rows that other ranks own: its **halo**. This
# tutorial computes, for every rank, which rows it owns and which rows its
# outputs read, first with plain arithmetic, then simulates the halo exchange
# and its adjoint by hand in one process, and finally runs it, and a whole
# layer, on 4 simulated ranks (and once, unchanged, on 4 MPI processes). Last,
# a volume split over 8 ranks (depth x height x width), by hand in one process:
# the halo gains edges and corners.
#
# Specification: `docs/algorithms.md` section 3. Code: `refconv/halo.py` and the
# sample/spatial algorithm module. Reference page: `docs/spatial.md`.

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
import refconv
from refconv import reference as ref
from refconv.distribution import block_range
from refconv.halo import halo_geometry, input_window
from refconv.testing.asserts import assert_close

# %% [markdown]
# ## 1. Owned rows and the window a rank reads
#
# Input rows `H` and output rows `H'` are each split in `numpy.array_split`
# blocks over the same `P_H` ranks. A rank that computes output rows
# `[o0, o1)` reads the input rows
#
#     [o0*s - p,  (o1 - 1)*s - p + d*(K - 1) + 1)
#
# (`refconv.halo.input_window`). The window may begin before row 0 or end past
# the image: those rows are zero padding, and nobody sends them.

# %%
def show(H, P_H, K, s, p, d):
    Ho = (H + 2 * p - d * (K - 1) - 1) // s + 1
    print(f"H = {H}, H' = {Ho}, K = {K}, stride {s}, padding {p}, dilation {d}")
    for r in range(P_H):
        h0, h1 = block_range(H, P_H, r)            # input rows rank r owns
        o0, o1 = block_range(Ho, P_H, r)           # output rows rank r computes
        lo, hi = input_window(o0, o1, K, s, p, d)  # input rows they read
        print(f"  rank {r}: owns [{h0:2d}, {h1:2d})  computes [{o0}, {o1})  reads [{lo:2d}, {hi:2d})"
              f"  halo above {max(h0 - lo, 0)}, below {max(hi - h1, 0)}")
    return Ho


show(H=11, P_H=4, K=3, s=1, p=1, d=1)

# %% [markdown]
# That is the textbook halo: `d (K-1) / 2 = 1` row on each side. Now the layer
# this tutorial uses: stride 2, dilation 3, padding 2.

# %%
H, W, K, P_H = 11, 7, 3, 4
Ho = show(H=H, P_H=P_H, K=K, s=2, p=2, d=3)

# %% [markdown]
# The halo now differs from rank to rank and side to side. Stride 2 splits the
# 5 output rows 2, 1, 1, 1 while the 11 input rows split 3, 3, 3, 2, so a
# rank's output block does not sit over its input block. Rank 0 reads 4 rows
# below its own, more than rank 1 owns: its halo **reaches past the nearest
# neighbour** into rank 2. So never assume "one row from each neighbour":
# compute the windows. `refconv.halo.halo_geometry` does it for every rank of
# a `P_H x P_W` group at once (pure arithmetic, no MPI), as `Box`es of rows
# `h0:h1` and columns `w0:w1`:

# %%
Wo = (W + 2 * 2 - 3 * (K - 1) - 1) // 2 + 1                       # 3 output columns
owned, window = halo_geometry((P_H, 1), (H, W), (Ho, Wo), (K, K), (2, 2), (2, 2), (3, 3))
senders = {r: [q for q in range(P_H) if q != r and owned[q].intersect(window[r]) is not None] for r in range(P_H)}
for r in range(P_H):
    print(f"rank {r}: owns rows {owned[r].h0}..{owned[r].h1 - 1}, window rows {window[r].h0}..{window[r].h1 - 1};"
          f" receives from {senders[r]}")

# %%
fig, ax = plt.subplots(figsize=(8, 3.2))
colors = plt.get_cmap("tab10")
for r in range(P_H):
    win = window[r]
    ax.barh(r, win.h1 - win.h0, left=win.h0, height=0.7, color="none", edgecolor="k", ls="--")
    for q in range(P_H):                                          # the window, coloured by who owns each row
        piece = owned[q].intersect(win)
        if piece is not None:
            ax.barh(r, piece.h1 - piece.h0, left=piece.h0, height=0.5, color=colors(q),
                    alpha=1.0 if q == r else 0.45, label=f"rows of rank {q}" if q == r else None)
ax.axvspan(-3, 0, color="0.9")
ax.axvspan(H, H + 3, color="0.9")
ax.set_yticks(range(P_H), [f"rank {r}" for r in range(P_H)])
ax.set_xlabel("input row (grey: zero padding)")
ax.set_title("each rank's window (dashed); solid: its own rows, faded: its halo, coloured by owner", fontsize=10)
ax.invert_yaxis()
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
course.show(fig, "halo-windows")

# %% [markdown]
# ## 2. The exchange, simulated in one process
#
# Each rank builds its window from the pieces the ranks own inside it, zeros
# elsewhere, then convolves the window with **`padding=0`**: the result is
# exactly its block of `y`. In refconv this is `Halo.extend` followed by the
# local convolution. Backward-data runs the exchange in reverse (`Halo.reduce`,
# the adjoint): each rank computes `dx` for its whole window, and every piece
# goes back to its owner, which **adds** it to its own gradient.

# %%
N, C, F = 2, 3, 4
geometry = dict(stride=2, padding=2, dilation=3)
rng = numpy.random.default_rng(0)
x, w = rng.standard_normal((N, C, H, W)), rng.standard_normal((F, C, K, K))
y = ref.conv2d_forward(x, w, **geometry)                            # (N, F, H', W')
dy = rng.standard_normal(y.shape)
x_loc = [x[:, :, o.h0:o.h1, o.w0:o.w1] for o in owned]             # x_loc[r]: (N, C, h_r, W)


def extend(r):
    """Rank r's window: the pieces its peers own inside it, zeros elsewhere."""
    win = window[r]
    x_win = numpy.zeros((N, C) + win.shape)                         # (N, C, h_win, w_win)
    for q, own in enumerate(owned):                                 # q sends own ∩ win (q = r: a local copy)
        piece = own.intersect(win)
        if piece is not None:
            x_win[(..., *piece.slices(win))] = x_loc[q][(..., *piece.slices(own))]
    return x_win


x_win = [extend(r) for r in range(P_H)]
dx_loc = [numpy.zeros_like(xl) for xl in x_loc]
for r in range(P_H):
    o0, o1 = block_range(Ho, P_H, r)
    y_loc = ref.conv2d_forward(x_win[r], w, stride=2, dilation=3)              # padding=0 on the window
    assert_close(y_loc, y[:, :, o0:o1], reduction_length=C * K * K)
    dx_win = ref.conv2d_backward_data(dy[:, :, o0:o1], w, x_win[r].shape, stride=2, dilation=3)
    for q, own in enumerate(owned):                                 # send each piece home, add it there
        piece = own.intersect(window[r])
        if piece is not None:
            dx_loc[q][(..., *piece.slices(own))] += dx_win[(..., *piece.slices(window[r]))]
dx = ref.conv2d_backward_data(dy, w, x.shape, **geometry)
for q, own in enumerate(owned):
    assert_close(dx_loc[q], dx[:, :, own.h0:own.h1], reduction_length=F * K * K)
print("forward: each window, convolved with padding=0, gives its rows of y")
print("backward: halo contributions summed at their owners give dx")

# %% [markdown]
# ## 3. On four ranks
#
# Now the real thing, on 4 simulated ranks (threads of this notebook, each with
# its own communicator; tutorial 3 explains them). The function below is what
# every rank runs. It builds the `Halo` of the real height group
# (`grid.sub_comm(("height", "width"))` of a `height=4` grid), runs
# `Halo.extend` on the real blocks, compares each window with the zero-padded
# global `x`, and returns the halo bytes `CommStats` recorded, to compare with
# the pieces it planned to send. Then it runs `DistConv2d` forward and backward
# on that grid and compares `y`, `dx`, `dw`, `db` with the reference through
# `refconv.testing.check.check_layer`, which raises on every rank on a mismatch.
# It uses the problem of section 2: `N, C, F, H, W, K`, stride 2, padding 2,
# dilation 3.

# %%
from refconv import collectives, simulated
from refconv.halo import Halo
from refconv.testing.asserts import collective_assert_close
from refconv.testing.check import check_layer
from refconv.testing.strategies import ConvProblem


def halo_on_ranks(comm):
    x = numpy.random.default_rng(0).standard_normal((N, C, H, W))   # the same global x on every rank
    grid = refconv.ProcessGrid(comm, height=4)
    spatial = grid.sub_comm(("height", "width"))               # the halo group, ranked h * P_W + w
    halo = Halo(spatial, (grid.P_H, grid.P_W), (H, W), (Ho, Wo), (K, K), (2, 2), (2, 2), (3, 3))
    me = spatial.Get_rank()
    own, win = halo.owned[me], halo.window[me]

    x_loc = x[:, :, own.h0:own.h1, own.w0:own.w1]              # (N, C, h, W)
    with collectives.stats.recording() as region:
        x_win = halo.extend(x_loc, numpy)                      # (N, C, h_win, w_win)
    x_padded = numpy.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)))  # zeros outside the image (4 >= any overhang)
    collective_assert_close(comm, x_win, x_padded[:, :, win.h0 + 4:win.h1 + 4, win.w0 + 4:win.w1 + 4],
                            name=f"rank {me}'s window")

    problem = ConvProblem(N=N, C=C, F=F, H=H, W=W, Kh=K, Kw=K, stride=(2, 2), padding=(2, 2), dilation=(3, 3))
    layer = refconv.DistConv2d(C, F, K, stride=2, padding=2, dilation=3, grid=grid, backend="numpy",
                               dtype=numpy.float64, input_shape=(N, C, H, W))
    with collectives.stats.recording() as layer_region:
        check_layer(layer, problem)                            # y, dx, dw, db against the reference, every rank
    grid.free()
    return {"window": [win.h0, win.h1], "extend": course.records(region),
            "layer": [r for r in course.records(layer_region) if r[0] == "halo"]}


ranks = simulated.run(halo_on_ranks, course.RANKS)
for r, info in enumerate(ranks):
    print(f"rank {r}: window rows {info['window']}, sent {info['extend'][0][3]} halo bytes")
print("every window equals the zero-padded x; DistConv2d on height=4 matches the reference")

# %% [markdown]
# The bytes are what each rank **sends** (CommStats records halo messages as
# bytes sent to other ranks). Rank 2 sends the most: row 6 to rank 0 and rows
# 6..8 to ranks 1 and 3. Uneven halos mean uneven traffic. We can predict every
# number from the geometry alone. `DistConv2d` sends these pieces in forward,
# and in backward-data each rank returns what it *received*: the `dx` of the
# halo rows in its window goes home to their owners.

# %%
def halo_rows(sender, receiver):
    piece = owned[sender].intersect(window[receiver])
    return 0 if piece is None or sender == receiver else piece.shape[0]


row_bytes = N * C * W * 8                                            # one float64 row of every sample and channel
sent = [sum(halo_rows(r, q) for q in range(P_H)) * row_bytes for r in range(P_H)]
received = [sum(halo_rows(q, r) for q in range(P_H)) * row_bytes for r in range(P_H)]
print("planned, forward (sent)          :", sent)
print("recorded by Halo.extend          :", [info["extend"][0][3] for info in ranks])
print("planned, backward-data (returned):", received)

# %% [markdown]
# ## 4. A volume over 8 ranks: faces, edges and corners
#
# A 3-D convolution (`refconv.DistConv3d`) splits a volume over depth, height and width:
# `ProcessGrid(comm, depth=2, height=2, width=2)` on 8 ranks. The window is the same
# formula along each axis, and `refconv.halo.halo_plan` cuts it into pieces that are
# planes of one block by rows of another by columns of a third. So a rank receives its
# face neighbours' slabs, the edges of the ranks diagonally across two axes, and the
# corner of the rank across all three. Simulated in one process, as in section 2: every
# rank's window is assembled from the pieces, convolved locally with no padding, and
# the output blocks together are the serial convolution of the whole volume.

# %%
from refconv.halo import exchanges, halo_plan

grid3, size3, kernel3 = (2, 2, 2), (5, 6, 5), (3, 3, 3)      # blocks of 3 and 2 cells (3 and 3 in height)
x3 = numpy.random.default_rng(3).standard_normal((1, 2) + size3)
w3 = numpy.random.default_rng(4).standard_normal((3, 2) + kernel3)
y3_ref = ref.conv3d_forward(x3, w3, padding=1)
owned3, window3, pieces3 = halo_plan(grid3, size3, size3, kernel3, (1, 1, 1), (1, 1, 1), (1, 1, 1))
y3 = numpy.zeros_like(y3_ref)
kinds = numpy.zeros((8, 3), dtype=int)                       # per rank: cells received from faces, edges, corners
for r in range(8):
    win = window3[r]
    x_win = numpy.zeros((1, 2) + win.shape)                  # zero padding where no rank owns a cell
    for owner, piece in [(owner, piece) for (owner, to), piece in pieces3.items() if to == r]:  # r's own part too
        block = x3[(slice(None), slice(None)) + tuple(slice(a, b) for a, b in zip(owned3[owner].lo, owned3[owner].hi))]
        x_win[piece.window_index()] = block[piece.owned_index()]
        across = sum(numpy.array(numpy.unravel_index(owner, grid3)) != numpy.unravel_index(r, grid3))
        if across:
            kinds[r, across - 1] += numpy.prod(piece.shape)
    own = owned3[r]                                          # stride 1, 'same' padding: output block = input block
    y3[(slice(None), slice(None)) + tuple(slice(a, b) for a, b in zip(own.lo, own.hi))] = ref.conv3d_forward(x_win, w3)
assert_close(y3, y3_ref, reduction_length=2 * 27)
fig, ax = plt.subplots(figsize=(7, 3))
bottom = numpy.zeros(8)
for k, (name, colour) in enumerate((("faces", "tab:blue"), ("edges", "tab:orange"), ("corner", "tab:red"))):
    ax.bar(range(8), kinds[:, k], bottom=bottom, label=name, color=colour)
    bottom += kinds[:, k]
ax.set_xlabel("rank (d*4 + h*2 + w)")
ax.set_ylabel("halo cells received")
ax.set_title("a 5x6x5 volume on 2x2x2 ranks, 3x3x3 kernel: every rank is a corner block")
ax.legend()
course.show(fig, "volume-halo-cells")
print("cells received per rank (faces, edges, corner):", kinds.tolist())

# %% [markdown]
# ## The same function on real MPI ranks
#
# `course.under_mpiexec` runs `halo_on_ranks`, unchanged, on 4 MPI processes
# (`mpiexec -n 4 python -m mpi4py`): the same windows, and the same halo
# messages, byte for byte.

# %%
real = course.under_mpiexec(halo_on_ranks)
assert real == ranks
print("under mpiexec: every rank returned what its simulated twin returned")

# %% [markdown]
# ## Checks

# %%
assert [info["window"] for info in ranks] == [[window[r].h0, window[r].h1] for r in range(P_H)]
assert [info["extend"][0][3] for info in ranks] == sent
assert [[nb for *_, nb in info["layer"]] for info in ranks] == [[s, r] for s, r in zip(sent, received)]
assert owned[2].intersect(window[0]) is not None                     # rank 0's halo reaches rank 2
assert all(len(exchanges(pieces3, r)[1]) == 7 for r in range(8))    # 3 faces, 3 edges, 1 corner each
assert kinds[0].tolist() == [3 * 3 + 3 * 3 + 3 * 3, 3 + 3 + 3, 1]   # rank 0's 3x3x3 block, one layer a side
print("tutorial 4: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Compute the windows of section 1 yourself for any geometry and uneven
#   blocks: [output and halo arithmetic](exercises/01_halo_arithmetic.md).
# - Write the exchange of section 2 on simulated ranks, with uneven shards: [a
#   1-D halo exchange](exercises/03_halo_1d.md); then with corners in 2-D (and,
#   as a bonus, edges and corners in 3-D): [a 2-D
#   halo](exercises/04_halo_2d.md).
