"""3-D pooling, 3-D batch norm and global average pooling of volumes, forward and backward
side by side (NumPy, NCDHW).

Semantics follow PyTorch: ``max_pool3d`` / ``avg_pool3d`` (``count_include_pad=True``,
``ceil_mode=False``, padding at most half the kernel) and ``batch_norm`` of a 5-D input
in training mode.  The 2-D layers of :mod:`refconv.reference.layers` with a depth axis:
the batch norm is theirs (it reduces over every axis but the channels'), the pooling
walks ``(Kd, Kh, Kw)`` kernel offsets where the 2-D one walks ``(Kh, Kw)``.
"""

import itertools

import numpy

from refconv import checks
from refconv.reference.layers import _keep, batch_norm_backward, channel_norm_forward

# --------------------------------------------------------------------- batch norm


def batch_norm3d_forward(x, gamma, beta, *, eps=1e-5, running_mean=None, running_var=None, momentum=0.1):
    """Training-mode batch norm over ``(N, D, H, W)`` for each channel of ``x (N, C, D, H, W)``.

    Returns ``(y, saved)``; ``saved = (mean, invstd)`` feeds :func:`batch_norm3d_backward`.
    Running statistics, when given, are updated in place as ``batch_norm_forward`` does.
    """
    checks.array(x, "x", 5)
    return channel_norm_forward(x, gamma, beta, eps, running_mean, running_var, momentum)


def batch_norm3d_backward(dy, x, gamma, saved):
    """``(dx, dgamma, dbeta)`` for :func:`batch_norm3d_forward` (``M = N*D*H*W``)."""
    checks.array(x, "x", 5)
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    return batch_norm_backward(dy, x, gamma, saved)


# ------------------------------------------------------------------------ pooling


def pool3d_geometry(x_shape, kernel_size, stride, padding):
    """Normalised ``(kernel, stride, padding, (Do, Ho, Wo))``; ``stride=None`` means the kernel size."""
    kernel = checks.triple(kernel_size, "kernel_size", minimum=1)
    stride = kernel if stride is None else checks.triple(stride, "stride", minimum=1)
    padding = checks.triple(padding, "padding", minimum=0)
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"padding: expected at most half the kernel size {kernel}, got {padding}")
    out = tuple(checks.conv_output_size(x_shape[2 + a], kernel[a], stride[a], padding[a], 1, "DHW"[a])
                for a in range(3))
    return kernel, stride, padding, out


def _windows(x_pad, kernel, stride, out):
    """Yield ``(k, view)``, ``k = (a*Kh + i)*Kw + j`` the flat kernel offset and
    ``view[n, c, od, oh, ow] = x_pad[n, c, od*sd + a, oh*sh + i, ow*sw + j]``."""
    for k, offset in enumerate(itertools.product(*(range(K) for K in kernel))):
        yield k, x_pad[(slice(None), slice(None)) + tuple(
            slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offset, stride, out))]


def _pad(x_shape, padding, value, dtype):
    """A new ``(N, C, D + 2pd, H + 2ph, W + 2pw)`` array of ``value`` and the view of its interior."""
    N, C = x_shape[:2]
    x_pad = numpy.full((N, C) + tuple(s + 2 * p for s, p in zip(x_shape[2:], padding)), value, dtype=dtype)
    inside = (slice(None), slice(None)) + tuple(slice(p, p + s) for s, p in zip(x_shape[2:], padding))
    return x_pad, inside


def max_pool3d_forward(x, kernel_size, stride=None, padding=0):
    """Max pooling of ``x (N, C, D, H, W)``; padding counts as ``-inf``.  Returns ``(y, argmax)``,
    ``argmax`` the flat kernel offset ``(a*Kh + i)*Kw + j`` of the first maximum in each window
    (a NaN is never the maximum, as in ``max_pool2d_forward``)."""
    checks.array(x, "x", 5)
    kernel, stride, padding, out = pool3d_geometry(x.shape, kernel_size, stride, padding)
    x_pad, inside = _pad(x.shape, padding, -numpy.inf, x.dtype)
    x_pad[inside] = x
    y = numpy.full(x.shape[:2] + out, -numpy.inf, dtype=x.dtype)
    argmax = numpy.zeros(y.shape, dtype=numpy.int64)
    for k, view in _windows(x_pad, kernel, stride, out):
        better = view > y  # strict: the first maximum wins
        numpy.fmax(y, view, out=y)
        argmax += better * (k - argmax)  # where(better, k, argmax), without a branch per element
    return y, argmax


def max_pool3d_backward(dy, argmax, x_shape, kernel_size, stride=None, padding=0):
    """Route each ``dy`` to its window's maximum recorded in ``argmax``."""
    x_shape = checks.shape5(x_shape, "x_shape")
    kernel, stride, padding, out = pool3d_geometry(x_shape, kernel_size, stride, padding)
    dx_pad, inside = _pad(x_shape, padding, 0, dy.dtype)
    finite = numpy.isfinite(dy).all()
    for k, view in _windows(dx_pad, kernel, stride, out):
        view += _keep(dy, argmax == k, finite)
    return numpy.ascontiguousarray(dx_pad[inside])


def avg_pool3d_forward(x, kernel_size, stride=None, padding=0):
    """Average pooling of ``x (N, C, D, H, W)``, zero padding counted in the divisor."""
    checks.array(x, "x", 5)
    kernel, stride, padding, out = pool3d_geometry(x.shape, kernel_size, stride, padding)
    x_pad, inside = _pad(x.shape, padding, 0, x.dtype)
    x_pad[inside] = x
    y = numpy.zeros(x.shape[:2] + out, dtype=x.dtype)
    for _, view in _windows(x_pad, kernel, stride, out):
        y += view
    return y / (kernel[0] * kernel[1] * kernel[2])


def avg_pool3d_backward(dy, x_shape, kernel_size, stride=None, padding=0):
    """Spread each ``dy`` evenly over its window (padding included)."""
    x_shape = checks.shape5(x_shape, "x_shape")
    kernel, stride, padding, out = pool3d_geometry(x_shape, kernel_size, stride, padding)
    dx_pad, inside = _pad(x_shape, padding, 0, dy.dtype)
    share = dy / (kernel[0] * kernel[1] * kernel[2])
    for _, view in _windows(dx_pad, kernel, stride, out):
        view += share
    return numpy.ascontiguousarray(dx_pad[inside])


def global_avg_pool3d_forward(x):
    """``(N, C, D, H, W)`` -> ``(N, C)``, the mean over each volume."""
    checks.array(x, "x", 5)
    return x.mean(axis=(2, 3, 4))


def global_avg_pool3d_backward(dy, x_shape):
    """Spread ``dy (N, C)`` evenly over each ``D x H x W`` volume."""
    N, C, D, H, W = checks.shape5(x_shape, "x_shape")
    return numpy.broadcast_to((dy / (D * H * W)).reshape(N, C, 1, 1, 1), (N, C, D, H, W)).copy()
