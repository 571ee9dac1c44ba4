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
# # 5. Stationary-X: x stays, the partial y moves
#
# *2, then 4 ranks simulated in the notebook; the same function once under mpiexec.*
#
# Channel/filter parallelism splits the channel sum of tutorial 1 over a
# **channel group** of `P_c` ranks. Rank `i` owns a block `C_i` of the input
# channels and a block `F_i` of the output channels; activations are always
# split that way (`x` by `C`, `y` and `dy` by `F`). The three algorithms differ
# in which weights a rank holds, and so in what must move. Stationary-X keeps
# `x` in place: rank `i` holds **every** filter for its own channels,
# `w[:, C_i]`.
#
# Every algorithm module opens with its table of layouts and collectives:

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
import layer_job
import refconv.algorithms.stationary_x
from refconv import reference as ref
from refconv.distribution import block_range
from refconv.testing.asserts import assert_close

print(refconv.algorithms.stationary_x.__doc__)

# %% [markdown]
# ## 1. By hand, on two simulated ranks
#
# Stationary-X written out with nothing but the reference convolution and two
# collectives of `refconv.collectives`, run by `refconv.simulated.run` on 2
# simulated ranks: threads of this notebook, each with its own communicator
# (tutorial 3 introduced them). `stationary_x_by_hand` is what each rank runs;
# `comm.rank` is `i`, and a rank keeps only its own blocks.
#
# Forward: the local convolution of `x[:, C_i]` with `w[:, C_i]` sums over
# `C_i` only, a **partial** `y` over all `F`. A **reduce-scatter** adds the
# partials and leaves `y[:, F_i]` on rank `i`; the bias is added after it, so it
# is counted once. Backward: an **allgather** of `dy[:, F_i]` gives every rank
# all of `dy`, and then `dw[:, C_i]` and `dx[:, C_i]` are local.

# %%
from refconv import collectives, simulated

N, C, F, H, W, K = 4, 6, 10, 8, 8, 3
geometry = dict(padding=1)
x, w, b, dy = (numpy.random.default_rng(0).standard_normal(s) for s in [(N, C, H, W), (F, C, K, K), (F,), (N, F, H, W)])


def stationary_x_by_hand(comm, x, w, b, dy):
    P_c, i = comm.size, comm.rank
    F_counts = [numpy.diff(block_range(F, P_c, j))[0] for j in range(P_c)]   # F_j of every rank: [5, 5]
    cs, fs = slice(*block_range(C, P_c, i)), slice(*block_range(F, P_c, i))
    x_loc = x[:, cs]                                                       # (N, C_i, H, W)
    w_loc = w[:, cs]                                                       # (F, C_i, K, K), the X shard
    dy_loc = dy[:, fs]                                                     # (N, F_i, H, W)

    y_part = ref.conv2d_forward(x_loc, w_loc, **geometry)                  # (N, F, H, W), partial over C
    y_loc = collectives.reduce_scatter(comm, y_part, F_counts, axis=1)     # (N, F_i, H, W), summed over ranks
    y_loc = y_loc + b[fs].reshape(1, -1, 1, 1)
    dy_full = collectives.allgather(comm, dy_loc, F_counts, axis=1)        # (N, F, H, W) on every rank
    dw_loc = ref.conv2d_backward_filter(x_loc, dy_full, w_loc.shape, **geometry)   # (F, C_i, K, K)
    dx_loc = ref.conv2d_backward_data(dy_full, w_loc, x_loc.shape, **geometry)     # (N, C_i, H, W)
    return y_loc, dx_loc, dw_loc


P_c = 2
by_hand = simulated.run(stationary_x_by_hand, P_c, args=(x, w, b, dy))

y, dx = ref.conv2d_forward(x, w, b, **geometry), ref.conv2d_backward_data(dy, w, x.shape, **geometry)
dw = ref.conv2d_backward_filter(x, dy, w.shape, **geometry)
for i, (y_loc, dx_loc, dw_loc) in enumerate(by_hand):
    cs, fs = slice(*block_range(C, P_c, i)), slice(*block_range(F, P_c, i))
    assert_close(y_loc, y[:, fs], reduction_length=C * K * K)
    assert_close(dx_loc, dx[:, cs], reduction_length=F * K * K)
    assert_close(dw_loc, dw[:, cs], reduction_length=N * H * W)
print("Stationary-X by hand on 2 simulated ranks matches the reference: y[:, F_i], dx[:, C_i], dw[:, C_i]")

