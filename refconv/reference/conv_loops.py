"""Convolution written as plain loops: slow, and obviously right.

Used only to check the vectorised formulation in :mod:`refconv.reference.conv`
on tiny shapes.  Every index is spelled out: output pixel ``(oh, ow)`` with
kernel offset ``(i, j)`` reads input pixel ``(oh*sh - ph + i*dh, ow*sw - pw + j*dw)``;
reads outside the image are zeros, or with ``padding_mode`` the pixel :func:`_inside`
folds them onto.
"""

import numpy

from refconv import checks


def _geometry(x_shape, w_shape, stride, padding, dilation, groups):
    return checks.conv_geometry(tuple(x_shape), tuple(w_shape), stride, padding, dilation, groups)


def _inside(i, size, mode):
    """The image row that padding row ``i`` (outside ``[0, size)``) copies, or None for zeros."""
    if mode == "zeros":
        return None
    if mode == "replicate":
        return 0 if i < 0 else size - 1
    if mode == "circular":
        return i + size if i < 0 else i - size
    return -i if i < 0 else 2 * (size - 1) - i  # reflect about the edge row


def _taps(x_shape, w_shape, stride, padding, dilation, groups, out_hw, padding_mode="zeros"):
    """Yield every (n, f, oh, ow, c, cg, i, j, ih, iw) whose tap reads an image pixel (ih, iw)
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
                                if not 0 <= ih < H:
                                    ih = _inside(ih, H, padding_mode)
                                if not 0 <= iw < W:
                                    iw = _inside(iw, W, padding_mode)
                                if ih is not None and iw is not None:
                                    yield n, f, oh, ow, c, cg, i, j, ih, iw


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, (Ho, Wo) = _geometry(x.shape, w.shape, stride, padding, dilation, groups)
    y = numpy.zeros((x.shape[0], w.shape[0], Ho, Wo), dtype=x.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x.shape, w.shape, stride, padding, dilation, groups, (Ho, Wo),
                                                   padding_mode):
        y[n, f, oh, ow] += x[n, c, ih, iw] * w[f, cg, i, j]
    if b is not None:
        for f in range(w.shape[0]):
            y[:, f] += b[f]
    return y


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, out_hw = _geometry(x_shape, w.shape, stride, padding, dilation, groups)
    dx = numpy.zeros(tuple(x_shape), dtype=dy.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x_shape, w.shape, stride, padding, dilation, groups, out_hw,
                                                   padding_mode):
        dx[n, c, ih, iw] += dy[n, f, oh, ow] * w[f, cg, i, j]
    return dx


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    stride, padding, dilation, groups, out_hw = _geometry(x.shape, w_shape, stride, padding, dilation, groups)
    dw = numpy.zeros(tuple(w_shape), dtype=x.dtype)
    for n, f, oh, ow, c, cg, i, j, ih, iw in _taps(x.shape, w_shape, stride, padding, dilation, groups, out_hw,
                                                   padding_mode):
        dw[f, cg, i, j] += x[n, c, ih, iw] * dy[n, f, oh, ow]
    return dw
