"""Batch normalization pieces on device arrays, split where the distributed layer allreduces.

    forward:  batch_norm_sums -> (allreduce) -> mean, invstd -> batch_norm_apply
    backward: batch_norm_grad_sums -> (allreduce) -> dbeta, dgamma -> batch_norm_backward_apply

Versions: one each.  The two reductions share :func:`channel_sums`: one block
per channel, each thread sums a strided share of that channel's ``N*H*W``
values in float64, then a shared-memory tree halves the 256 partial sums
``log2(256) = 8`` times.  The apply steps are one thread per element.
Semantics are ``refconv.backend.NumpyBackend``'s; ``tests/test_kernels.py``
checks them against it.  Benchmark: ``python -m refconv.bench kernels``.
"""

import numpy
from numba import cuda, float64

from ._launch import BLOCK_1D, contiguous, grid_1d, split2, split4, xp, stream
from refconv import checks


@cuda.jit
def channel_sums_kernel(a, b, shift, scale, sum_a, sum_ab, both):
    """Block ``c`` writes ``sum_a[c] = sum a[:, c]`` and, when ``both``,
    ``sum_ab[c] = sum a[:, c] (b[:, c] - shift[c]) scale[c]``.

    ``a, b``: ``(N, C, H*W)``.  Shared memory: two ``BLOCK_1D`` float64 arrays of
    per-thread partial sums, reduced pairwise (stride 128, 64, ..., 1).
    """
    N, C, HW = a.shape
    c = cuda.blockIdx.x
    t = cuda.threadIdx.x
    partial_a = cuda.shared.array(BLOCK_1D, float64)
    partial_ab = cuda.shared.array(BLOCK_1D, float64)
    s_a = 0.0
    s_ab = 0.0
    for e in range(t, N * HW, BLOCK_1D):  # neighbouring threads read neighbouring pixels
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
        sum_a[c] = partial_a[0]
        if both:
            sum_ab[c] = partial_ab[0]


def channel_sums(a, b, shift, scale, dtype_ab):
    """Host side of :func:`channel_sums_kernel`: returns ``(sum_a (C,), sum_ab (C,))``;
    with ``b=None``, ``sum_a`` alone (the second reduction is skipped)."""
    N, C, H, W = a.shape
    sum_a = xp().empty(C, dtype=a.dtype)
    sum_ab = xp().empty(C, dtype=dtype_ab)
    a3 = contiguous(a).reshape(N, C, H * W)
    b3 = a3 if b is None else contiguous(b).reshape(N, C, H * W)
    channel_sums_kernel[C, BLOCK_1D, stream()](a3, b3, shift, scale, sum_a, sum_ab, b is not None)
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


@cuda.jit
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


@cuda.jit
def batch_norm_backward_apply_kernel(dy, x, mean, invstd, gamma, dbeta, dgamma, count, dx):
    """Thread ``t`` writes ``dx.flat[t] = gamma invstd / count * (count dy - dbeta - xhat dgamma)``."""
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
    batch_norm_backward_apply_kernel[blocks, threads, stream()](dy, x, mean, invstd, gamma, dbeta, dgamma, float(count), dx)
    return dx