# %% [markdown]
# The moving tensor has the **output's** size: the reduce-scatter takes a full
# `N x F x H' x W'` buffer on each rank, and so does the allgather. X is
# therefore cheap for layers whose output is smaller than their input
# (`F h' w' < C h w`). This layer grows (6 -> 10 channels), so X is the
# expensive choice here; tutorial 6 runs Stationary-Y on the same layer.
#
# ## 2. On four ranks
#
# `layer_job.run` runs `layer_job.run_cases` (open `layer_job.py`: about 40
# lines) on 4 simulated ranks. It builds `refconv.DistConv2d` for each grid we
# ask for, records every collective with `CommStats`, and checks `y, dx, dw,
# db` against the reference with `refconv.testing.check.check_layer`. Two
# grids: all 4 ranks in the channel group, and `sample=2 x channel=2`.
# Tutorials 6 to 8 run it too.

# %%
PROBLEM = dict(N=N, C=C, F=F, H=H, W=W, K=K, padding=1)
CASES = [dict(grid=dict(channel=4), algorithm="stationary-x"),
         dict(grid=dict(sample=2, channel=2), algorithm="stationary-x")]
cases = layer_job.run(PROBLEM, CASES)
for case in cases:
    layer_job.show_ranks(case)

# %% [markdown]
# The same function runs on real MPI ranks: `course.under_mpiexec` writes
# `run_cases`'s own source into a job file and launches it with
# `mpiexec -n 4 python -m mpi4py`. Every rank records the same calls, with the
# same shapes, as its simulated twin.

# %%
real = layer_job.gathered(CASES, course.under_mpiexec(layer_job.run_cases, args=(PROBLEM, CASES)))
assert real == cases
print("under mpiexec: the same shapes and calls on every rank of both grids")

# %% [markdown]
# ## 3. Reading the numbers against the table
#
# Per rank, with `n` local samples and float64 (8 bytes): the reduce-scatter
# and the allgather each carry `m = n F h' w'` values over the channel group
# (`q = P_c`), and the weight gradient `dw[:, C_i]` (`F C_i Kh Kw` values) and
# `db[F_i]` are allreduced among the **weight peers**, the `P / P_c` ranks that
# hold the same shard. On `channel=4` every rank is its own only peer: the
# allreduce is recorded with `q=1` and moves nothing. We derive every record
# from those formulas and compare with what CommStats measured.

# %%
def expected_x(grid, coords):
    P_N, P_c = grid.get("sample", 1), grid.get("channel", 1)
    s, i = coords[0], coords[1]
    n = numpy.diff(block_range(N, P_N, s))[0]
    C_i, F_i = numpy.diff(block_range(C, P_c, i))[0], numpy.diff(block_range(F, P_c, i))[0]
    peers = 4 // P_c
    return [["reduce_scatter", P_c, n * F * H * W * 8], ["allgather", P_c, n * F * H * W * 8],
            ["allreduce", peers, F * C_i * K * K * 8], ["allreduce", peers, F_i * 8]]


for case in cases:
    for info in case["ranks"]:
        measured = [[k, q, nb] for k, q, _, nb in info["records"]]
        assert measured == expected_x(case["grid"], info["coords"]), (measured, case["grid"])
print("every record matches the formulas of the Stationary-X table")

# %%
fig, (left, mid, right) = plt.subplots(1, 3, figsize=(12, 3.4))
owner = numpy.zeros((F, C))
for i in range(4):
    owner[:, slice(*block_range(C, 4, i))] = i
left.imshow(owner, cmap="tab10", vmin=0, vmax=9)
left.set_xlabel("input channel c")
left.set_ylabel("filter f")
left.set_title("w[:, C_i] on channel=4: rank = colour", fontsize=10)
course.plot_bytes(mid, [info["records"] for info in cases[0]["ranks"]], "channel=4 (allreduce over q=1 left out)")
course.plot_bytes(right, [info["records"] for info in cases[1]["ranks"]], "sample=2 x channel=2")
fig.tight_layout()
course.show(fig, "weight-owners-and-bytes")

# %% [markdown]
# On `sample=2 x channel=2` each collective carries half a batch over half as
# many ranks, and the weight gradient is allreduced for real between the two
# ranks that share a shard: the **segmented allreduce** (tutorial 7 counts it).
#
# ## Checks

# %%
x_case, mixed = cases
assert all(info["w_loc"][0] == F for info in x_case["ranks"])             # every filter, own channels
assert [info["w_loc"][1] for info in x_case["ranks"]] == [2, 2, 1, 1]       # C = 6 over 4: uneven blocks
rs = [r for r in x_case["ranks"][0]["records"] if r[0] == "reduce_scatter"][0]
assert rs[3] == N * F * H * W * 8                                           # the output's size moves
print("tutorial 5: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Write Stationary-X's forward and backward yourself, from the table at the
#   top of this page, and let the checker draw uneven splits for it:
#   [Stationary-X](exercises/05_stationary_x.md).
# - Write the closed form of every record of section 3 for any grid, and check
#   it against `records()`: [predict the
#   bytes](exercises/09_predict_the_bytes.md).
