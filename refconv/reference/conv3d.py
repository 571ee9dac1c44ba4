"""3-D convolution, vectorised: vol2col by kernel offset, then one matmul per group.

The formulation of :mod:`refconv.reference.conv` with a depth axis.  Layout is
NCDHW; weights are ``F x C/groups x Kd x Kh x Kw``; semantics (output size, padding
and its strings, ``padding_mode``, dilation, groups) are those of
``torch.nn.functional.conv3d`` and ``torch.nn.Conv3d``, and their gradients.

The columns ``cols[n, c, a, i, j, od, oh, ow] = x[n, c, a*dd + od*sd - pd, i*dh + oh*sh - ph,
j*dw + ow*sw - pw]`` (zero outside the volume) are built with one strided slice per kernel
offset ``(a, i, j)``.  Per sample and group they are one ``(Cg Kd Kh Kw, Do Ho Wo)`` matrix::

    forward          y[n, g]     = w[g] @ cols[n, g]       (Fg x CgKKK) @ (CgKKK x DoHoWo)
    backward-data    dcols[n, g] = w[g].T @ dy[n, g]       then col2vol (scatter-add of slices)
    backward-filter  dw[g]       = dy[g] @ cols[g].T       (Fg x N DoHoWo) @ (N DoHoWo x CgKKK)

Forward and backward-data take the columns sample-major, ``(N, C, Kd, Kh, Kw, Do, Ho, Wo)``,
when a sample's output has at least ``PER_SAMPLE_MIN_VOXELS`` voxels: ``y`` and ``dx`` then
come out of the products in their own layout, and such a volume is large enough that one
product per sample is an efficient GEMM.  (Moving a large ``y`` with a transposed copy, as
the 2-D reference does, cost as much as the product.)  A smaller output per sample (the deep
layers of a CosmoFlow-style model, or a rank's block of a volume split many ways) makes a
product per sample a thin GEMM, so there they take the columns channel-major, as
backward-filter always does: ``(C, Kd, Kh, Kw, N, Do, Ho, Wo)``, one product over every
sample, and a transposed copy of the small ``y``.  Backward-filter sums over the samples, so
it contracts every sample and voxel in one product, without per-sample partial gradients.

Which rows of the output read inside the volume through each offset is the 2-D
reference's ``_taps``, one call per axis; large columns go into the 2-D reference's
per-thread workspace.  A 1x1x1 convolution with stride 1 and no padding needs no
columns: forward and backward-data are per-sample products ``w @ x[n]``.
"""

import numpy

from refconv import checks
from refconv.reference import padding as padding_modes
# One source of truth for the tap arithmetic and the reusable columns buffer: the 2-D module's.
from refconv.reference.conv import _taps, _workspace


# A sample's output voxels from which one product per sample beats one product over the batch.
# 2026-12-02 13:30 UTC, batch 4, 2 threads, 3x3x3, the CosmoFlow layers of refconv.bench.apart,
# both ways alternated in one process with 0.2 s between calls (a one-off script): at 2^3 and 4^3
# voxels the product over the batch made forward 21% and 8% faster and backward-data 39% and 9%;
# at 8^3 they tied (within 2%); at 32^3 one product per sample was 13-17% faster, and at 16^3 18%
# faster in backward-data, 7% slower in forward.
PER_SAMPLE_MIN_VOXELS = 512


def _per_sample(out):
    """Whether forward and backward-data multiply sample by sample (large outputs) or the whole batch at once."""
    return out[0] * out[1] * out[2] >= PER_SAMPLE_MIN_VOXELS


def _pointwise(kernel, stride, padding):
    """A 1x1x1 convolution with stride 1 and no padding: its columns are the input itself."""
    return kernel == (1, 1, 1) and stride == (1, 1, 1) and padding == (0, 0, 0)


