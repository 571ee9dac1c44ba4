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
# # 6. Stationary-Y: y stays, x moves
#
# *2, then 4 ranks simulated in the notebook.*
#
# Stationary-Y is the mirror image of Stationary-X (tutorial 5). Rank `i` holds
# **every** input channel for its own filters: its weight shard is `w[F_i, :]`.
# Forward gathers all of `x`; backward-data sums over `f`, which rank `i` has
# only a block of, so it produces a partial `dx` that a reduce-scatter
# finishes. The activations sit exactly as under X (`x` by `C`, `y` by `F`), so
# consecutive layers may use different algorithms without moving anything
# between them.

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
import layer_job
import refconv.algorithms.stationary_y
from refconv import reference as ref
from refconv.cost_model import layer_records
from refconv.distribution import block_range
from refconv.testing.asserts import assert_close

print(refconv.algorithms.stationary_y.__doc__)

# %% [markdown]
# ## 1. By hand, on two simulated ranks
#
# The same layer as tutorial 5, on the same 2 simulated ranks with the same two
# collectives of `refconv.collectives`, the other way round.

# %%
from refconv import collectives, simulated

N, C, F, H, W, K = 4, 6, 10, 8, 8, 3
geometry = dict(padding=1)
x, w, b, dy = (numpy.random.default_rng(0).standard_normal(s) for s in [(N, C, H, W), (F, C, K, K), (F,), (N, F, H, W)])


def stationary_y_by_hand(comm, x, w, b, dy):
    P_c, i = comm.size, comm.rank
    C_counts = [numpy.diff(block_range(C, P_c, j))[0] for j in range(P_c)]   # C_j of every rank: [3, 3]
    cs, fs = slice(*block_range(C, P_c, i)), slice(*block_range(F, P_c, i))
    x_loc = x[:, cs]                                                       # (N, C_i, H, W)
    w_loc = w[fs]                                                          # (F_i, C, K, K): the Y shard
    dy_loc = dy[:, fs]                                                     # (N, F_i, H, W)

    x_full = collectives.allgather(comm, x_loc, C_counts, axis=1)          # (N, C, H, W) on every rank
    y_loc = ref.conv2d_forward(x_full, w_loc, b[fs], **geometry)           # (N, F_i, H, W)
    dw_loc = ref.conv2d_backward_filter(x_full, dy_loc, w_loc.shape, **geometry)   # (F_i, C, K, K)
    dx_part = ref.conv2d_backward_data(dy_loc, w_loc, x.shape, **geometry)         # (N, C, H, W), partial over F
    dx_loc = collectives.reduce_scatter(comm, dx_part, C_counts, axis=1)   # (N, C_i, H, W), summed over ranks
    return y_loc, dx_loc, dw_loc


P_c = 2
by_hand = simulated.run(stationary_y_by_hand, P_c, args=(x, w, b, dy))
for i, (y_loc, dx_loc, dw_loc) in enumerate(by_hand):
    cs, fs = slice(*block_range(C, P_c, i)), slice(*block_range(F, P_c, i))
    assert_close(y_loc, ref.conv2d_forward(x, w, b, **geometry)[:, fs], reduction_length=C * K * K)
    assert_close(dx_loc, ref.conv2d_backward_data(dy, w, x.shape, **geometry)[:, cs], reduction_length=F * K * K)
    assert_close(dw_loc, ref.conv2d_backward_filter(x, dy, w.shape, **geometry)[fs], reduction_length=N * H * W)
print("Stationary-Y by hand on 2 simulated ranks matches the reference: y[:, F_i], dx[:, C_i], dw[F_i, :]")

# %% [markdown]
# Now the **input's** size moves (`N x C x H x W`), in the allgather forward and
# the reduce-scatter backward. Y is the cheap choice for layers that grow
# (`C h w < F h' w'`), like this one.
#
# ## 2. X against Y on four ranks, on a growing and a shrinking layer
#
# `layer_job.run` (tutorial 5) runs four checked layers on 4 simulated ranks,
# `channel=4`: X and Y on the layer above (6 -> 10 channels) and on its mirror
# (10 -> 6).

