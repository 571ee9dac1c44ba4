"""Batch normalization pieces on device arrays, split where the distributed layer allreduces.

    forward:  batch_norm_sums -> (allreduce) -> mean, invstd -> batch_norm_apply
    backward: batch_norm_grad_sums -> (allreduce) -> dbeta, dgamma -> batch_norm_backward_apply

Versions: one each.  The two reductions share :func:`channel_sums`: a 2-D grid
of ``(C, blocks_per_channel)`` blocks, so that even a few channels fill a large
GPU; each thread sums a strided share of its channel's ``N*H*W`` values in
float64, a shared-memory tree halves the block's 256 partial sums
``log2(256) = 8`` times into one partial per block, and a second kernel adds a
channel's partials in the fixed order ``0, 1, ...`` (no atomics: the sums are
the same on every run of the same launch).  The apply steps are one thread per
element, in the data's dtype.  Semantics are ``refconv.backend.NumpyBackend``'s;
``tests/cuda_kernels/test_kernels.py`` checks them against it.  Benchmark: ``python -m refconv.bench kernels``.
"""

import numpy
from numba import cuda

from .geometry import BLOCK_1D, TARGET_BLOCKS, ceil_div, contiguous, grid_1d, kernel_jit, split2, split4, stream, xp
from .scalars import float64
from refconv import checks

# Each thread of a channel_sums block sums at least about this many values, so that
# splitting a channel across blocks never leaves most of a block idle.
VALUES_PER_THREAD = 8


