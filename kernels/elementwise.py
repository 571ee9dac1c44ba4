"""Elementwise kernels on device arrays: bias add and its gradient, ReLU forward and backward.

Versions: one each; one thread per element (``cuda.grid(1)`` with a bounds
guard), except :func:`bias_grad`, a per-channel reduction shared with batch
normalization (see ``batch_norm.channel_sums``).  Checked against
``refconv.reference`` by ``tests/cuda_kernels/test_kernels.py``.  Benchmark:
``python -m refconv.bench kernels``.
"""

from numba import cuda

from .geometry import contiguous, grid_1d, kernel_jit, split4, stream, xp
from .batch_norm import channel_sums
from refconv import checks


@kernel_jit
def bias_add_kernel(y, b):
    """Thread ``t`` adds ``b[f]`` to ``y.flat[t] = y[n, f, h, w]``."""
    index = cuda.grid(1)
    if index < y.size:
        n, f, h, w = split4(index, y.shape[1], y.shape[2], y.shape[3])
        y[n, f, h, w] += b[f]


def bias_add(y, b):
    """``y += b`` broadcast over ``(N, F, H, W)``, in place; returns ``y``."""
    checks.array(y, "y", 4)
    checks.array(b, "b", 1)
    if b.shape[0] != y.shape[1]:
        raise ValueError(f"b: expected shape ({y.shape[1]},) to match F of y, got {tuple(b.shape)}")
    blocks, threads = grid_1d(y.size)
    bias_add_kernel[blocks, threads, stream()](y, b)
    return y


def bias_grad(dy):
    """``db[f] = sum over n, h, w of dy[n, f, h, w]``: ``(N, F, Ho, Wo)`` -> ``(F,)``."""
    checks.array(dy, "dy", 4)
    F = dy.shape[1]
    zeros = xp().zeros(F, dtype=dy.dtype)
    return channel_sums(dy, None, zeros, zeros, dy.dtype)


@kernel_jit
def relu_forward_kernel(x, y):
    """Thread ``t``: ``y[t] = max(x[t], 0)`` on flat arrays."""
    index = cuda.grid(1)
    if index < y.size:
        v = x[index]
        if v <= 0:  # written so that NaN passes through, as numpy.maximum does
            y[index] = 0
        else:
            y[index] = v


@kernel_jit
def relu_backward_kernel(dy, x, dx):
    """Thread ``t``: ``dx[t] = dy[t] if x[t] > 0 else 0`` on flat arrays."""
    index = cuda.grid(1)
    if index < dx.size:
        if x[index] > 0:
            dx[index] = dy[index]
        else:
            dx[index] = 0


def relu_forward(x):
    """``max(x, 0)``, any shape."""
    x = contiguous(x)
    y = xp().empty(x.shape, dtype=x.dtype)
    blocks, threads = grid_1d(x.size)
    relu_forward_kernel[blocks, threads, stream()](x.reshape(-1), y.reshape(-1))
    return y


def relu_backward(dy, x):
    """``dy`` where ``x > 0``, else 0 (the subgradient at 0 is 0, as in PyTorch)."""
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    dy, x = contiguous(dy), contiguous(x)
    dx = xp().empty(dy.shape, dtype=dy.dtype)
    blocks, threads = grid_1d(dx.size)
    relu_backward_kernel[blocks, threads, stream()](dy.reshape(-1), x.reshape(-1), dx.reshape(-1))
    return dx
