"""The other layers of a CNN, forward and backward side by side (NumPy, NCHW).

Semantics follow PyTorch: ``relu``, ``batch_norm`` in training mode (biased batch
variance for normalising, unbiased for the running variance, ``momentum=0.1``,
``eps=1e-5``), ``max_pool2d`` / ``avg_pool2d`` (``count_include_pad=True``),
``adaptive_avg_pool2d(x, 1)`` as global average pooling, ``linear`` and
``cross_entropy`` with integer labels and mean reduction.
"""

import numpy

from refconv import checks

# ----------------------------------------------------------------------------- ReLU


def relu_forward(x):
    """``max(x, 0)``, any shape."""
    return numpy.maximum(x, 0)


def relu_backward(dy, x):
    """``dy`` where ``x > 0``, else 0 whatever ``dy`` is, an inf or a NaN too (the
    subgradient at 0 is 0, as in PyTorch)."""
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    return _keep(dy, x > 0)


def _keep(dy, mask, finite=None):
    """``numpy.where(mask, dy, 0)``, fast (``finite``: ``isfinite(dy).all()``, if known).  numpy.where branches on every element, and the
    masks of ReLU and max pooling are random: mispredicted branches make it ~15x slower
    than a product (2.1 ms against 0.12 ms on a (64, 32, 16, 16) float32 dy).  The
    product is exact where dy is finite (dy * 1 = dy), but a negative dy * 0 is -0.0,
    so 0.0 is added (-0.0 + 0.0 = +0.0, and x + 0.0 = x otherwise): the zeros are
    where's and torch's +0.0.  inf * 0 and NaN * 0 are NaN, so a dy holding those
    goes through where."""
    if finite is None:
        finite = numpy.isfinite(dy).all()
    if finite:
        kept = dy * mask
        kept += 0.0
        return kept
    return numpy.where(mask, dy, numpy.zeros((), dtype=dy.dtype))


# ------------------------------------------------------------------ batch normalization


def batch_norm_forward(x, gamma, beta, *, eps=1e-5, running_mean=None, running_var=None, momentum=0.1):
    """Training-mode batch norm over ``(N, H, W)`` for each channel.

    ``x (N, C, H, W)``, ``gamma, beta (C,)``.  Returns ``(y, saved)`` where
    ``saved = (mean, invstd)`` feeds :func:`batch_norm_backward`.  When running
    statistics are given they are updated in place:
    ``running = (1 - momentum) * running + momentum * batch`` with the unbiased
    batch variance, as PyTorch does.  (:func:`refconv.reference.batch_norm3d_forward`
    is the same over ``(N, D, H, W)`` of an ``(N, C, D, H, W)`` volume.)
    """
    checks.array(x, "x", 4)
    return channel_norm_forward(x, gamma, beta, eps, running_mean, running_var, momentum)


def _per_channel(v, x):
    """``v (C,)`` shaped to broadcast over ``x (N, C, ...)``."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _not_channel(x):
    """The axes a batch norm reduces: every axis of ``x (N, C, ...)`` but the channels'."""
    return (0,) + tuple(range(2, x.ndim))


def channel_norm_forward(x, gamma, beta, eps, running_mean, running_var, momentum):
    """:func:`batch_norm_forward` of an ``(N, C, ...)`` array of any number of spatial dims."""
    C = x.shape[1]
    for name, v in (("gamma", gamma), ("beta", beta), ("running_mean", running_mean), ("running_var", running_var)):
        if v is not None and tuple(v.shape) != (C,):
            raise ValueError(f"{name}: expected shape ({C},) for C={C} channels, got {tuple(v.shape)}")
    checks.same_dtype(x=x, gamma=gamma, beta=beta)
    count = x.size // C
    mean = x.mean(axis=_not_channel(x))  # (C,)
    var = x.var(axis=_not_channel(x))  # (C,) biased
    invstd = 1.0 / numpy.sqrt(var + eps)
    xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    y = xhat * _per_channel(gamma, x) + _per_channel(beta, x)
    update_running_stats(running_mean, running_var, mean, var, count, momentum)
    return y.astype(x.dtype, copy=False), (mean, invstd)


def update_running_stats(running_mean, running_var, mean, var, count, momentum):
    """In-place running-statistics update; ``var`` is the biased batch variance."""
    if running_mean is not None:
        running_mean *= 1 - momentum
        running_mean += momentum * mean
    if running_var is not None:
        unbiased = var * count / max(count - 1, 1)
        running_var *= 1 - momentum
        running_var += momentum * unbiased


