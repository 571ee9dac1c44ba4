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
# # 2. Numba CUDA kernels, from naive to tiled
#
# *One process, no GPU needed: the kernels run under Numba's CUDA simulator.*
#
# Tutorial 1 wrote the convolution as loops and as a matrix product. This one
# writes it as CUDA kernels, in the order llm.c teaches them:
#
# 1. **naive**: one thread per output element, the loops of tutorial 1 inside;
# 2. **shared-memory tiles**: a block of threads loads a tile of each operand
#    once into shared memory and every thread of the block reuses it;
# 3. **register micro-tiles**: each thread computes a small square of outputs,
#    so every value it loads from shared memory feeds several multiply-adds.
#
# Each version is checked against the serial reference before anything else.
# Then we run the library's own kernels (`refconv.kernels`, versions 1 and 2)
# for all three passes. On a machine with a GPU, the last section times them
# against cuDNN; without one it says so and skips.
#
# The simulator runs every CUDA thread as a Python thread: correct, and very
# slow, so the shapes here are tiny (a few hundred threads per launch).
# `refconv.kernels` runs a block's threads one at a time, in index order, each
# handing over at `syncthreads` (kernels/simulator.py): a launch gives the same
# result every run, and a missing barrier shows up every run too.
# `NUMBA_ENABLE_CUDASIM=1` must be set **before numba is first imported**;
# if you run this notebook in a kernel that already imported numba, restart it.

# %%
import os
import sys

from refconv import arrays

ON_GPU = arrays.gpu_available()                     # a real CUDA device that CuPy can use
if not ON_GPU:
    assert "numba" not in sys.modules, "numba was imported before the simulator was chosen: restart the kernel"
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import math

import matplotlib.pyplot as plt
import numpy
from numba import cuda

from tutorials import course
import refconv.kernels
from refconv import reference as ref
from refconv.arrays import to_host
from refconv.testing.asserts import assert_close

xp = arrays.device_module()                         # CuPy on a GPU, NumPy under the simulator
print("running on", "a GPU" if ON_GPU else "the CUDA simulator (no GPU)")

N, C, F, H, W, K = 1, 2, 6, 5, 5, 3                  # padding 1: H' = H, W' = W
geometry = dict(padding=1)
rng = numpy.random.default_rng(0)
x = rng.standard_normal((N, C, H, W))                # x: (N, C, H, W)
w = rng.standard_normal((F, C, K, K))                # w: (F, C, Kh, Kw)
y_ref = ref.conv2d_forward(x, w, **geometry)         # y: (N, F, H', W')

# %% [markdown]
# ## 1. Naive: one thread per output
#
# `cuda.grid(1)` is this thread's global index: `blockIdx.x * blockDim.x +
# threadIdx.x`. The launch covers `y.size` outputs with
# `ceil(y.size / THREADS)` blocks, so the last block is partial and every
# thread first checks that its index is in range (the **bounds guard**). It
# then unravels the flat index into `(n, f, oh, ow)` and runs the channel and
# tap loops of tutorial 1.

# %%
THREADS_1D = 32


@cuda.jit
def conv_naive(x, w, y, padding):
    index = cuda.grid(1)
    if index >= y.size:                              # the last block is partial
        return
    _, C, H, W = x.shape
    F, _, Kh, Kw = w.shape
    Ho, Wo = y.shape[2], y.shape[3]
    n, rest = index // (F * Ho * Wo), index % (F * Ho * Wo)
    f, rest = rest // (Ho * Wo), rest % (Ho * Wo)
    oh, ow = rest // Wo, rest % Wo
    acc = 0.0
    for c in range(C):
        for i in range(Kh):
            for j in range(Kw):
                ih, iw = oh - padding + i, ow - padding + j
                if 0 <= ih < H and 0 <= iw < W:
                    acc += x[n, c, ih, iw] * w[f, c, i, j]
    y[n, f, oh, ow] = acc


