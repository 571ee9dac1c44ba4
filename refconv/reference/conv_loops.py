"""Convolution written as plain loops: slow, and obviously right.

Used only to check the vectorised formulation in :mod:`refconv.reference.conv`
on tiny shapes.  Every index is spelled out: output pixel ``(oh, ow)`` with
kernel offset ``(i, j)`` reads input pixel ``(oh*sh - ph + i*dh, ow*sw - pw + j*dw)``;
reads outside the image are zeros.
"""

import numpy

from refconv import checks


def _geometry(x_shape, w_shape, stride, padding, dilation, groups):
    return checks.conv_geometry(tuple(x_shape), tuple(w_shape), stride, padding, dilation, groups)


def _taps(x_shape, w_shape, stride, padding, dilation, groups, out_hw):
    """Yield every (n, f, oh, ow, c, cg, i, j, ih, iw) with (ih, iw) inside the image
    (``c`` the input channel, ``cg`` its index within its group, the weight's dim 1)."""
    N, C, H, W = x_shape
    F, Cg, Kh, Kw = w_shape
    Fg = F // groups
    Ho, Wo = out_hw
    for n in range(N):
        for f in range(F):
            g = f // Fg
            for oh in range(Ho):
                for ow in range(Wo):
                    for cg in range(Cg):
                        c = g * Cg + cg
                        for i in range(Kh):
                            for j in range(Kw):
                                ih = oh * stride[0] - padding[0] + i * dilation[0]
                                iw = ow * stride[1] - padding[1] + j * dilation[1]
                                if 0 <= ih < H and 0 <= iw < W:
                                    yield n, f, oh, ow, c, cg, i, j, ih, iw


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1):
    stride, padding, dilation, groups, (Ho, Wo) = _geometry(x.shape, w.shape, stride, padding, dilation, groups)
    y = numpy.zeros((x.shape[0], w.shape[0], Ho, Wo), dtype=x.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x.shape, w.shape, stride, padding, dilation, groups, (Ho, Wo)):
        y[n, f, oh, ow] += x[n, c, ih, iw] * w[f, cg, i, j]
    if b is not None:
        for f in range(w.shape[0]):
            y[:, f] += b[f]
    return y


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
    stride, padding, dilation, groups, out_hw = _geometry(x_shape, w.shape, stride, padding, dilation, groups)
    dx = numpy.zeros(tuple(x_shape), dtype=dy.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x_shape, w.shape, stride, padding, dilation, groups, out_hw):
        dx[n, c, ih, iw] += dy[n, f, oh, ow] * w[f, cg, i, j]
    return dx


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
    stride, padding, dilation, groups, out_hw = _geometry(x.shape, w_shape, stride, padding, dilation, groups)
    dw = numpy.zeros(tuple(w_shape), dtype=x.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x.shape, w_shape, stride, padding, dilation, groups, out_hw):
        dw[f, cg, i, j] += x[n, c, ih, iw] * dy[n, f, oh, ow]
    return dw
