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
# # 1. The serial convolution: loops, im2col, three passes
#
# *One process.*
#
# Every parallel algorithm in refconv is checked against one serial reference,
# `refconv.reference`. This tutorial builds that reference's convolution up
# from nothing: first seven nested loops, then the **im2col** reformulation that
# turns it into a matrix product, then the two backward passes that training
# needs. At the end you know the shape of every tensor and, more important
# for the rest of the course, **which index each pass sums over**: that is what
# a parallel algorithm splits, and what its collectives then finish.
#
# Specification: `docs/algorithms.md` section 1. Code: `refconv/reference/conv.py`
# (vectorised) and `refconv/reference/conv_loops.py` (loops).

# %%
import matplotlib.pyplot as plt
import numpy

from tutorials import course
from refconv import reference as ref
from refconv.testing.asserts import assert_close

# A tiny layer: 2 samples, C = 3 input channels, F = 4 filters, 6x5 images, 3x3 kernel.
N, C, F, H, W, K = 2, 3, 4, 6, 5, 3
stride, padding, dilation = 2, 1, 1
Ho = (H + 2 * padding - dilation * (K - 1) - 1) // stride + 1   # 3 output rows
Wo = (W + 2 * padding - dilation * (K - 1) - 1) // stride + 1   # 3 output columns
geometry = dict(stride=stride, padding=padding, dilation=dilation)

rng = numpy.random.default_rng(0)
x = rng.standard_normal((N, C, H, W))        # x: (N, C, H, W)
w = rng.standard_normal((F, C, K, K))        # w: (F, C, Kh, Kw)
b = rng.standard_normal(F)                   # b: (F,)
print("x", x.shape, " w", w.shape, " y will be", (N, F, Ho, Wo))

# %% [markdown]
# ## 1. Seven loops
#
# Output pixel `(n, f, oh, ow)` sums, over input channels `c` and kernel taps
# `(i, j)`, the input pixel `(oh*s - p + i*d, ow*s - p + j*d)` times the weight
# `w[f, c, i, j]`. Pixels outside the image count as zero: that is padding.

# %%
def conv_loops(x, w, b, stride, padding, dilation):
    N, C, H, W = x.shape
    F, _, Kh, Kw = w.shape
    Ho = (H + 2 * padding - dilation * (Kh - 1) - 1) // stride + 1
    Wo = (W + 2 * padding - dilation * (Kw - 1) - 1) // stride + 1
    y = numpy.zeros((N, F, Ho, Wo))
    for n in range(N):
        for f in range(F):
            for oh in range(Ho):
                for ow in range(Wo):
                    acc = b[f]
                    for c in range(C):                    # the channel sum: channel parallelism splits it
                        for i in range(Kh):
                            for j in range(Kw):
                                ih = oh * stride - padding + i * dilation
                                iw = ow * stride - padding + j * dilation
                                if 0 <= ih < H and 0 <= iw < W:
                                    acc += x[n, c, ih, iw] * w[f, c, i, j]
                    y[n, f, oh, ow] = acc
    return y


y_loops = conv_loops(x, w, b, stride, padding, dilation)
y = ref.conv2d_forward(x, w, b, **geometry)                 # y: (N, F, H', W')
assert_close(y_loops, y, reduction_length=C * K * K)
print("seven loops == refconv.reference.conv2d_forward; y", y.shape)

# %% [markdown]
# ## 2. im2col: the convolution as one matrix product
#
# The loops read the same input pixel many times. **im2col** copies, for every
# output pixel, the `C x Kh x Kw` input values it reads into one column. The
# convolution is then a matrix product: `(F, C Kh Kw) @ (C Kh Kw, H' W')` per
# sample. `refconv.reference.im2col` builds the columns with one strided slice
# per kernel tap, so it costs `Kh Kw` copies, not a Python loop per pixel.