def batch_norm_backward(dy, x, gamma, saved):
    """Returns ``(dx, dgamma, dbeta)`` for :func:`batch_norm_forward` (and, on ``(N, C, D, H, W)``
    arrays, for :func:`refconv.reference.batch_norm3d_forward`).

    With ``xhat = (x - mean) * invstd`` and ``M = N*H*W`` (``N*D*H*W``):
    ``dbeta = sum dy``, ``dgamma = sum dy * xhat``,
    ``dx = gamma * invstd / M * (M * dy - dbeta - xhat * dgamma)``.
    """
    mean, invstd = saved
    M = x.size // x.shape[1]
    xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    dbeta = dy.sum(axis=_not_channel(x))
    dgamma = (dy * xhat).sum(axis=_not_channel(x))
    scale = _per_channel(gamma * invstd / M, x)
    dx = scale * (M * dy - _per_channel(dbeta, x) - xhat * _per_channel(dgamma, x))
    return dx.astype(x.dtype, copy=False), dgamma, dbeta


# --------------------------------------------------------------------------- pooling


def pool_geometry(x_shape, kernel_size, stride, padding):
    """Normalised ``(kernel, stride, padding, (Ho, Wo))``; ``stride=None`` means the kernel size."""
    kernel = checks.pair(kernel_size, "kernel_size", minimum=1)
    stride = kernel if stride is None else checks.pair(stride, "stride", minimum=1)
    padding = checks.pair(padding, "padding", minimum=0)
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise ValueError(f"padding: expected at most half the kernel size {kernel}, got {padding}")
    out = tuple(
        checks.conv_output_size(x_shape[2 + a], kernel[a], stride[a], padding[a], 1, "HW"[a]) for a in range(2)
    )
    return kernel, stride, padding, out


def _windows(x_pad, kernel, stride, out):
    """Yield ``((i, j), view)`` with ``view[n, c, oh, ow] = x_pad[n, c, oh*sh + i, ow*sw + j]``."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            yield (i, j), x_pad[:, :, i:i + stride[0] * (out[0] - 1) + 1:stride[0], j:j + stride[1] * (out[1] - 1) + 1:stride[1]]


def _pad(x, padding, value):
    """x with ``padding`` rows and columns of ``value`` around each map (x itself when none)."""
    N, C, H, W = x.shape
    ph, pw = padding
    if ph == pw == 0:
        return x
    x_pad = numpy.full((N, C, H + 2 * ph, W + 2 * pw), value, dtype=x.dtype)
    x_pad[:, :, ph:ph + H, pw:pw + W] = x
    return x_pad


def max_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Max pooling; padding counts as ``-inf``.  Returns ``(y, argmax)``.

    ``argmax[n, c, oh, ow]`` is the flat kernel offset ``i*Kw + j`` of the first
    maximum in the window, which :func:`max_pool2d_backward` routes ``dy`` to.
    A NaN is never the maximum (a window of NaN only gives ``-inf``), as in the CUDA
    kernel; ``torch.nn.MaxPool2d`` returns NaN for a window holding one instead.
    """
    checks.array(x, "x", 4)
    kernel, stride, padding, out = pool_geometry(x.shape, kernel_size, stride, padding)
    x_pad = _pad(x, padding, -numpy.inf)
    y = numpy.full(x.shape[:2] + out, -numpy.inf, dtype=x.dtype)
    argmax = numpy.zeros(y.shape, dtype=numpy.int64)
    # Branch-free updates: ``where(better, ...)`` and ``argmax[better] = ...`` branch on a
    # random mask; with them this took 4.7 ms on a (64, 32, 16, 16) float32 x, kernel 2,
    # against 0.8 ms now.
    for (i, j), view in _windows(x_pad, kernel, stride, out):
        better = view > y  # strict: the first maximum wins
        # fmax is where(better, view, y): a NaN in view is skipped as > skips it (only a tie of
        # 0.0 and -0.0 may keep either sign, equal values)
        numpy.fmax(y, view, out=y)
        argmax += better * (i * kernel[1] + j - argmax)  # where(better, i*Kw + j, argmax)
    return y, argmax