def launch_1d(size):
    """(blocks, threads) for one thread per element: ceil-division, never a loop over gridDim."""
    return math.ceil(size / THREADS_1D), THREADS_1D


y_dev = xp.zeros((N, F, H, W))
blocks, threads = launch_1d(y_dev.size)
conv_naive[blocks, threads](xp.asarray(x), xp.asarray(w), y_dev, 1)
assert_close(to_host(y_dev), y_ref, reduction_length=C * K * K)
print(f"naive: {blocks} blocks x {threads} threads for {y_dev.size} outputs; matches the reference")

# %% [markdown]
# Which block computes which output? Thread `t` owns `y.flat[t]`, so blocks
# own consecutive runs of the flattened output: whole rows of one filter's
# output map, then the next filter's.

# %%
owner = (numpy.arange(y_ref.size) // THREADS_1D).reshape(F, H * W)
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.imshow(owner, cmap="tab10", aspect="auto")
ax.set_xlabel("output pixel oh * W' + ow")
ax.set_ylabel("filter f")
ax.set_title(f"naive kernel: the block that computes each output ({blocks} blocks of {THREADS_1D} threads)")
for f in range(F):
    for p in range(0, H * W, 5):
        ax.text(p, f, str(owner[f, p]), ha="center", va="center", fontsize=7)
fig.tight_layout()
course.show(fig, "threads-per-output")

# %% [markdown]
# ## 2. Shared-memory tiles on the im2col product
#
# The naive kernel reads every input value from global memory `F` times. The
# tiled kernel computes `Y = Wm @ X` (tutorial 1's im2col form: `Wm` is
# `(F, C Kh Kw)`, `X` is `(C Kh Kw, H' W')`) in `TILE x TILE` output tiles.
# A block of `TILE x TILE` threads walks the inner dimension in steps of
# `TILE`: each thread copies one element of each operand into shared memory
# (zero past the edges), `syncthreads`, accumulates, `syncthreads` again
# before the next stage overwrites the tiles. The shape follows numba-cuda's
# documented `fast_matmul`.

# %%
TILE = 8


@cuda.jit
def gemm_tiled(a, b, c):
    # a: (M, K), b: (K, P), c: (M, P); block (bx, by) owns c[TILE bx .., TILE by ..]
    sa = cuda.shared.array((TILE, TILE), numpy.float64)
    sb = cuda.shared.array((TILE, TILE), numpy.float64)
    row, col = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = 0.0
    for stage in range((a.shape[1] + TILE - 1) // TILE):     # ceil(K / TILE) stages
        k = stage * TILE
        sa[tx, ty] = a[row, k + ty] if row < a.shape[0] and k + ty < a.shape[1] else 0.0
        sb[tx, ty] = b[k + tx, col] if k + tx < b.shape[0] and col < b.shape[1] else 0.0
        cuda.syncthreads()                                   # the tiles are complete
        for kk in range(TILE):
            acc += sa[tx, kk] * sb[kk, ty]
        cuda.syncthreads()                                   # everyone is done reading them
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


def launch_2d(rows, cols, per_thread=1):
    """(blocks, threads) covering a rows x cols output with TILE x TILE outputs per block."""
    side = TILE // per_thread
    return (math.ceil(rows / TILE), math.ceil(cols / TILE)), (side, side)


cols = ref.im2col(x, (K, K), (1, 1), (1, 1), (1, 1), (H, W))[0].reshape(C * K * K, H * W)  # (C Kh Kw, H' W')
Wm = w.reshape(F, C * K * K)                                                                # (F, C Kh Kw)
Y_dev = xp.zeros((F, H * W))
gemm_tiled[launch_2d(F, H * W)](xp.asarray(Wm), xp.asarray(cols), Y_dev)
assert_close(to_host(Y_dev).reshape(y_ref.shape), y_ref, reduction_length=C * K * K)
print("tiled:", launch_2d(F, H * W), "matches the reference")

# %% [markdown]
# ## 3. Register micro-tiles
#
# Each thread now owns an `MICRO x MICRO` square of the output tile, so a block
# has `(TILE / MICRO)^2` threads. Per inner index `kk` a thread loads `MICRO`
# values of each operand from shared memory into registers (local arrays) and
# does `MICRO^2` multiply-adds: an outer product. Loads per multiply-add drop by
# a factor `MICRO`. The thread's rows are `tx + side * ii`, strided by the
# number of threads per side, so neighbouring threads touch neighbouring shared
# memory words: the layout `refconv.kernels` uses (`multiply_stage` in `kernels/multiply_v2.py`,
# generated with its `kk` loop written out and checked in).
# With fewer threads than tile elements, each thread copies `MICRO^2` elements
# of each tile per stage.

# %%
MICRO = 2
SIDE = TILE // MICRO                                            # threads per side of a block


@cuda.jit
def gemm_micro(a, b, c):
    sa = cuda.shared.array((TILE, TILE), numpy.float64)
    sb = cuda.shared.array((TILE, TILE), numpy.float64)
    acc = cuda.local.array((MICRO, MICRO), numpy.float64)
    a_reg = cuda.local.array(MICRO, numpy.float64)
    b_reg = cuda.local.array(MICRO, numpy.float64)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.x * TILE, cuda.blockIdx.y * TILE
    for ii in range(MICRO):
        for jj in range(MICRO):
            acc[ii, jj] = 0.0
    for stage in range((a.shape[1] + TILE - 1) // TILE):
        k = stage * TILE
        for ii in range(MICRO):                                 # this thread's share of the copies
            for jj in range(MICRO):
                r, q = tx + SIDE * ii, ty + SIDE * jj
                sa[r, q] = a[r0 + r, k + q] if r0 + r < a.shape[0] and k + q < a.shape[1] else 0.0
                sb[r, q] = b[k + r, c0 + q] if k + r < b.shape[0] and c0 + q < b.shape[1] else 0.0
        cuda.syncthreads()
        for kk in range(TILE):
            for ii in range(MICRO):
                a_reg[ii] = sa[tx + SIDE * ii, kk]
            for jj in range(MICRO):
                b_reg[jj] = sb[kk, ty + SIDE * jj]
            for ii in range(MICRO):
                for jj in range(MICRO):
                    acc[ii, jj] += a_reg[ii] * b_reg[jj]        # MICRO^2 multiply-adds per 2 MICRO loads
        cuda.syncthreads()
    for ii in range(MICRO):
        for jj in range(MICRO):
            r, q = r0 + tx + SIDE * ii, c0 + ty + SIDE * jj
            if r < c.shape[0] and q < c.shape[1]:
                c[r, q] = acc[ii, jj]


Y_dev = xp.zeros((F, H * W))
gemm_micro[launch_2d(F, H * W, MICRO)](xp.asarray(Wm), xp.asarray(cols), Y_dev)
assert_close(to_host(Y_dev).reshape(y_ref.shape), y_ref, reduction_length=C * K * K)
print("micro-tiled:", launch_2d(F, H * W, MICRO), "matches the reference")

# %% [markdown]
# ## 4. The library's kernels: all three passes, versions 1 to 3
#
# `refconv.kernels` holds the production versions: version 1 is the direct
# kernel of section 1 (one thread per output of each pass), version 2 the
# tiled **implicit GEMM**: the im2col columns are gathered into shared memory
# on the fly, never materialised, with 64 x 64 output tiles, 16-deep stages and
# 4 x 4 register micro-tiles. Version 3, the default, is the step to speed:
# 128 x 128 tiles with 8 x 8 micro-tiles, the next stage loaded while the
# current one is multiplied, and 32-bit indices. It runs in float32 only (in
# float64, `version=3` runs version 2), so below it gets float32 copies.
# docs/kernels.md explains what each step buys. The module docstring lists the versions:

# %%
print(refconv.kernels.conv_forward.__doc__)

# %%
dy = rng.standard_normal(y_ref.shape)
expected = {"forward": y_ref,
            "backward-data": ref.conv2d_backward_data(dy, w, x.shape, **geometry),
            "backward-filter": ref.conv2d_backward_filter(x, dy, w.shape, **geometry)}
lengths = {"forward": C * K * K, "backward-data": F * K * K, "backward-filter": N * H * W}
xd, wd, dyd = xp.asarray(x), xp.asarray(w), xp.asarray(dy)
for version in (1, 2, 3):
    if version == 3:  # float32, where version 3 runs (its tolerance is float32's)
        xd, wd, dyd = (a.astype(numpy.float32) for a in (xd, wd, dyd))
    got = {"forward": refconv.kernels.conv2d_forward(xd, wd, version=version, **geometry),
           "backward-data": refconv.kernels.conv2d_backward_data(dyd, wd, x.shape, version=version, **geometry),
           "backward-filter": refconv.kernels.conv2d_backward_filter(xd, dyd, w.shape, version=version, **geometry)}
    for name in expected:
        mine = to_host(got[name])  # compared within the tolerance of its own dtype
        assert_close(mine, expected[name].astype(mine.dtype), reduction_length=lengths[name], name=name)
    print(f"refconv.kernels version {version} ({mine.dtype}): forward, backward-data, backward-filter match the reference")

# %% [markdown]
# ## 5. Timing against cuDNN (GPU only)
#
# Timings under the simulator measure Python threads, not a GPU, so this cell
# runs only when a GPU is present. It calls the repository's benchmark,
# `python -m refconv.bench kernels`, which times the three versions and cuDNN side by
# side in one run (CUDA events, after a warm-up launch) on a ResNet-50 layer
# shape, and writes one JSON line per implementation; the cell plots them.

# %%
import json
import subprocess
import tempfile

timings = None
if ON_GPU:
    out = os.path.join(tempfile.mkdtemp(), "kernels.jsonl")
    subprocess.run([sys.executable, "-m", "refconv.bench", "kernels", "--shapes", "conv3", "--batch", "8",
                    "--repeat", "5", "--out", out], check=True, timeout=300)
    timings = [json.loads(line) for line in open(out)]          # one line per implementation
    fig, ax = plt.subplots(figsize=(7, 3))
    for k, line in enumerate(timings):
        ax.bar([i + 0.8 * k / len(timings) for i in range(len(expected))],
               [line["passes"][name]["median"] * 1e3 for name in expected],
               width=0.8 / len(timings), label=line["config"]["implementation"])
    ax.set_xticks(range(len(expected)), list(expected))
    ax.set_ylabel("median ms")
    ax.set_title(f"{timings[0]['config']['device']}: conv3 (128 -> 128 channels, 28x28), batch 8", fontsize=10)
    ax.legend(fontsize=8)
    course.show(fig, "kernels-against-cudnn")
else:
    print("No GPU here: the timing against cuDNN is skipped (the simulator's times would mean nothing).")

# %% [markdown]
# ## Checks

# %%
assert_close(to_host(Y_dev).reshape(y_ref.shape), y_ref, reduction_length=C * K * K)
assert blocks * threads >= y_ref.size > (blocks - 1) * threads       # ceil-division: one partial block
assert launch_2d(F, H * W, MICRO)[1] == (SIDE, SIDE) and SIDE * MICRO == TILE
if timings is not None:
    assert all(set(expected) <= set(line["passes"]) for line in timings) and len(timings) >= 2   # v1, v2 (+ cuDNN)
print("tutorial 2: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Write a tiled convolution kernel yourself, run it under the CUDA simulator,
#   and get it scored by each thread's global and shared loads against a budget:
#   [a kernel puzzle](exercises/13_kernel_puzzle.md).
# - The launch geometry above is output arithmetic; do the same for a rank's
#   block of a strided, dilated layer: [output and halo
#   arithmetic](exercises/01_halo_arithmetic.md).