def _offsets(kernel, stride, padding, dilation, size, out):
    """Yield ``((a, i, j), out_voxels, in_voxels)`` for every kernel offset: through offset
    ``(a, i, j)`` the output voxels ``out_voxels`` (a slice per axis) read the input voxels
    ``in_voxels``; every other output voxel reads padding through it."""
    for a in range(kernel[0]):
        out_d, in_d = _taps(a, dilation[0], stride[0], padding[0], size[0], out[0])
        for i in range(kernel[1]):
            out_h, in_h = _taps(i, dilation[1], stride[1], padding[1], size[1], out[1])
            for j in range(kernel[2]):
                out_w, in_w = _taps(j, dilation[2], stride[2], padding[2], size[2], out[2])
                yield (a, i, j), (out_d, out_h, out_w), (in_d, in_h, in_w)


def _fill_taps(source, tap_of, kernel, stride, padding, dilation, out):
    """Write every kernel offset's block of columns: ``tap_of(a, i, j)[p, q, od, oh, ow] =
    source[p, q, od*sd - pd + a*dd, ...]``, zero where the offset reads padding.  ``source`` is
    ``x`` or its channel-major view, and ``tap_of`` the matching slice of the columns."""
    for offset, (out_d, out_h, out_w), (in_d, in_h, in_w) in _offsets(kernel, stride, padding, dilation,
                                                                       source.shape[2:], out):
        tap = tap_of(*offset)  # (P, Q, Do, Ho, Wo)
        tap[:, :, out_d, out_h, out_w] = source[:, :, in_d, in_h, in_w]
        # Output voxels whose tap reads padding: the planes before and after the copied
        # block, then the rows above and below it, then the columns beside it.
        tap[:, :, :out_d.start] = 0
        tap[:, :, out_d.stop:] = 0
        tap[:, :, out_d, :out_h.start] = 0
        tap[:, :, out_d, out_h.stop:] = 0
        tap[:, :, out_d, out_h, :out_w.start] = 0
        tap[:, :, out_d, out_h, out_w.stop:] = 0


def _columns(x, kernel, stride, padding, dilation, out, cols):
    """``x (N, C, D, H, W)`` -> sample-major ``cols (N, C, Kd, Kh, Kw, Do, Ho, Wo)``, written into ``cols``."""
    _fill_taps(x, lambda a, i, j: cols[:, :, a, i, j], kernel, stride, padding, dilation, out)
    return cols


def _channel_major_columns(x, kernel, stride, padding, dilation, out, cols):
    """``x (N, C, D, H, W)`` -> channel-major ``cols (C, Kd, Kh, Kw, N, Do, Ho, Wo)``, written into ``cols``."""
    _fill_taps(x.transpose(1, 0, 2, 3, 4), lambda a, i, j: cols[:, a, i, j], kernel, stride, padding, dilation, out)
    return cols


def vol2col(x, kernel, stride, padding, dilation, out):
    """``(N, C, D, H, W)`` -> ``(N, C, Kd, Kh, Kw, Do, Ho, Wo)`` columns of the zero-padded input."""
    cols = numpy.empty(x.shape[:2] + tuple(kernel) + tuple(out), dtype=x.dtype)
    return _columns(x, kernel, stride, padding, dilation, out, cols)


def col2vol(cols, x_shape, stride, padding, dilation):
    """The adjoint of :func:`vol2col`: scatter-add ``(N, C, Kd, Kh, Kw, Do, Ho, Wo)`` back to ``(N, C, D, H, W)``."""
    kernel, out = cols.shape[2:5], cols.shape[5:]
    dx = numpy.zeros(tuple(x_shape), dtype=cols.dtype)
    for (a, i, j), (out_d, out_h, out_w), (in_d, in_h, in_w) in _offsets(kernel, stride, padding, dilation,
                                                                          x_shape[2:], out):
        dx[:, :, in_d, in_h, in_w] += cols[:, :, a, i, j, out_d, out_h, out_w]
    return dx