def max_pool2d_backward(dy, argmax, x_shape, kernel_size, stride=None, padding=0):
    """Route each ``dy`` to the window's maximum recorded in ``argmax``."""
    kernel, stride, padding, out = pool_geometry(x_shape, kernel_size, stride, padding)
    N, C, H, W = x_shape
    ph, pw = padding
    dx_pad = numpy.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=dy.dtype)
    finite = numpy.isfinite(dy).all()  # once, not once per kernel offset
    for (i, j), view in _windows(dx_pad, kernel, stride, out):
        view += _keep(dy, argmax == i * kernel[1] + j, finite)
    return dx_pad[:, :, ph:ph + H, pw:pw + W]


def avg_pool2d_forward(x, kernel_size, stride=None, padding=0):
    """Average pooling with zero padding counted in the divisor (``count_include_pad=True``)."""
    checks.array(x, "x", 4)
    kernel, stride, padding, out = pool_geometry(x.shape, kernel_size, stride, padding)
    x_pad = _pad(x, padding, 0)
    y = numpy.zeros(x.shape[:2] + out, dtype=x.dtype)
    for _, view in _windows(x_pad, kernel, stride, out):
        y += view
    return y / (kernel[0] * kernel[1])


def avg_pool2d_backward(dy, x_shape, kernel_size, stride=None, padding=0):
    """Spread each ``dy`` evenly over its window (padding included)."""
    kernel, stride, padding, out = pool_geometry(x_shape, kernel_size, stride, padding)
    N, C, H, W = x_shape
    ph, pw = padding
    dx_pad = numpy.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=dy.dtype)
    share = dy / (kernel[0] * kernel[1])
    for _, view in _windows(dx_pad, kernel, stride, out):
        view += share
    return dx_pad[:, :, ph:ph + H, pw:pw + W]


def global_avg_pool_forward(x):
    """``(N, C, H, W)`` -> ``(N, C)``, the mean over each feature map."""
    checks.array(x, "x", 4)
    return x.mean(axis=(2, 3))


def global_avg_pool_backward(dy, x_shape):
    """Spread ``dy (N, C)`` evenly over each ``H x W`` map."""
    N, C, H, W = x_shape
    return numpy.broadcast_to((dy / (H * W)).reshape(N, C, 1, 1), (N, C, H, W)).copy()


# ---------------------------------------------------------------- linear and the loss


def linear_forward(x, w, b=None):
    """``y = x @ w.T + b``: ``(N, I), (O, I), (O,)`` -> ``(N, O)``."""
    checks.array(x, "x", 2)
    checks.array(w, "w", 2)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"w: expected {x.shape[1]} input features (x.shape[1]), got w.shape = {tuple(w.shape)}")
    checks.same_dtype(x=x, w=w, b=b)
    y = x @ w.T
    return y + b if b is not None else y


def linear_backward(dy, x, w):
    """Returns ``(dx, dw, db)``."""
    return dy @ w, dy.T @ x, dy.sum(axis=0)


def softmax_cross_entropy_forward(logits, labels):
    """Mean cross-entropy of integer ``labels (N,)`` under ``softmax(logits (N, K))``.

    Returns ``(loss, probs)``; ``probs`` feeds the backward.
    """
    checks.array(logits, "logits", 2)
    labels = numpy.asarray(labels)
    N, K = logits.shape
    if labels.shape != (N,) or not numpy.issubdtype(labels.dtype, numpy.integer):
        raise ValueError(f"labels: expected {N} integer labels, got shape {labels.shape} dtype {labels.dtype}")
    if N and (labels.min() < 0 or labels.max() >= K):
        raise ValueError(f"labels: expected values in [0, {K}), got [{labels.min()}, {labels.max()}]")
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - numpy.log(numpy.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[numpy.arange(N), labels].mean()
    return loss, numpy.exp(log_probs)


def softmax_cross_entropy_backward(probs, labels):
    """``dlogits = (softmax - onehot(labels)) / N``."""
    N = probs.shape[0]
    dlogits = probs.copy()
    dlogits[numpy.arange(N), labels] -= 1
    return dlogits / N


def mse_forward(pred, target):
    """Mean squared error over every element of ``pred (N, K)`` against ``target (N, K)``
    (PyTorch's ``mse_loss``, ``reduction='mean'``).  Returns ``(loss, diff)``; ``diff`` feeds
    the backward."""
    checks.array(pred, "pred", 2)
    target = numpy.asarray(target)
    if target.shape != pred.shape:
        raise ValueError(f"target: expected the shape of pred {tuple(pred.shape)}, got {tuple(target.shape)}")
    diff = pred - target
    return (diff * diff).mean(), diff


def mse_backward(diff):
    """``dpred = 2 (pred - target) / (N K)``."""
    return 2 * diff / diff.size
