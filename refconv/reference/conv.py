"""Convolution, vectorised: im2col by kernel offset, then one matmul per group.

This is the reference's fast formulation and the CPU compute path of the
distributed layers.  Layout is NCHW; weights are ``F x C/groups x Kh x Kw``;
semantics (output size, padding, dilation, groups) are those of
``torch.nn.functional.conv2d`` and its gradients.

The columns ``cols[c, i, j, n, oh, ow] = x[n, c, i*dh + oh*sh - ph, j*dw + ow*sw - pw]``
(zero outside the image) are built with one strided slice per kernel offset
``(i, j)``.  They are stored channel-major, ``(C, Kh, Kw, N, Ho, Wo)``, so that
per group they are one ``(Cg Kh Kw, N Ho Wo)`` matrix and every pass is a single
GEMM over all samples and pixels at once::

    forward          y[g]     = w[g] @ cols[g]        (Fg x CgKK) @ (CgKK x N HoWo)
    backward-data    dcols[g] = w[g].T @ dy[g]        then col2im (scatter-add of slices)
    backward-filter  dw[g]    = dy[g] @ cols[g].T     (Fg x N HoWo) @ (N HoWo x CgKK)

``dy`` and ``y`` are moved between ``(N, F, HoWo)`` and ``(F, N HoWo)`` by one
transposed copy each; they are the small side of the product.  Padding is never
materialised: each kernel offset copies only the rows and columns it reads
inside the image and writes zeros where it reads padding.

A 1x1 convolution with stride 1 and no padding needs no columns: its columns
are ``x`` itself, so forward and backward-data are per-sample products
``w @ x[n]``, and backward-filter contracts ``dy`` with a transposed copy of ``x``.

The tap path.  A stride-1 convolution with 16 to 256 input and 16 to 128 output
channels per group (the rule is :func:`refconv.reference.conv_taps.takes_taps`) builds no columns either:
:mod:`refconv.reference.conv_taps` sums one product per kernel tap over a padded
channels-last copy of the input, which is faster there.  Passing ``cols=`` always
takes the columns.

Keeping the columns.  Forward and backward-filter read the same columns.
``conv2d_columns`` computes them once; pass them as ``cols=`` to both and the
second im2col is saved, at the cost of holding ``Kh*Kw`` times the input
(``N C Kh Kw Ho Wo`` elements) from forward until backward-filter.  Without
``cols=`` each pass builds its own.

The workspace.  Columns of 32 MiB or more that die inside a pass (and
backward-data's ``dcols``) are written into one buffer per thread that is reused
from call to call, because a fresh array that large costs a page fault per 4 KiB
page on every call.  It holds the largest such columns seen so far until
:func:`release_workspace`.
"""

import threading

import numpy

from refconv import checks
from refconv.reference import conv_taps
from refconv.reference import padding as padding_modes


