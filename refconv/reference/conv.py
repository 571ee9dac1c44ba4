"""Convolution, vectorised: im2col by kernel offset, then one batched matmul.

This is the reference's fast formulation and the CPU compute path of the
distributed layers.  Layout is NCHW; weights are ``F x C/groups x Kh x Kw``;
semantics (output size, padding, dilation, groups) are those of
``torch.nn.functional.conv2d`` and its gradients.

The column tensor ``cols[n, c, i, j, oh, ow] = x_pad[n, c, i*dh + oh*sh, j*dw + ow*sw]``
is built with one strided slice per kernel offset ``(i, j)``, so the whole
convolution is ``Kh*Kw`` slice copies plus a matmul per group:

    forward          y[n, g]   = w[g] @ cols[n, g]          (Fg x CgKK) @ (CgKK x HoWo)
    backward-data    dcols[n, g] = w[g].T @ dy[n, g]        then col2im (scatter-add of slices)
    backward-filter  dw[g]     = sum_n dy[n, g] @ cols[n, g].T
"""

import numpy

from refconv import checks


def _output_slice(offset, dilation, stride, out):
    """Rows of the padded input that kernel offset ``offset`` touches, one per output row."""
    start = offset * dilation
    return slice(start, start + stride * (out - 1) + 1, stride)


def im2col(x, kernel, stride, padding, dilation, out_hw):
    """``(N, C, H, W)`` -> ``(N, C, Kh, Kw, Ho, Wo)`` columns of the zero-padded input."""
    N, C, H, W = x.shape
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = kernel, stride, padding, dilation, out_hw
    x_pad = numpy.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=x.dtype)  # (N, C, H+2ph, W+2pw)
    x_pad[:, :, ph:ph + H, pw:pw + W] = x
    cols = numpy.empty((N, C, Kh, Kw, Ho, Wo), dtype=x.dtype)
    for i in range(Kh):
        rows = _output_slice(i, dh, sh, Ho)
        for j in range(Kw):
            cols[:, :, i, j] = x_pad[:, :, rows, _output_slice(j, dw, sw, Wo)]
    return cols


def col2im(cols, x_shape, stride, padding, dilation):
    """The adjoint of :func:`im2col`: scatter-add ``(N, C, Kh, Kw, Ho, Wo)`` back to ``(N, C, H, W)``."""
    N, C, H, W = x_shape
    _, _, Kh, Kw, Ho, Wo = cols.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    dx_pad = numpy.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=cols.dtype)
    for i in range(Kh):
        rows = _output_slice(i, dh, sh, Ho)
        for j in range(Kw):
            dx_pad[:, :, rows, _output_slice(j, dw, sw, Wo)] += cols[:, :, i, j]
    return dx_pad[:, :, ph:ph + H, pw:pw + W]


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1):
    """``y = conv2d(x, w) + b``: ``(N, C, H, W), (F, C/g, Kh, Kw), (F,)`` -> ``(N, F, Ho, Wo)``."""
    checks.forward_arrays(x, w, b)
    stride, padding, dilation, groups, (Ho, Wo) = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)
    N, C, _, _ = x.shape
    F, Cg, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    cols = im2col(x, (Kh, Kw), stride, padding, dilation, (Ho, Wo))  # (N, C, Kh, Kw, Ho, Wo)
    cols = cols.reshape(N, G, Cg * Kh * Kw, Ho * Wo)
    y = numpy.matmul(w.reshape(G, Fg, Cg * Kh * Kw), cols)  # (N, G, Fg, Ho*Wo)
    y = y.reshape(N, F, Ho, Wo)
    if b is not None:
        y += b.reshape(1, F, 1, 1)
    return y


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
    """``dx`` from ``dy (N, F, Ho, Wo)`` and ``w (F, C/g, Kh, Kw)``: ``(N, C, H, W) = x_shape``."""
    checks.array(dy, "dy", 4)
    checks.array(w, "w", 4)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape4(x_shape, "x_shape")
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x_shape, w.shape, out_hw)
    N, C, _, _ = x_shape
    F, Cg, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    Ho, Wo = out_hw
    w_t = w.reshape(G, Fg, Cg * Kh * Kw).transpose(0, 2, 1)  # (G, CgKK, Fg)
    dcols = numpy.matmul(w_t, dy.reshape(N, G, Fg, Ho * Wo))  # (N, G, CgKK, Ho*Wo)
    dcols = dcols.reshape(N, C, Kh, Kw, Ho, Wo)
    return col2im(dcols, x_shape, stride, padding, dilation)


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
    """``dw (F, C/g, Kh, Kw) = w_shape`` from ``x (N, C, H, W)`` and ``dy (N, F, Ho, Wo)``."""
    checks.array(x, "x", 4)
    checks.array(dy, "dy", 4)
    checks.same_dtype(x=x, dy=dy)
    w_shape = checks.shape4(w_shape, "w_shape")
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x.shape, w_shape, out_hw)
    N, C, _, _ = x.shape
    F, Cg, Kh, Kw = w_shape
    G, Fg = groups, F // groups
    Ho, Wo = out_hw
    cols = im2col(x, (Kh, Kw), stride, padding, dilation, out_hw)
    cols = cols.reshape(N, G, Cg * Kh * Kw, Ho * Wo)
    dy_g = dy.reshape(N, G, Fg, Ho * Wo)
    # One matmul per sample and group contracts the output pixels; then sum the samples.
    dw = numpy.matmul(dy_g, cols.transpose(0, 1, 3, 2)).sum(axis=0)  # (G, Fg, CgKK)
    return dw.reshape(F, Cg, Kh, Kw)


def conv2d_backward_bias(dy):
    """``db[f] = sum over n, h, w of dy[n, f, h, w]``: ``(N, F, Ho, Wo)`` -> ``(F,)``."""
    checks.array(dy, "dy", 4)
    return dy.sum(axis=(0, 2, 3))
