"""Convolution written as plain loops: slow, and obviously right.

Used only to check the vectorised formulations in :mod:`refconv.reference.conv` (2-D)
and :mod:`refconv.reference.conv3d` on tiny shapes.  Every index is spelled out, one
per spatial dim: output position ``o`` with kernel offset ``k`` reads input position
``o*s - p + k*d`` (in 2-D: pixel ``(oh*sh - ph + i*dh, ow*sw - pw + j*dw)``); reads
outside the image are zeros, or with ``padding_mode`` the pixel :func:`_inside` folds
them onto.  ``conv2d_*`` here and ``conv3d_*`` in :mod:`refconv.reference.conv3d_loops`
are the same loops with ``dims`` 2 and 3.
"""

import functools
import itertools

import numpy

from refconv import checks


def _inside(i, size, mode):
    """The image row that padding row ``i`` (outside ``[0, size)``) copies, or None for zeros."""
    if mode == "zeros":
        return None
    if mode == "replicate":
        return 0 if i < 0 else size - 1
    if mode == "circular":
        return i + size if i < 0 else i - size
    return -i if i < 0 else 2 * (size - 1) - i  # reflect about the edge row


def _source(index, size, mode):
    """``index`` if it is inside ``[0, size)``, else the row the padding copies (None for zeros)."""
    return index if 0 <= index < size else _inside(index, size, mode)


def _taps(x_shape, w_shape, stride, padding, dilation, groups, out, padding_mode="zeros"):
    """Yield every ``(n, f, o, c, cg, k, i)`` whose tap reads an image position: output position
    ``o`` of filter ``f`` (a tuple, one index per spatial dim) reads input position ``i`` of
    channel ``c`` through the weight tap ``(f, cg) + k`` (``cg`` the channel's index within
    its group, the weight's dim 1)."""
    N, C, *size = x_shape
    F, Cg, *kernel = w_shape
    Fg = F // groups
    for n, f in itertools.product(range(N), range(F)):
        g = f // Fg
        for o in itertools.product(*map(range, out)):
            for cg in range(Cg):
                c = g * Cg + cg
                for k in itertools.product(*map(range, kernel)):
                    i = tuple(_source(o[a] * stride[a] - padding[a] + k[a] * dilation[a], size[a], padding_mode)
                              for a in range(len(size)))
                    if None not in i:
                        yield n, f, o, c, cg, k, i


def forward(x, w, b=None, *, dims, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, out = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation,
                                                                  groups, dims)
    y = numpy.zeros((x.shape[0], w.shape[0], *out), dtype=x.dtype)
    for n, f, o, c, cg, k, i in _taps(x.shape, w.shape, stride, padding, dilation, groups, out, padding_mode):
        y[(n, f) + o] += x[(n, c) + i] * w[(f, cg) + k]
    if b is not None:
        for f in range(w.shape[0]):
            y[:, f] += b[f]
    return y


def backward_data(dy, w, x_shape, *, dims, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, out = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation,
                                                                  groups, dims)
    dx = numpy.zeros(tuple(x_shape), dtype=dy.dtype)
    for n, f, o, c, cg, k, i in _taps(x_shape, w.shape, stride, padding, dilation, groups, out, padding_mode):
        dx[(n, c) + i] += dy[(n, f) + o] * w[(f, cg) + k]
    return dx


def backward_filter(x, dy, w_shape, *, dims, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, out = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation,
                                                                  groups, dims)
    dw = numpy.zeros(tuple(w_shape), dtype=x.dtype)
    for n, f, o, c, cg, k, i in _taps(x.shape, w_shape, stride, padding, dilation, groups, out, padding_mode):
        dw[(f, cg) + k] += x[(n, c) + i] * dy[(n, f) + o]
    return dw


conv2d_forward = functools.partial(forward, dims=2)
conv2d_backward_data = functools.partial(backward_data, dims=2)
conv2d_backward_filter = functools.partial(backward_filter, dims=2)