# %%
cols = ref.im2col(x, (K, K), (stride, stride), (padding, padding), (dilation, dilation), (Ho, Wo))
print("cols", cols.shape, "= (N, C, Kh, Kw, H', W')")
X = cols.reshape(N, C * K * K, Ho * Wo)                     # X: (N, C Kh Kw, H' W'), one column per output pixel
Wm = w.reshape(F, C * K * K)                                # Wm: (F, C Kh Kw), one row per filter
y_gemm = (Wm @ X).reshape(N, F, Ho, Wo) + b.reshape(1, F, 1, 1)
assert_close(y_gemm, y, reduction_length=C * K * K)
print("W @ im2col(x) == the reference")

# %%
fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), gridspec_kw=dict(width_ratios=[C * K * K, Ho * Wo, Ho * Wo]))
for ax, (title, m) in zip(axes, [("weights  (F, C Kh Kw)", Wm), ("im2col(x[0])  (C Kh Kw, H' W')", X[0]),
                                 ("y[0] - b  (F, H' W')", (Wm @ X[0]))]):
    ax.imshow(m, cmap="coolwarm", aspect="equal")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
for c in range(1, C):                                       # one band of K*K rows per input channel
    axes[1].axhline(c * K * K - 0.5, color="k", lw=0.8)
fig.suptitle("forward = (F x CKK) @ (CKK x H'W'): the zeros in im2col(x) are padding")
fig.tight_layout()
course.show(fig, "im2col-matrix-product")

# %% [markdown]
# The black lines split the column matrix into one band per input channel.
# Splitting those bands over ranks, and the matching columns of the weights,
# splits the product's inner dimension: each rank then holds a *partial* `y`.
# That is Stationary-X (tutorial 5).
#
# ## 3. The three passes and their shapes
#
# Training needs two more products. Both take the output gradient `dy`:
#
# | pass | formula | sums over | shape |
# | --- | --- | --- | --- |
# | forward | `y[n, f] = sum_c x[n, c] * w[f, c] + b[f]` | `c`, taps | `(N, F, H', W')` |
# | backward-data | `dx[n, c] = sum_f dy[n, f] *T w[f, c]` | `f`, taps | `(N, C, H, W)` |
# | backward-filter | `dw[f, c] = sum_n x[n, c] * dy[n, f]` | `n`, pixels | `(F, C, Kh, Kw)` |
#
# `*T` is the **transposed convolution** (also called a fractionally strided
# convolution, or "deconvolution" in some frameworks): the adjoint of `*`. Where
# the forward convolution reads a window of `x` into one output pixel, the
# transposed one spreads each pixel of `dy` back over the window it came from,
# weighted by the same taps, and adds up where windows overlap; with stride
# `s` it gives back the larger input shape `(H, W)`. The adjoint identity
# `<x, dx> = <x * w, dy>` checked below is exactly what makes it the transpose.
#
# In im2col form, backward-data is `Wm.T @ dy` followed by **col2im** (the
# adjoint of im2col: it adds each column back onto the pixels it was read
# from), and backward-filter is `dy @ X.T` summed over the samples.

# %%
dy = rng.standard_normal(y.shape)                                   # dy: (N, F, H', W')
DY = dy.reshape(N, F, Ho * Wo)

dcols = (Wm.T @ DY).reshape(N, C, K, K, Ho, Wo)                    # (N, C Kh Kw, H' W') as columns
dx_gemm = ref.col2im(dcols, x.shape, (stride, stride), (padding, padding), (dilation, dilation))
dw_gemm = numpy.einsum("nfp,nkp->fk", DY, X).reshape(w.shape)       # sum over samples n and pixels p
db_gemm = dy.sum(axis=(0, 2, 3))

dx = ref.conv2d_backward_data(dy, w, x.shape, **geometry)           # dx: (N, C, H, W)
dw = ref.conv2d_backward_filter(x, dy, w.shape, **geometry)         # dw: (F, C, Kh, Kw)
db = ref.conv2d_backward_bias(dy)                                   # db: (F,)
assert_close(dx_gemm, dx, reduction_length=F * K * K)
assert_close(dw_gemm, dw, reduction_length=N * Ho * Wo)
assert_close(db_gemm, db, reduction_length=N * Ho * Wo)
for name, a in [("x", x), ("w", w), ("y", y), ("dy", dy), ("dx", dx), ("dw", dw), ("db", db)]:
    print(f"{name:3s} {a.shape}")