def _taps(offset, dilation, stride, padding, size, out):
    """``(out_rows, in_rows)``: the output rows whose kernel offset ``offset`` reads inside
    the image (``0 <= oh*stride - padding + offset*dilation < size``), and those input rows."""
    shift = offset * dilation - padding  # the input row that output row 0 reads
    lo = max(0, -(shift // stride))  # the first oh with shift + oh*stride >= 0
    hi = min(out, (size - 1 - shift) // stride + 1)  # one past the last oh with shift + oh*stride < size
    count = max(0, hi - lo)
    start = shift + lo * stride
    return slice(lo, lo + count), slice(start, start + stride * (count - 1) + 1 if count else start, stride)


def _pointwise(kernel, stride, padding):
    """A 1x1 convolution with stride 1 and no padding: its columns are the input itself."""
    return kernel == (1, 1) and stride == (1, 1) and padding == (0, 0)


def _columns(x, kernel, stride, padding, dilation, out_hw, cols=None):
    """``x (N, C, H, W)`` -> ``cols (C, Kh, Kw, N, Ho, Wo)``, zero where a tap reads padding;
    written into ``cols`` when given (whatever it held), else into a new array."""
    N, C, H, W = x.shape
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = kernel, stride, padding, dilation, out_hw
    if cols is None:
        cols = numpy.empty((C, Kh, Kw, N, Ho, Wo), dtype=x.dtype)
    x_cn = x.transpose(1, 0, 2, 3)  # (C, N, H, W), a view
    for i in range(Kh):
        out_h, in_h = _taps(i, dh, sh, ph, H, Ho)
        for j in range(Kw):
            out_w, in_w = _taps(j, dw, sw, pw, W, Wo)
            tap = cols[:, i, j]  # (C, N, Ho, Wo)
            tap[:, :, out_h, out_w] = x_cn[:, :, in_h, in_w]
            # Output pixels whose tap reads padding: the rows above and below the copied
            # block, then the columns beside it.
            tap[:, :, :out_h.start] = 0
            tap[:, :, out_h.stop:] = 0
            tap[:, :, out_h, :out_w.start] = 0
            tap[:, :, out_h, out_w.stop:] = 0
    return cols


WORKSPACE_MIN_BYTES = 32 * 2 ** 20  # glibc's malloc maps arrays this large fresh from the OS on every call


class _Workspace(threading.local):
    """One reusable buffer per thread for large columns that live only inside one pass.

    glibc returns a freed array of 32 MiB or more to the operating system, so every
    call would pay a page fault per 4 KiB page to get it back; on the 2-core machine
    that made im2col of 150 MB columns 2-15x slower than writing into a reused
    buffer.  Smaller arrays are new ones (malloc reuses their memory itself).  The
    buffer keeps the largest columns seen so far (:func:`release_workspace` frees
    it); columns that outlive a call (``conv2d_columns``, ``im2col``) are always
    new arrays.
    """

    buffer = None

    def array(self, shape, dtype):
        nbytes = int(numpy.prod(shape)) * numpy.dtype(dtype).itemsize
        if nbytes < WORKSPACE_MIN_BYTES:
            return numpy.empty(shape, dtype=dtype)
        if self.buffer is None or self.buffer.nbytes < nbytes:
            self.buffer = None  # free the smaller one first
            self.buffer = numpy.empty(nbytes, dtype=numpy.uint8)
        return self.buffer[:nbytes].view(dtype).reshape(shape)


_workspace = _Workspace()


def release_workspace():
    """Free this thread's reusable columns buffer (the next pass allocates it again)."""
    _workspace.buffer = None


def im2col(x, kernel, stride, padding, dilation, out_hw):
    """``(N, C, H, W)`` -> ``(N, C, Kh, Kw, Ho, Wo)`` columns of the zero-padded input
    (a transposed view of the channel-major array the passes multiply)."""
    return _columns(x, kernel, stride, padding, dilation, out_hw).transpose(3, 0, 1, 2, 4, 5)


def col2im(cols, x_shape, stride, padding, dilation):
    """The adjoint of :func:`im2col`: scatter-add ``(N, C, Kh, Kw, Ho, Wo)`` back to ``(N, C, H, W)``."""
    N, C, H, W = x_shape
    _, _, Kh, Kw, Ho, Wo = cols.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    # Accumulate channel-major, the layout backward-data's columns come in (the adds then
    # walk both arrays in order), and transpose once at the end.
    cols_cn = cols.transpose(1, 2, 3, 0, 4, 5)  # (C, Kh, Kw, N, Ho, Wo), a view
    dx_cn = numpy.zeros((C, N, H, W), dtype=cols.dtype)
    for i in range(Kh):
        out_h, in_h = _taps(i, dh, sh, ph, H, Ho)
        for j in range(Kw):
            out_w, in_w = _taps(j, dw, sw, pw, W, Wo)
            dx_cn[:, :, in_h, in_w] += cols_cn[:, i, j, :, out_h, out_w]
    return numpy.ascontiguousarray(dx_cn.transpose(1, 0, 2, 3))  # (N, C, H, W)


def _to_channel_major(a, groups):
    """``(N, F, Ho, Wo)`` -> ``(G, F/G, N Ho Wo)``: one transposed copy."""
    N, F, Ho, Wo = a.shape
    return numpy.ascontiguousarray(a.transpose(1, 0, 2, 3)).reshape(groups, F // groups, N * Ho * Wo)


def _from_channel_major(a, N, out_hw):
    """``(G, F/G, N Ho Wo)`` -> ``(N, F, Ho, Wo)``: one transposed copy."""
    F = a.shape[0] * a.shape[1]
    return numpy.ascontiguousarray(a.reshape(F, N, *out_hw).transpose(1, 0, 2, 3))


def conv2d_columns(x, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
    """The columns of ``x`` that forward and backward-filter multiply, ``(G, Cg Kh Kw, N Ho Wo)``:
    compute them once and pass them as ``cols=`` to both (see the module docstring)."""
    checks.array(x, "x", 4)
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation, groups)
    return _grouped_columns(x, w_shape, stride, padding, dilation, groups, out_hw, numpy.empty)


def _grouped_columns(x, w_shape, stride, padding, dilation, groups, out_hw, alloc):
    """:func:`conv2d_columns` of validated arguments, written into ``alloc(shape, dtype)``."""
    N, C, _, _ = x.shape
    F, Cg, Kh, Kw = w_shape
    shape = (groups, Cg * Kh * Kw, N * out_hw[0] * out_hw[1])
    if _pointwise((Kh, Kw), stride, padding):
        cols = alloc((C, N) + out_hw, x.dtype)
        cols[...] = x.transpose(1, 0, 2, 3)  # (C, N, H, W): the input is its own columns
        return cols.reshape(shape)
    cols = _columns(x, (Kh, Kw), stride, padding, dilation, out_hw, alloc((C, Kh, Kw, N) + out_hw, x.dtype))
    return cols.reshape(shape)


def _check_cols(cols, x, w_shape, geometry):
    expected = conv2d_columns_shape(x.shape, w_shape, **geometry)
    if tuple(cols.shape) != expected or cols.dtype != x.dtype:
        raise ValueError(f"cols: expected the {expected} {x.dtype} array conv2d_columns(x, w_shape, ...) returns, "
                         f"got {tuple(cols.shape)} {cols.dtype}")


def conv2d_columns_shape(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
    """The shape of :func:`conv2d_columns`: ``(G, Cg Kh Kw, N Ho Wo)``."""
    _, _, _, groups, (Ho, Wo) = checks.conv_geometry(x_shape, w_shape, stride, padding, dilation, groups)
    F, Cg, Kh, Kw = w_shape
    return (groups, Cg * Kh * Kw, x_shape[0] * Ho * Wo)


def conv2d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, cols=None, padding_mode="zeros"):
    """``y = conv2d(x, w) + b``: ``(N, C, H, W), (F, C/g, Kh, Kw), (F,)`` -> ``(N, F, Ho, Wo)``.
    ``cols``: this input's :func:`conv2d_columns`, if already computed (of the padded input,
    with a ``padding_mode`` other than zeros: see :mod:`refconv.reference.padding`)."""
    checks.forward_arrays(x, w, b)
    if padding_mode != "zeros":  # torch.nn.Conv2d's way: pad explicitly, then no padding
        pads = padding_modes.pads_of(x.shape, w.shape, stride, padding, dilation, padding_mode)
        return conv2d_forward(padding_modes.pad(x, pads, padding_mode), w, b, stride=stride, dilation=dilation,
                              groups=groups, cols=cols)
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    stride, padding, dilation, groups, (Ho, Wo) = checks.conv_geometry(x.shape, w.shape, **geometry)
    N, C, H, W = x.shape
    F, Cg, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    w_g = w.reshape(G, Fg, Cg * Kh * Kw)
    if cols is None and conv_taps.takes_taps(x.shape, w.shape, stride, padding, dilation, groups, (Ho, Wo)):
        y = conv_taps.forward(x, w, padding, dilation, groups, (Ho, Wo))  # no columns: a product per tap
    elif cols is None and _pointwise((Kh, Kw), stride, padding):
        y = numpy.matmul(w_g, x.reshape(N, G, Cg, H * W))  # (N, G, Fg, H*W): w @ x[n], no columns
        y = y.reshape(N, F, Ho, Wo)
    else:
        if cols is None:  # (G, CgKK, N*Ho*Wo), in the workspace: they die in this call
            cols = _grouped_columns(x, w.shape, stride, padding, dilation, groups, (Ho, Wo), _workspace.array)
        else:
            _check_cols(cols, x, w.shape, geometry)
        y = _from_channel_major(numpy.matmul(w_g, cols), N, (Ho, Wo))  # (N, F, Ho, Wo)
    if b is not None:
        y += b.reshape(1, F, 1, 1)
    return y


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """``dx`` from ``dy (N, F, Ho, Wo)`` and ``w (F, C/g, Kh, Kw)``: ``(N, C, H, W) = x_shape``."""
    if padding_mode != "zeros":  # the gradient of the padded input, then the adjoint of the padding
        pads = padding_modes.pads_of(checks.shape4(x_shape, "x_shape"), w.shape, stride, padding, dilation,
                                     padding_mode)
        padded = tuple(x_shape[:2]) + tuple(x_shape[2 + a] + sum(pads[a]) for a in range(2))
        dx_padded = conv2d_backward_data(dy, w, padded, stride=stride, dilation=dilation, groups=groups)
        return padding_modes.pad_adjoint(dx_padded, x_shape, pads, padding_mode)
    checks.array(dy, "dy", 4)
    checks.array(w, "w", 4)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape4(x_shape, "x_shape")
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups)
    checks.dy_shape(dy, x_shape, w.shape, out_hw)
    N, C, H, W = x_shape
    F, Cg, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    Ho, Wo = out_hw
    if conv_taps.takes_taps(x_shape, w.shape, stride, padding, dilation, groups, out_hw):
        return conv_taps.backward_data(dy, w, x_shape, padding, dilation, groups)  # no columns: a product per tap
    w_t = w.reshape(G, Fg, Cg * Kh * Kw).transpose(0, 2, 1)  # (G, CgKK, Fg)
    if _pointwise((Kh, Kw), stride, padding):
        dx = numpy.matmul(w_t, dy.reshape(N, G, Fg, Ho * Wo))  # (N, G, Cg, H*W): w.T @ dy[n]
        return dx.reshape(N, C, H, W)
    dcols = _workspace.array((G, Cg * Kh * Kw, N * Ho * Wo), dy.dtype)  # dies in this call
    numpy.matmul(w_t, _to_channel_major(dy, G), out=dcols)
    dcols = dcols.reshape(C, Kh, Kw, N, Ho, Wo).transpose(3, 0, 1, 2, 4, 5)  # (N, C, Kh, Kw, Ho, Wo) view
    return col2im(dcols, x_shape, stride, padding, dilation)


def conv2d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, cols=None,
                           padding_mode="zeros"):
    """``dw (F, C/g, Kh, Kw) = w_shape`` from ``x (N, C, H, W)`` and ``dy (N, F, Ho, Wo)``.
    ``cols``: this input's :func:`conv2d_columns`, if already computed (by the forward)."""
    if padding_mode != "zeros":
        checks.array(x, "x", 4)
        pads = padding_modes.pads_of(x.shape, checks.shape4(w_shape, "w_shape"), stride, padding, dilation,
                                     padding_mode)
        return conv2d_backward_filter(padding_modes.pad(x, pads, padding_mode), dy, w_shape, stride=stride,
                                      dilation=dilation, groups=groups, cols=cols)
    checks.array(x, "x", 4)
    checks.array(dy, "dy", 4)
    checks.same_dtype(x=x, dy=dy)
    w_shape = checks.shape4(w_shape, "w_shape")
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x.shape, w_shape, **geometry)
    checks.dy_shape(dy, x.shape, w_shape, out_hw)
    F, Cg, Kh, Kw = w_shape
    if cols is None and conv_taps.takes_taps(x.shape, w_shape, stride, padding, dilation, groups, out_hw):
        return conv_taps.backward_filter(x, dy, w_shape, padding, dilation, groups)  # no columns: a product per tap
    if cols is None:  # (G, CgKK, N*Ho*Wo), in the workspace: they die in this call
        cols = _grouped_columns(x, w_shape, stride, padding, dilation, groups, out_hw, _workspace.array)
    else:
        _check_cols(cols, x, w_shape, geometry)
    # One GEMM per group contracts every sample and output pixel at once: no per-sample partials.
    dw = numpy.matmul(_to_channel_major(dy, groups), cols.transpose(0, 2, 1))  # (G, Fg, CgKK)
    return dw.reshape(F, Cg, Kh, Kw)


def conv2d_backward_bias(dy):
    """``db[f] = sum over n, h, w of dy[n, f, h, w]``: ``(N, F, Ho, Wo)`` -> ``(F,)``."""
    checks.array(dy, "dy", 4)
    return dy.sum(axis=(0, 2, 3))