def _grouped_columns(x, w_shape, stride, padding, dilation, groups, out):
    """Channel-major columns ``(G, Cg Kd Kh Kw, N Do Ho Wo)``, in the workspace: what backward-filter
    multiplies, and forward where a sample's output is small (:func:`_per_sample`)."""
    N, C = x.shape[:2]
    F, Cg, Kd, Kh, Kw = w_shape
    shape = (groups, Cg * Kd * Kh * Kw, N * out[0] * out[1] * out[2])
    if _pointwise((Kd, Kh, Kw), stride, padding):
        cols = _workspace.array((C, N) + out, x.dtype)
        cols[...] = x.transpose(1, 0, 2, 3, 4)  # (C, N, D, H, W): the input is its own columns
        return cols.reshape(shape)
    cols = _workspace.array((C, Kd, Kh, Kw, N) + out, x.dtype)
    return _channel_major_columns(x, (Kd, Kh, Kw), stride, padding, dilation, out, cols).reshape(shape)


def _to_channel_major(a, groups):
    """``(N, F, Do, Ho, Wo)`` -> ``(G, F/G, N Do Ho Wo)``: one transposed copy."""
    F = a.shape[1]
    return numpy.ascontiguousarray(a.transpose(1, 0, 2, 3, 4)).reshape(groups, F // groups, -1)


def _padded_shape(x_shape, pads):
    return tuple(x_shape[:2]) + tuple(x_shape[2 + a] + sum(pads[a]) for a in range(3))


def conv3d_forward(x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """``y = conv3d(x, w) + b``: ``(N, C, D, H, W), (F, C/g, Kd, Kh, Kw), (F,)`` -> ``(N, F, Do, Ho, Wo)``."""
    checks.forward_arrays(x, w, b, dims=3)
    if padding_mode != "zeros":  # torch.nn.Conv3d's way: pad explicitly, then no padding
        pads = padding_modes.pads_of(x.shape, w.shape, stride, padding, dilation, padding_mode)
        return conv3d_forward(padding_modes.pad(x, pads, padding_mode), w, b, stride=stride, dilation=dilation,
                              groups=groups)
    stride, padding, dilation, groups, out = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups,
                                                                  dims=3)
    N, C, D, H, W = x.shape
    F, Cg, Kd, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    w_g = w.reshape(G, Fg, Cg * Kd * Kh * Kw)
    if _pointwise((Kd, Kh, Kw), stride, padding):
        y = numpy.matmul(w_g, x.reshape(N, G, Cg, D * H * W))  # (N, G, Fg, D*H*W): w @ x[n], no columns
        y = y.reshape(N, F, *out)
    elif _per_sample(out):  # (N, C, Kd, Kh, Kw, Do, Ho, Wo), in the workspace: they die in this call
        cols = _columns(x, (Kd, Kh, Kw), stride, padding, dilation, out, _workspace.array((N, C, Kd, Kh, Kw) + out, x.dtype))
        y = numpy.matmul(w_g, cols.reshape(N, G, Cg * Kd * Kh * Kw, -1))  # (N, G, Fg, Do*Ho*Wo): w[g] @ cols[n, g]
        y = y.reshape(N, F, *out)
    else:  # a small output per sample: one product over the batch, then y to (N, F, ...)
        cols = _grouped_columns(x, w.shape, stride, padding, dilation, groups, out)  # (G, CgKKK, N*Do*Ho*Wo)
        y = numpy.matmul(w_g, cols)  # (G, Fg, N*Do*Ho*Wo): w[g] @ cols[g]
        y = numpy.ascontiguousarray(y.reshape(F, N, *out).transpose(1, 0, 2, 3, 4))
    if b is not None:
        y += b.reshape(1, F, 1, 1, 1)
    return y


def conv3d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """``dx`` from ``dy (N, F, Do, Ho, Wo)`` and ``w (F, C/g, Kd, Kh, Kw)``: ``(N, C, D, H, W) = x_shape``."""
    if padding_mode != "zeros":  # the gradient of the padded input, then the adjoint of the padding
        checks.array(w, "w", 5)
        x_shape = checks.shape5(x_shape, "x_shape")
        pads = padding_modes.pads_of(x_shape, w.shape, stride, padding, dilation, padding_mode)
        dx_padded = conv3d_backward_data(dy, w, _padded_shape(x_shape, pads), stride=stride, dilation=dilation,
                                         groups=groups)
        return padding_modes.pad_adjoint(dx_padded, x_shape, pads, padding_mode)
    checks.array(dy, "dy", 5)
    checks.array(w, "w", 5)
    checks.same_dtype(dy=dy, w=w)
    x_shape = checks.shape5(x_shape, "x_shape")
    stride, padding, dilation, groups, out = checks.conv_geometry(x_shape, w.shape, stride, padding, dilation, groups,
                                                                  dims=3)
    checks.dy_shape(dy, x_shape, w.shape, out)
    N, C, D, H, W = x_shape
    F, Cg, Kd, Kh, Kw = w.shape
    G, Fg = groups, F // groups
    w_t = w.reshape(G, Fg, Cg * Kd * Kh * Kw).transpose(0, 2, 1)  # (G, CgKKK, Fg)
    if _pointwise((Kd, Kh, Kw), stride, padding):
        dx = numpy.matmul(w_t, dy.reshape(N, G, Fg, D * H * W))  # (N, G, Cg, D*H*W): w.T @ dy[n]
        return dx.reshape(N, C, D, H, W)
    if _per_sample(out):
        dcols = _workspace.array((N, G, Cg * Kd * Kh * Kw, out[0] * out[1] * out[2]), dy.dtype)  # dies in this call
        numpy.matmul(w_t, dy.reshape(N, G, Fg, -1), out=dcols)  # w[g].T @ dy[n, g]
        return col2vol(dcols.reshape(N, C, Kd, Kh, Kw, *out), x_shape, stride, padding, dilation)
    dcols = numpy.matmul(w_t, _to_channel_major(dy, groups))  # (G, CgKKK, N*Do*Ho*Wo): w[g].T @ dy[g], all samples
    dcols = dcols.reshape(C, Kd, Kh, Kw, N, *out).transpose(4, 0, 1, 2, 3, 5, 6, 7)  # (N, C, Kd, Kh, Kw, Do, Ho, Wo), a view
    return col2vol(dcols, x_shape, stride, padding, dilation)


def conv3d_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """``dw (F, C/g, Kd, Kh, Kw) = w_shape`` from ``x (N, C, D, H, W)`` and ``dy (N, F, Do, Ho, Wo)``."""
    checks.array(x, "x", 5)
    if padding_mode != "zeros":
        pads = padding_modes.pads_of(x.shape, checks.shape5(w_shape, "w_shape"), stride, padding, dilation,
                                     padding_mode)
        return conv3d_backward_filter(padding_modes.pad(x, pads, padding_mode), dy, w_shape, stride=stride,
                                      dilation=dilation, groups=groups)
    checks.array(dy, "dy", 5)
    checks.same_dtype(x=x, dy=dy)
    w_shape = checks.shape5(w_shape, "w_shape")
    stride, padding, dilation, groups, out = checks.conv_geometry(x.shape, w_shape, stride, padding, dilation, groups,
                                                                  dims=3)
    checks.dy_shape(dy, x.shape, w_shape, out)
    F, Cg, Kd, Kh, Kw = w_shape
    cols = _grouped_columns(x, w_shape, stride, padding, dilation, groups, out)  # (G, CgKKK, N*Do*Ho*Wo)
    dw = numpy.matmul(_to_channel_major(dy, groups), cols.transpose(0, 2, 1))  # (G, Fg, CgKKK)
    return dw.reshape(F, Cg, Kd, Kh, Kw)


def conv3d_backward_bias(dy):
    """``db[f] = sum over n, d, h, w of dy[n, f, d, h, w]``: ``(N, F, Do, Ho, Wo)`` -> ``(F,)``."""
    checks.array(dy, "dy", 5)
    return dy.sum(axis=(0, 2, 3, 4))
