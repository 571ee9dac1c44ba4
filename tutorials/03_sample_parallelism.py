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
# *4 MPI ranks, launched from the notebook.*
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
# a cell holds a small script, `course.run_on_ranks` launches it with
# `mpiexec -n 4 python -m mpi4py`, rank 0 saves its results to a file, and the
# notebook loads and checks them.

# %%
import matplotlib.pyplot as plt
import numpy

import course
from refconv import reference as ref
from refconv.testing.asserts import assert_close

# %% [markdown]
# ## The script each rank runs
#
# Six samples over 4 ranks split 2, 2, 1, 1 (`numpy.array_split` blocks: uneven
# splits are normal in refconv). `refconv.scatter` sends each rank its block of
# `x` and `dy` from rank 0. The layer's collectives are recorded with
# `collectives.stats.recording()`. Before letting the layer finish, each rank
# also computes its own partial `dw` with the reference, to show what the
# allreduce adds up.

# %%
SCRIPT = """
import json, sys
import numpy
from mpi4py import MPI
import refconv
import course
from refconv import collectives, reference as ref

comm = MPI.COMM_WORLD
N, C, F, H, W, K = 6, 3, 4, 6, 6, 3
rng = numpy.random.default_rng(0)                  # the same draw on every rank
x, w, b = rng.standard_normal((N, C, H, W)), rng.standard_normal((F, C, K, K)), rng.standard_normal(F)
dy = rng.standard_normal((N, F, H, W))

grid = refconv.ProcessGrid(comm, sample=comm.size)
layer = refconv.DistConv2d(C, F, K, padding=1, grid=grid, input_shape=x.shape, backend="numpy", dtype=numpy.float64)
layer.set_global_parameters(w, b)                  # every rank holds all of w: sample parallelism replicates it
x_loc = refconv.scatter(x if comm.rank == 0 else None, layer.input_distribution, grid)   # (n, C, H, W)
dy_loc = refconv.scatter(dy if comm.rank == 0 else None, layer.output_distribution, grid) # (n, F, H, W)

with collectives.stats.recording() as region:
    y_loc = layer.forward(x_loc)                   # (n, F, H, W): local, no communication
    dx_loc = layer.backward(dy_loc)                # (n, C, H, W); dw, db allreduced over all ranks
dw_mine = ref.conv2d_backward_filter(x_loc, dy_loc, w.shape, padding=1)   # my samples only
dw, db = layer.global_parameter_grads()

per_rank = comm.gather({"samples": x_loc.shape[0], "records": course.records(region),
                        "dw_mine": dw_mine.tolist(), "dw_layer": dw.tolist()})
y = refconv.gather(y_loc, layer.output_distribution, grid)
dx = refconv.gather(dx_loc, layer.input_distribution, grid)
if comm.rank == 0:
    numpy.savez(sys.argv[1] + "/result.npz", x=x, w=w, b=b, dy=dy, y=y, dx=dx, db=db)
    json.dump(per_rank, open(sys.argv[1] + "/ranks.json", "w"))
    print(f"{comm.size} ranks: samples per rank {[r['samples'] for r in per_rank]}")
    for r, info in enumerate(per_rank):
        print(f"  rank {r}: " + ", ".join(f"{k}(q={q}) {nb} bytes" for k, q, _, nb in info["records"]))
grid.free()
"""
job = course.run_on_ranks(SCRIPT)
arrays, ranks = job.arrays(), job.json("ranks.json")

# %% [markdown]
# ## Checking the results against the reference
#
# `y` and `dx` were computed locally and gathered; `dw` is the sum of the four
# partial `dw`s, and after the allreduce every rank holds that same sum.

# %%
x, w, b, dy = (arrays[k] for k in ("x", "w", "b", "dy"))
N, C, H, W = x.shape
F, K = w.shape[0], w.shape[2]
dw_ref = ref.conv2d_backward_filter(x, dy, w.shape, padding=1)
assert_close(arrays["y"], ref.conv2d_forward(x, w, b, padding=1), reduction_length=C * K * K)
assert_close(arrays["dx"], ref.conv2d_backward_data(dy, w, x.shape, padding=1), reduction_length=F * K * K)
assert_close(arrays["db"], ref.conv2d_backward_bias(dy), reduction_length=N * H * W)
partials = [numpy.array(r["dw_mine"]) for r in ranks]
assert_close(sum(partials), dw_ref, reduction_length=N * H * W)          # the allreduce's sum
for r in ranks:
    assert_close(numpy.array(r["dw_layer"]), dw_ref, reduction_length=N * H * W)   # on every rank
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
# overlaps too, and the allreduce of `dw` is over both), and record one step of each under
# `collectives.stats.timeline()`: when each call started, when the rank began to
# wait for it, and when it finished. `refconv.bench.overlap.write_timeline`,
# which the overlap benchmark also uses, records and draws them.

# %%
TIMELINE = """
import json, sys
import numpy
from mpi4py import MPI
from refconv import Model, train
from refconv.bench.overlap import write_timeline
from refconv.optim import SGD

comm = MPI.COMM_WORLD
model = Model.from_spec("digits-cnn", comm=comm, backend="numpy", seed=0,
                        defaults={"grid": {"height": 2}})
rng = numpy.random.default_rng(0)
x, y = rng.standard_normal((8, 1, 16, 16)).astype(numpy.float32), rng.integers(0, 10, 8)
optimizer = SGD(model.bind(x.shape), 0.1)
write_timeline(comm, model, lambda: train.step(model, optimizer, x, y), sys.argv[1] + "/timeline.json",
               "digits CNN, batch 8, height=2")
"""
job = course.run_on_ranks(TIMELINE, ranks=2)
timeline = job.json("timeline.json")
fig, ax = plt.subplots(figsize=(10, 5))
ax.imshow(plt.imread(job.folder / "timeline.png"))
ax.axis("off")
fig.tight_layout()

# %% [markdown]
# Read it per rank: in the blocking rows every call is waited for the moment it
# starts (dark); in the overlapped rows the gradient allreduces start during
# backward and run while the rank computes (light), and the halo exchange runs
# behind the interior of each convolution. Batch normalization's allreduces stay
# dark in both: the next operation needs their sums. On a shared 2-core laptop
# much of a step is dark (a rank waits while the other gets the CPU), and the
# rows' lengths are noise, not a speedup (docs/benchmarks.md, "Overlap").

# %%
for rank in timeline["ranks"]:
    blocking, overlapped = rank["blocking"]["calls"], rank["overlap"]["calls"]
    assert not any(c["overlap"] for c in blocking)                     # nothing runs behind compute
    behind = [c for c in overlapped if c["overlap"]]
    assert {c["kind"] for c in behind} == {"allreduce", "halo"}        # gradients, and the halo
    assert all(c["started"] <= c["waited"] <= c["ended"] for c in overlapped)
    assert sorted(c["kind"] for c in blocking) == sorted(c["kind"] for c in overlapped)  # the same calls
print("one step each: the same calls; with overlap on, the gradients' allreduces and the halo run behind compute")

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
