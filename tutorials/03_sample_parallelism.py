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
# # 3. Sample parallelism and the global weight-gradient allreduce
#
# *4 ranks, simulated in the notebook; then the same function under mpiexec.*
#
# The simplest way to split a layer: give each rank a block of the **samples**
# and a full copy of the weights. Forward and backward-data are then local,
# since each sample's `y` and `dx` depend only on that sample. Backward-filter
# is not: `dw[f, c] = sum_n x[n, c] * dy[n, f]` sums over *all* samples
# (tutorial 1, section 3), so each rank holds a **partial** `dw` over its own
# samples, and an **allreduce** over every rank finishes it. This is data
# parallelism, and its allreduce of the whole `dw` is what channel parallelism
# (tutorials 5-7) makes smaller.
#
# How the multi-rank cells work (all tutorials alike, see tutorials/README.md):
# what each rank does is an ordinary function of its communicator `comm`, and
# `refconv.simulated.run(fn, 4)` runs it on 4 **simulated ranks**: threads of
# this notebook, each with its own communicator that behaves as MPI's does. It
# returns what each rank returned, rank 0's first. You can read, edit and step
# through the function like any other cell (docs/debugging-ranks.md shows a
# debugger on one rank). Near the end, one cell runs the very same function on
# 4 real MPI processes with `mpiexec`, and compares.

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
import refconv
from refconv import collectives, simulated
from refconv import reference as ref
from refconv.testing.asserts import assert_close

# %% [markdown]
# ## What each rank runs
#
# Six samples over 4 ranks split 2, 2, 1, 1 (`numpy.array_split` blocks: uneven
# splits are normal in refconv). `refconv.scatter` sends each rank its block of
# `x` and `dy` from rank 0. The layer's collectives are recorded with
# `collectives.stats.recording()`. Before letting the layer finish, each rank
# also computes its own partial `dw` with the reference, to show what the
# allreduce adds up. Rank 0 gathers `y` and `dx` (the others get `None`).

# %%
N, C, F, H, W, K = 6, 3, 4, 6, 6, 3


def sample_parallel(comm):
    rng = numpy.random.default_rng(0)                  # the same draw on every rank
    x, w, b = rng.standard_normal((N, C, H, W)), rng.standard_normal((F, C, K, K)), rng.standard_normal(F)
    dy = rng.standard_normal((N, F, H, W))

    grid = refconv.ProcessGrid(comm, sample=comm.size)
    layer = refconv.DistConv2d(C, F, K, padding=1, grid=grid, input_shape=x.shape, backend="numpy",
                               dtype=numpy.float64)
    layer.set_global_parameters(w, b)                  # every rank holds all of w: sample parallelism replicates it
    x_loc = refconv.scatter(x if comm.rank == 0 else None, layer.input_distribution, grid)    # (n, C, H, W)
    dy_loc = refconv.scatter(dy if comm.rank == 0 else None, layer.output_distribution, grid)  # (n, F, H, W)

    with collectives.stats.recording() as region:
        y_loc = layer.forward(x_loc)                   # (n, F, H, W): local, no communication
        dx_loc = layer.backward(dy_loc)                # (n, C, H, W); dw, db allreduced over all ranks
    dw_mine = ref.conv2d_backward_filter(x_loc, dy_loc, w.shape, padding=1)   # my samples only
    dw, db = layer.global_parameter_grads()
    y = refconv.gather(y_loc, layer.output_distribution, grid)                # rank 0: (N, F, H, W)
    dx = refconv.gather(dx_loc, layer.input_distribution, grid)               # rank 0: (N, C, H, W)
    grid.free()
    return {"samples": x_loc.shape[0], "records": course.records(region), "dw_mine": dw_mine, "dw_layer": dw,
            "db": db, "y": y, "dx": dx, "x": x, "w": w, "b": b, "dy": dy}


ranks = simulated.run(sample_parallel, course.RANKS)
print(f"{len(ranks)} ranks: samples per rank {[r['samples'] for r in ranks]}")
for r, info in enumerate(ranks):
    print(f"  rank {r}: " + ", ".join(f"{k}(q={q}) {nb} bytes" for k, q, _, nb in info["records"]))

# %% [markdown]
# ## Checking the results against the reference
#
# `y` and `dx` were computed locally and gathered on rank 0; `dw` is the sum of
# the four partial `dw`s, and after the allreduce every rank holds that same sum.

