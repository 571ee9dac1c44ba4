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
# # 7. Stationary-W and the segmented allreduce
#
# *4 ranks, simulated in the notebook.*
#
# Stationary-X moves the output's size, Stationary-Y the input's, each over all
# `P_c` ranks of the channel group. Stationary-W factors the group,
# `P_c = p_f x p_c'`, keeps a **block of the weights** in place, `w[F_a, C_b]`,
# and runs *both* pairs of collectives, each over a smaller group. Then we count
# the bytes of the weight-gradient allreduce under each algorithm and see the
# paper's main saving: the **segmented allreduce** moves a `1/P_c` share of the
# weights, among `P / P_c` ranks.

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
import layer_job
import refconv.algorithms.stationary_w
from refconv.cost_model import layer_records
from refconv.distribution import Split, block_range

print(refconv.algorithms.stationary_w.__doc__)

# %% [markdown]
# ## 1. Who holds which weights
#
# With `P_c = 4` and `p_f = 2` (so `p_c' = 2`), channel coordinate `i = a p_c' + b`.
# Rank `(a, b)` holds the filters of ranks `(a, 0)` and `(a, 1)` (contiguous)
# and the input channels of ranks `(0, b)` and `(1, b)`: blocks `b` and `2 + b`,
# which are **not** contiguous. The distribution `Split`s of refconv say the
# same:

# %%
N, C, F, H, W, K = 4, 8, 8, 6, 6, 3
P_c, p_f = 4, 2
f_blocks = Split.stationary_w_filters(P_c, p_f).table(P_c)[1]
c_blocks = Split.stationary_w_channels(P_c, p_f).table(P_c)[1]
owner = numpy.full((F, C), -1)
for i in range(P_c):
    print(f"rank {i} (a, b) = {divmod(i, P_c // p_f)}: F blocks {f_blocks[i]}, C blocks {c_blocks[i]}")
    for fb in f_blocks[i]:
        for cb in c_blocks[i]:
            owner[slice(*block_range(F, P_c, fb)), slice(*block_range(C, P_c, cb))] = i

fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
for ax, (title, shard) in zip(axes, [("Stationary-X: w[:, C_i]", lambda f, c: c * P_c // C),
                                     ("Stationary-Y: w[F_i, :]", lambda f, c: f * P_c // F),
                                     (f"Stationary-W, p_f = {p_f}: w[F_a, C_b]", lambda f, c: owner[f, c])]):
    grid = numpy.array([[shard(f, c) for c in range(C)] for f in range(F)])
    ax.imshow(grid, cmap="tab10", vmin=0, vmax=9)
    for f in range(F):
        for c in range(C):
            ax.text(c, f, str(grid[f, c]), ha="center", va="center", fontsize=7, color="white")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("input channel c")
    ax.set_ylabel("filter f")
fig.suptitle("which rank of channel=4 holds each weight (F = C = 8)")
fig.tight_layout()
course.show(fig, "weight-blocks")

# %% [markdown]
# ## 2. On four ranks, with the weight-gradient allreduce counted
#
# Three grids of 4 simulated ranks, each run by `layer_job.run` (tutorial 5) and
# checked against the reference:
#
# - `sample=4` (`P_c = 1`): every rank holds all of `w`; one allreduce of all
#   of `dw` over the 4 ranks (tutorial 3);
# - `sample=2 x channel=2` with Stationary-X (`P_c = 2`);
# - `channel=4` with Stationary-W, `p_f = 2` (`P_c = 4`).

# %%
PROBLEM = dict(N=N, C=C, F=F, H=H, W=W, K=K, padding=1)
cases = layer_job.run(PROBLEM, [dict(grid=dict(sample=4), algorithm="stationary-x"),
                                 dict(grid=dict(sample=2, channel=2), algorithm="stationary-x"),
                                 dict(grid=dict(channel=4), algorithm="stationary-w", filter_groups=p_f)])
layer_job.show_ranks(cases[2])

# %% [markdown]
# Under W each rank made two allgathers and two reduce-scatters over 2 ranks
# each, instead of one pair over 4: the `x` pair over the `p_f` ranks `(., b)`
# (`n C_b h w` values) and the `y` pair over the `p_c'` ranks `(a, .)`
# (`n F_a h' w'`).
#
# Now the weight gradient. Take the first allreduce of each rank (`dw`; the
# second is `db`) and compare its buffer with the size of all of `w`:

# %%
w_bytes = F * C * K * K * 8
rows = []
for case in cases:
    P_c_case = case["grid"].get("channel", 1)
    dw_call = [r for r in case["ranks"][0]["records"] if r[0] == "allreduce"][0]
    _, q, _, nbytes = dw_call
    ring = 2 * (q - 1) / q * nbytes                          # bytes a rank sends in a ring allreduce
    rows.append((P_c_case, q, nbytes, ring))
    print(f"P_c = {P_c_case}: dw allreduce buffer {nbytes:5d} bytes = w / {w_bytes // nbytes} "
          f"over q = {q} weight peers; ring traffic per rank {ring:6.0f} bytes")

# %% [markdown]
# The buffer is `|w| / P_c`: each rank allreduces only its own shard. And it
# is allreduced among `q = P / P_c` weight peers, not all `P` ranks: `P_c`
# independent allreduces run side by side, one per shard. On 4 ranks with
# `P_c = 4` there is nobody left to reduce with (`q = 1`), so nothing moves;
# the price was paid in activations instead.
#
# On a bigger machine the effect is easier to see. The cost model predicts
# the same calls for any grid (`refconv.cost_model.layer_records`, checked
# against CommStats in the test suite); here the ring traffic of the weight
# gradient for P = 64 ranks, a ResNet-like 3x3 layer with 256 channels, and
# the channel group growing from 1 to 16:

# %%
P = 64
big = dict(in_shape=(64, 256, 14, 14), out_channels=256, kernel=(3, 3))
P_cs = [1, 2, 4, 8, 16]
ring_per_rank = []
for pc in P_cs:
    calls = layer_records("stationary-x", big["in_shape"], big["out_channels"], big["kernel"], padding=(1, 1),
                          grid_shape=(P // pc, pc, 1, 1), itemsize=4)
    ring_per_rank.append(sum(c.wire_bytes for c in calls if c.kind == "allreduce"))

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
left.bar([str(r[0]) for r in rows], [r[2] for r in rows], label="buffer (CommStats)")
left.bar([str(r[0]) for r in rows], [r[3] for r in rows], width=0.4, label="ring traffic per rank")
left.set_xlabel("P_c on 4 ranks (measured)")
left.set_ylabel("bytes of the dw allreduce")
left.legend(fontsize=8)
right.plot(P_cs, numpy.array(ring_per_rank) / 1e6, "o-")
right.set_xscale("log", base=2)
right.set_xlabel(f"P_c on P = {P} ranks (cost model)")
right.set_ylabel("MB sent per rank, dw + db allreduce")
right.set_title("256 -> 256 channels, 3x3: the segmented allreduce", fontsize=10)
fig.tight_layout()
course.show(fig, "segmented-allreduce")

# %% [markdown]
# ## Checks
#
# The segmented allreduce's buffer is exactly `|w| / P_c` here (every split is
# even), its communicator has `P / P_c` ranks, and the traffic falls with `P_c`.

# %%
for P_c_case, q, nbytes, ring in rows:
    assert nbytes * P_c_case == w_bytes and q == 4 // P_c_case
assert rows[0][3] > rows[1][3] > rows[2][3] == 0
w_ranks = cases[2]["ranks"]
assert all(info["w_loc"][:2] == [F // p_f, C // (P_c // p_f)] for info in w_ranks)      # w[F_a, C_b]: 4 x 4
activation_calls = [r for r in w_ranks[0]["records"] if r[0] != "allreduce"]
assert [r[1] for r in activation_calls] == [p_f, P_c // p_f, P_c // p_f, p_f]  # two pairs, smaller groups
assert all(a > b for a, b in zip(ring_per_rank, ring_per_rank[1:]))
print("tutorial 7: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Write Stationary-W with its two pairs of collectives:
#   [Stationary-W](exercises/07_stationary_w.md).
# - Say which ranks form each group of the segmented allreduce, and what each
#   sums: [the segmented allreduce](exercises/08_segmented_allreduce.md).