@kernel_jit
def channel_sums_kernel(a, b, shift, scale, part_a, part_ab, both):
    """Block ``(c, k)`` writes ``part_a[c, k]``, the sum of its share of ``a[:, c]``, and, when
    ``both``, ``part_ab[c, k]``, that of ``a[:, c] (b[:, c] - shift[c]) scale[c]``.

    ``a, b``: ``(N, C, H*W)``; ``part_a, part_ab``: ``(C, blocks_per_channel)`` float64.
    Block ``k`` of a channel takes its values ``k*256 + t, k*256 + t + blocks*256, ...``
    (neighbouring threads read neighbouring pixels).  Shared memory: two ``BLOCK_1D``
    float64 arrays of per-thread partial sums, reduced pairwise (stride 128, 64, ..., 1).
    """
    N, C, HW = a.shape
    c = cuda.blockIdx.x
    k = cuda.blockIdx.y
    t = cuda.threadIdx.x
    partial_a = cuda.shared.array(BLOCK_1D, float64)
    partial_ab = cuda.shared.array(BLOCK_1D, float64)
    s_a = 0.0
    s_ab = 0.0
    for e in range(k * BLOCK_1D + t, N * HW, part_a.shape[1] * BLOCK_1D):
        n, p = split2(e, HW)
        u = a[n, c, p]
        s_a += u
        if both:
            s_ab += u * (b[n, c, p] - shift[c]) * scale[c]
    partial_a[t] = s_a
    partial_ab[t] = s_ab
    cuda.syncthreads()
    step = BLOCK_1D // 2
    while step > 0:
        if t < step:
            partial_a[t] += partial_a[t + step]
            partial_ab[t] += partial_ab[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        part_a[c, k] = partial_a[0]
        if both:
            part_ab[c, k] = partial_ab[0]


@kernel_jit
def channel_sums_finish_kernel(part_a, part_ab, sum_a, sum_ab, both):
    """Thread ``c`` writes ``sum_a[c] = part_a[c, 0] + part_a[c, 1] + ...`` in that order, in float64
    (and ``sum_ab[c]`` from ``part_ab`` when ``both``)."""
    c = cuda.grid(1)
    if c < sum_a.size:
        s_a = 0.0
        s_ab = 0.0
        for k in range(part_a.shape[1]):
            s_a += part_a[c, k]
            if both:
                s_ab += part_ab[c, k]
        sum_a[c] = s_a
        if both:
            sum_ab[c] = s_ab


def blocks_per_channel(C, values):
    """How many blocks share one channel of ``values`` elements: about ``TARGET_BLOCKS`` in all,
    each thread summing at least ``VALUES_PER_THREAD`` of them."""
    return max(1, min(ceil_div(TARGET_BLOCKS, C), values // (BLOCK_1D * VALUES_PER_THREAD)))


def channel_sums(a, b, shift, scale, dtype_ab, per_channel=None):
    """Host side of :func:`channel_sums_kernel`: returns ``(sum_a (C,), sum_ab (C,))``;
    with ``b=None``, ``sum_a`` alone (the second reduction is skipped).  ``per_channel``
    fixes the blocks per channel (default :func:`blocks_per_channel`; the tests use it)."""
    N, C, H, W = a.shape
    per_channel = per_channel or blocks_per_channel(C, N * H * W)
    part_a = xp().empty((C, per_channel), dtype=numpy.float64)
    part_ab = xp().empty((C, per_channel), dtype=numpy.float64)
    sum_a = xp().empty(C, dtype=a.dtype)
    sum_ab = xp().empty(C, dtype=dtype_ab)
    a3 = contiguous(a).reshape(N, C, H * W)
    b3 = a3 if b is None else contiguous(b).reshape(N, C, H * W)
    channel_sums_kernel[(C, per_channel), BLOCK_1D, stream()](a3, b3, shift, scale, part_a, part_ab, b is not None)
    blocks, threads = grid_1d(C)
    channel_sums_finish_kernel[blocks, threads, stream()](part_a, part_ab, sum_a, sum_ab, b is not None)
    return sum_a if b is None else (sum_a, sum_ab)


def _per_channel(C, **vectors):
    for name, v in vectors.items():
        if tuple(v.shape) != (C,):
            raise ValueError(f"{name}: expected shape ({C},) for C={C} channels, got {tuple(v.shape)}")


def batch_norm_sums(x):
    """Per-channel ``(sum x, sum x^2)`` over ``(N, H, W)`` of ``x (N, C, H, W)``: two ``(C,)`` arrays."""
    checks.array(x, "x", 4)
    C = x.shape[1]
    return channel_sums(x, x, xp().zeros(C, x.dtype), xp().ones(C, x.dtype), x.dtype)


def batch_norm_grad_sums(dy, x, mean, invstd):
    """Per-channel ``(sum dy, sum dy * xhat)`` with ``xhat = (x - mean) * invstd``: the partial dbeta, dgamma."""
    checks.array(dy, "dy", 4)
    checks.array(x, "x", 4)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    _per_channel(x.shape[1], mean=mean, invstd=invstd)
    dtype_ab = numpy.result_type(dy.dtype, x.dtype, mean.dtype, invstd.dtype)
    return channel_sums(dy, x, mean, invstd, dtype_ab)


@kernel_jit
def batch_norm_apply_kernel(x, mean, invstd, gamma, beta, y):
    """Thread ``t`` writes ``y.flat[t] = (x - mean[c]) * invstd[c] * gamma[c] + beta[c]``."""
    index = cuda.grid(1)
    if index < y.size:
        n, c, h, w = split4(index, y.shape[1], y.shape[2], y.shape[3])
        y[n, c, h, w] = (x[n, c, h, w] - mean[c]) * (invstd[c] * gamma[c]) + beta[c]


def batch_norm_apply(x, mean, invstd, gamma, beta):
    """``y = (x - mean) * invstd * gamma + beta`` per channel; ``y`` has ``x``'s shape and dtype."""
    checks.array(x, "x", 4)
    _per_channel(x.shape[1], mean=mean, invstd=invstd, gamma=gamma, beta=beta)
    y = xp().empty(x.shape, dtype=x.dtype)
    blocks, threads = grid_1d(y.size)
    batch_norm_apply_kernel[blocks, threads, stream()](x, mean, invstd, gamma, beta, y)
    return y


@kernel_jit
def batch_norm_backward_apply_kernel(dy, x, mean, invstd, gamma, dbeta, dgamma, count, dx):
    """Thread ``t`` writes ``dx.flat[t] = gamma invstd / count * (count dy - dbeta - xhat dgamma)``.

    ``count`` comes in ``dx``'s dtype: a Python float would be a float64 argument and
    turn the float32 kernel's arithmetic into float64.
    """
    index = cuda.grid(1)
    if index < dx.size:
        n, c, h, w = split4(index, dx.shape[1], dx.shape[2], dx.shape[3])
        xhat = (x[n, c, h, w] - mean[c]) * invstd[c]
        dx[n, c, h, w] = gamma[c] * invstd[c] / count * (count * dy[n, c, h, w] - dbeta[c] - xhat * dgamma[c])


def batch_norm_backward_apply(dy, x, mean, invstd, gamma, dbeta, dgamma, count):
    """``dx = gamma * invstd / count * (count * dy - dbeta - xhat * dgamma)`` with the global sums.

    ``count`` is the global ``N*H*W`` (over all ranks); ``dbeta, dgamma`` the allreduced sums.
    """
    checks.array(dy, "dy", 4)
    checks.array(x, "x", 4)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    _per_channel(x.shape[1], mean=mean, invstd=invstd, gamma=gamma, dbeta=dbeta, dgamma=dgamma)
    dx = xp().empty(x.shape, dtype=x.dtype)
    blocks, threads = grid_1d(dx.size)
    batch_norm_backward_apply_kernel[blocks, threads, stream()](dy, x, mean, invstd, gamma, dbeta, dgamma, dx.dtype.type(count), dx)
    return dx