# %%
x, w, b, dy = (ranks[0][k] for k in ("x", "w", "b", "dy"))
dw_ref = ref.conv2d_backward_filter(x, dy, w.shape, padding=1)
assert_close(ranks[0]["y"], ref.conv2d_forward(x, w, b, padding=1), reduction_length=C * K * K)
assert_close(ranks[0]["dx"], ref.conv2d_backward_data(dy, w, x.shape, padding=1), reduction_length=F * K * K)
assert_close(ranks[0]["db"], ref.conv2d_backward_bias(dy), reduction_length=N * H * W)
assert all(r["y"] is None for r in ranks[1:])                            # gathered on rank 0 only
assert_close(sum(r["dw_mine"] for r in ranks), dw_ref, reduction_length=N * H * W)   # the allreduce's sum
for r in ranks:
    assert_close(r["dw_layer"], dw_ref, reduction_length=N * H * W)      # on every rank
print("y, dx, db match; the partial dw's sum to dw, which every rank holds after the allreduce")

# %% [markdown]
# ## What moved
#
# Each rank made exactly two collectives: the allreduce of `dw` (`F C Kh Kw`
# values) and of `db` (`F`), over all 4 ranks. Their size does not depend on
# the batch at all: it is the size of the weights. A ring allreduce of `m`
# bytes over `q` ranks sends `2 (q-1)/q m` bytes from each rank
# (`docs/algorithms.md` section 4).

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
owner = numpy.repeat(numpy.arange(len(ranks)), [r["samples"] for r in ranks])
left.imshow(owner[None, :], cmap="tab10", vmin=0, vmax=9, aspect="auto")
for n, r in enumerate(owner):
    left.text(n, 0, f"n={n}\nrank {r}", ha="center", va="center", fontsize=8, color="white")
left.set_yticks([])
left.set_xticks([])
left.set_title("x split by samples: 6 over 4 ranks (2, 2, 1, 1)", fontsize=10)
course.plot_bytes(right, [r["records"] for r in ranks], "per rank: the allreduce of all of dw and db")
fig.tight_layout()
course.show(fig, "sample-split-and-bytes")

ring = [2 * (q - 1) / q * nb for k, q, _, nb in ranks[0]["records"]]
print(f"dw is {F * C * K * K} float64 values = {F * C * K * K * 8} bytes; each rank sends about "
      f"{sum(ring):.0f} bytes in ring allreduces, whatever the batch size")

# %% [markdown]
# ## One step's timeline: the allreduce blocking, and behind backward
#
# The allreduce of `dw` need not stop backward: `refconv train` starts each
# layer's allreduce the moment its `dw` is ready and waits for it only before the
# optimizer's step (`Model.set_overlap`, docs/parallel.md "Overlap"). The same
# MPI calls are made either way, so the sums are the same bits. Here 2 ranks
# train the digits CNN with the image rows split over them (so the halo
# overlaps too, and the allreduce of `dw` is over both), one step blocking and
# one overlapped.
#
# On a shared 2-core laptop the wall clock cannot show what overlap hides: a
# rank waits while the other gets the CPU. So these runs use the simulated
# world's **logical clock**: `simulated.run(..., machine="v100-edr")` prices every
# local convolution and every call from the built-in machine file of a V100
# cluster with EDR InfiniBand (the one `refconv plan` uses in tutorial 10), and
# a nonblocking call runs behind the compute that follows it until its wait.
# Each rank's result is then `(value, clock)`; `clock.events` holds every call's
# start, the moment the rank began to wait for it, and its end, in logical
# seconds, and `refconv.simulated.clock.report` sums per kind what was hidden
# and what the rank waited for (exposed).

# %%
from refconv import Model, train
from refconv.optim import SGD
from refconv.simulated.clock import report


def one_step(comm, overlap):
    model = Model.from_spec("digits-cnn", comm=comm, backend="numpy", seed=0, defaults={"grid": {"height": 2}})
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 16, 16)).astype(numpy.float32), rng.integers(0, 10, 8)
    optimizer = SGD(model.bind(x.shape), 0.1)
    model.set_overlap(overlap)
    return train.step(model, optimizer, x, y)


steps = {name: simulated.run(one_step, 2, args=(on,), machine="v100-edr")
         for name, on in (("blocking", False), ("overlap", True))}
colours = {"allreduce": "tab:blue", "halo": "tab:green"}
fig, ax = plt.subplots(figsize=(10, 3))
row = 0
for rank in range(2):
    for name, results in steps.items():
        _, clock = results[rank]
        ax.barh(row, clock.t * 1e3, color="0.9", height=0.8)
        for e in clock.events:
            if e["kind"] in colours:
                ax.barh(row, (e["ended"] - e["started"]) * 1e3, left=e["started"] * 1e3, color=colours[e["kind"]],
                        alpha=0.35, height=0.5)
                if e["ended"] > e["waited"]:                    # the part the rank waited for
                    ax.barh(row, (e["ended"] - e["waited"]) * 1e3, left=e["waited"] * 1e3,
                            color=colours[e["kind"]], height=0.5)
        ax.text(clock.t * 1e3, row, f" {clock.t * 1e3:.2f} ms", va="center", fontsize=8)
        row += 1