# %% [markdown]
# How do we know these are the *right* gradients? Take the loss
# `L = sum(conv(x, w) * dy)`. It is linear in `x` and in `w`, and its gradient
# with respect to `y` is `dy`, so `dx` and `dw` must satisfy two adjoint
# identities. The loop version of the reference (`ref.loops`) gives a third,
# independent check.

# %%
L = numpy.sum(ref.conv2d_forward(x, w, **geometry) * dy)
assert_close(numpy.sum(x * dx), L, reduction_length=y.size * C * K * K)      # <x, dx> = <conv(x, w), dy>
assert_close(numpy.sum(w * dw), L, reduction_length=y.size * C * K * K)      # <w, dw> = <conv(x, w), dy>
assert_close(ref.loops.conv2d_backward_data(dy, w, x.shape, **geometry), dx, reduction_length=F * K * K)
assert_close(ref.loops.conv2d_backward_filter(x, dy, w.shape, **geometry), dw, reduction_length=N * Ho * Wo)
print("adjoint identities hold; the loop reference agrees")

# %% [markdown]
# ## 4. What each pass sums over, and who would split it
#
# Each sum is finished by a collective once it is split over ranks:
#
# - split `n` (samples, tutorial 3): backward-filter's sum over `n` is partial,
#   finished by an **allreduce** of `dw`;
# - split `c` (Stationary-X, tutorial 5): forward's sum is partial, finished by
#   a **reduce-scatter** of `y`;
# - split `f` (Stationary-Y, tutorial 6): backward-data's sum is partial,
#   finished by a **reduce-scatter** of `dx`;
# - split rows (spatial, tutorial 4): the taps of a border pixel read a
#   neighbour's rows, fetched by a **halo exchange**.
#
# The check below is the first fact the course relies on: a sum over a split
# index is the sum of the partial results of each block.

# %%
blocks = numpy.array_split(numpy.arange(C), 2)                      # two "ranks", channels 0..1 and 2
partials = [ref.conv2d_forward(x[:, blk], w[:, blk], **geometry) for blk in blocks]
assert_close(sum(partials) + b.reshape(1, F, 1, 1), y, reduction_length=C * K * K)
samples = numpy.array_split(numpy.arange(N), 2)
dw_parts = [ref.conv2d_backward_filter(x[s], dy[s], w.shape, **geometry) for s in samples]
assert_close(sum(dw_parts), dw, reduction_length=N * Ho * Wo)
print("partial sums over channel blocks give y; over sample blocks give dw")

# %% [markdown]
# ## Checks
#
# What this tutorial taught, asserted once more: the shapes of the three
# passes, and that loops, im2col and the reference agree.

# %%
assert y.shape == (N, F, Ho, Wo) and dx.shape == x.shape and dw.shape == w.shape and db.shape == (F,)
assert X.shape == (N, C * K * K, Ho * Wo)
assert numpy.count_nonzero(X[0] == 0) > 0                             # padding shows up as zeros in im2col
assert_close(conv_loops(x, w, b, stride, padding, dilation), y_gemm, reduction_length=C * K * K)
print("tutorial 1: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Before any code runs on ranks: for a given kernel, stride, padding and
#   dilation, and a rank's block of rows, which input rows does it need from
#   each neighbour, and which output rows does it own? [Output and halo
#   arithmetic](exercises/01_halo_arithmetic.md).
# - The table of section 3 says what each pass sums over. Split the samples over
#   ranks and decide which of `y`, `dx`, `dw`, `db` needs a collective, and
#   which: [sample parallelism's backward](exercises/02_sample_backward.md).