# %%
GROWS = dict(N=N, C=6, F=10, H=H, W=W, K=K, padding=1)
SHRINKS = dict(N=N, C=10, F=6, H=H, W=W, K=K, padding=1)
cases = {}
for label, problem in (("grows", GROWS), ("shrinks", SHRINKS)):
    ran = layer_job.run(problem, [dict(grid=dict(channel=4), algorithm=a) for a in ("stationary-x", "stationary-y")])
    cases[label] = {case["algorithm_used"]: case for case in ran}
layer_job.show_ranks(cases["grows"]["stationary-y"])


def channel_bytes(case, rank=0):
    """Bytes of the allgathers and reduce-scatters one rank made (the channel collectives)."""
    return sum(nb for k, q, _, nb in case["ranks"][rank]["records"] if k in ("allgather", "reduce_scatter"))


for label, problem in (("grows", GROWS), ("shrinks", SHRINKS)):
    x_size, y_size = problem["N"] * problem["C"] * H * W * 8, problem["N"] * problem["F"] * H * W * 8
    print(f"{label:8s} x: {x_size} bytes, y: {y_size} bytes;  channel collectives per rank:"
          f" X {channel_bytes(cases[label]['stationary-x'])}, Y {channel_bytes(cases[label]['stationary-y'])}")

# %% [markdown]
# Each algorithm moves its tensor twice (once forward, once backward): X the
# output's size `n F h' w'`, Y the input's `n C h w`. So Y wins when the layer
# grows and X when it shrinks. The cost model (`refconv.cost_model.layer_records`)
# predicts the same calls from the algorithm modules' tables, for any shape,
# so we can sweep the filter count without running anything and put the two
# measured layers on the curve.

# %%
Fs = numpy.arange(2, 17)
predicted = {a: [sum(c.bytes for c in layer_records(a, (N, 6, H, W), f, (K, K), padding=(1, 1), grid_shape=(1, 4, 1, 1),
                                                    itemsize=8) if c.kind in ("allgather", "reduce_scatter"))
                 for f in Fs] for a in ("stationary-x", "stationary-y")}
fig, ax = plt.subplots(figsize=(7, 3.4))
for a, style in (("stationary-x", "-"), ("stationary-y", "--")):
    ax.plot(Fs, predicted[a], style, label=f"{a} (cost model)")
ax.plot([10], [channel_bytes(cases["grows"]["stationary-x"])], "o", color="C0", label="measured, X (F = 10)")
ax.plot([10], [channel_bytes(cases["grows"]["stationary-y"])], "s", color="C1", label="measured, Y (F = 10)")
ax.axvline(6, color="0.6", lw=0.8)
ax.text(6.2, max(predicted["stationary-x"]) * 0.9, "F = C: the crossover", fontsize=8)
ax.set_xlabel("filters F (C = 6 input channels, channel=4)")
ax.set_ylabel("bytes per rank, allgather + reduce-scatter")
ax.legend(fontsize=8)
fig.tight_layout()
course.show(fig, "x-against-y-bytes")

# %% [markdown]
# ## Checks

# %%
grows_y = cases["grows"]["stationary-y"]
assert [info["w_loc"][:2] for info in grows_y["ranks"]] == [[3, 6], [3, 6], [2, 6], [2, 6]]   # w[F_i, :]
assert channel_bytes(cases["grows"]["stationary-y"]) < channel_bytes(cases["grows"]["stationary-x"])
assert channel_bytes(cases["shrinks"]["stationary-x"]) < channel_bytes(cases["shrinks"]["stationary-y"])
assert channel_bytes(grows_y) == 2 * N * 6 * H * W * 8                    # the input's size, twice
assert predicted["stationary-y"][list(Fs).index(10)] == channel_bytes(grows_y)   # model == measurement
print("tutorial 6: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Write Stationary-Y from its table, forward and backward:
#   [Stationary-Y](exercises/06_stationary_y.md).
# - Replace the allgather of `x` with broadcasts, one channel block at a time (a
#   SUMMA-style Y), from an empty file to a passing `check_layer` at 2 to 5
#   ranks: [your own decomposition](exercises/12_your_own_decomposition.md).