ax.set_yticks(range(row), [f"rank {r} {name}" for r in range(2) for name in steps])
ax.invert_yaxis()
ax.set_xlabel("logical ms (light: in flight; dark: the rank waits; grey: the step)")
ax.set_title("digits CNN, batch 8, height=2, one step priced on v100-edr", fontsize=10)
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()], labels=list(colours),
          fontsize=8, loc="lower right")
fig.tight_layout()
course.show(fig, "overlap-timeline")
for name, results in steps.items():
    calls = report([clock for _, clock in results])[0]["calls"]
    print(f"{name:9s} rank 0: " + ", ".join(f"{k} {v['calls']} calls, {v['hidden'] * 1e6:.0f} us hidden, "
                                           f"{v['waited'] * 1e6:.0f} us exposed"
                                           for k, v in calls.items() if k in colours))

# %% [markdown]
# Read it per rank: in the blocking rows the rank waits for its calls (dark):
# the halo entirely, the allreduces almost entirely; in the overlapped rows the gradient allreduces start during
# backward and run while the rank computes (light), and the halo exchange runs
# behind the interior of each convolution. Batch normalization's allreduces stay
# dark in both: the next operation needs their sums. The overlapped step is
# shorter by what it hid, and both steps compute the same loss, bit for bit.

# %%
for rank in range(2):
    (loss_b, blocking_clock), (loss_o, overlap_clock) = steps["blocking"][rank], steps["overlap"][rank]
    blocking, overlapped = blocking_clock.events, overlap_clock.events
    assert loss_b == loss_o                                            # the same sums
    assert not any(c["overlap"] for c in blocking)                     # nothing runs behind compute
    behind = [c for c in overlapped if c["overlap"]]
    assert {c["kind"] for c in behind} == {"allreduce", "halo"}        # gradients, and the halo
    assert all(c["started"] <= min(c["waited"], c["ended"]) for c in overlapped)
    assert sorted(c["kind"] for c in blocking) == sorted(c["kind"] for c in overlapped)  # the same calls
    assert overlap_clock.t < blocking_clock.t                          # what was hidden is off the step
    hidden_b, hidden_o = ({k: v["hidden"] for k, v in report([clock])[0]["calls"].items()}
                          for clock in (blocking_clock, overlap_clock))
    assert hidden_b["halo"] == 0 < hidden_o["halo"] and hidden_b["allreduce"] < hidden_o["allreduce"]
print("one step each: the same calls; with overlap on, the gradients' allreduces and the halo run behind compute")

# %% [markdown]
# ## The same function on real MPI ranks
#
# Nothing in `sample_parallel` knows it ran on threads. `course.under_mpiexec`
# writes the function's own source (with the imports and the constants it
# names) into a job file, runs it with `mpiexec -n 4 python -m mpi4py`, one
# process per rank, and reads back what each rank returned. The results agree
# with the simulated ones: the same calls on every rank, and the same numbers
# (an allreduce may add in another order under MPI, so within rounding).

# %%
course.print_job(sample_parallel)
real = course.under_mpiexec(sample_parallel)
for simulated_rank, real_rank in zip(ranks, real):
    assert real_rank["records"] == simulated_rank["records"] and real_rank["samples"] == simulated_rank["samples"]
    assert_close(real_rank["dw_layer"], simulated_rank["dw_layer"], reduction_length=N * H * W)
assert_close(real[0]["y"], ranks[0]["y"], reduction_length=C * K * K)
assert_close(real[0]["dx"], ranks[0]["dx"], reduction_length=F * K * K)
print("under mpiexec: the same calls and the same y, dx and dw on every rank")

# %% [markdown]
# ## Checks
#
# What this tutorial taught: sample parallelism moves nothing in forward and
# backward-data, and one allreduce of all of `dw` (and `db`) over every rank.

# %%
for r in ranks:
    assert [(k, q, m) for k, q, m, _ in r["records"]] == [("allreduce", 4, F * C * K * K), ("allreduce", 4, F)]
assert [r["samples"] for r in ranks] == [2, 2, 1, 1]
print("tutorial 3: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Say, for each gradient, which collective sample parallelism needs, then
#   write the backward on simulated ranks: [sample parallelism's
#   backward](exercises/02_sample_backward.md).
# - Predict the bytes of the allreduces above from the shapes alone, and check
#   your formula against `records()`: [predict the
#   bytes](exercises/09_predict_the_bytes.md).
