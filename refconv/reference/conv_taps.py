"""Convolution with stride 1 as an implicit GEMM: one product per kernel tap, no columns.

:mod:`refconv.reference.conv` builds ``Kh*Kw`` copies of the input (im2col) and
multiplies once.  With stride 1 the copies are not needed: lay the input out
channels-last, padded and flattened into one matrix of rows, and each kernel tap
``(i, j)`` reads a contiguous block of rows at a fixed offset.  Every pass is then
a sum over taps of ordinary matrix products.

The rows.  Sample ``n``'s pixel ``(h, w)`` is row ``(n Hs + ph + h) Wp + pw + w``
of an ``(rows, C)`` matrix, where ``Wp = W + pw`` and ``Hs = H + ph``: each image
row is preceded by ``pw`` zero rows and each sample by ``ph`` zero image rows.
The zeros that precede a row or a sample are also the right and bottom padding
of the one before it, so the padding is stored once.  An output pixel
``(oh, ow)`` of sample ``n`` is computed at row ``q = (n Hs + oh) Wp + ow`` of an
``(M, F)`` matrix with ``M = N Hs Wp``, and its tap ``(i, j)`` reads input row
``q + i dh Wp + j dw``::

    forward          y[q]          = sum over taps t of x_rows[q + offset_t] @ w_t        (C -> F)
    backward-data    dx_rows[p]    = sum over taps t of dy_rows[p - offset_t] @ w_t.T    (F -> C)
    backward-filter  dw_t          = x_rows[offset_t : offset_t + M].T @ dy_rows          (C x F per tap)

where ``w_t = w[:, :, i, j].T`` is ``(C, F)``.  Rows ``q`` with ``oh >= Ho`` or
``ow >= Wo`` are computed and dropped (forward), and hold zeros in ``dy_rows`` so
that they add nothing (both backward passes): ``Hs Wp / (Ho Wo)`` is the work
done over the useful work, 1.06 for 3x3 'same' on 32x32 and 1.13 on 16x16.
Backward-data is the forward with the offsets mirrored (a full convolution with
the flipped kernel).  The one transposed copy in and out of NCHW is the only copy
of the input.

The sums.  NumPy's matmul cannot accumulate into its output, so forward and
backward-data run over blocks of :data:`ROW_BLOCK` output rows: each tap's
product goes to a small buffer and is added to the block while both are in the
cache.  Backward-filter runs over the same blocks of ``dy``'s rows, each read
from memory once for all the taps, and adds each tap's ``(C, F)`` product to its
``dw_t`` (10-20% faster than one product per tap over all ``M`` rows).

:func:`takes_taps` is the rule :mod:`refconv.reference.conv` follows to pick this
path; docs/reference.md ("The formulations of convolution") gives the measurements
behind it.  The loop oracle (:mod:`refconv.reference.conv_loops`) checks both paths.
"""

import numpy

ROW_BLOCK = 512  # rows per block of the tap sums: a block and its product buffer stay in L2
MIN_CHANNELS = 16  # fewer channels (per group) in or out: each tap's product is too thin, im2col is faster
MAX_IN_CHANNELS = 256  # per group: the most measured (256 -> 128 on 16x16 was 1.1-1.2x faster than im2col)
MAX_OUT_CHANNELS = 128  # per group: with 256 out im2col was faster (0.84-0.97x), its copies a smaller share


def takes_taps(x_shape, w_shape, stride, padding, dilation, groups, out_hw):
    """The rule: this path, not im2col, for a stride-1 convolution with a kernel larger than 1x1,
    :data:`MIN_CHANNELS` to :data:`MAX_IN_CHANNELS` input and :data:`MIN_CHANNELS` to
    :data:`MAX_OUT_CHANNELS` output channels per group, and padding the layout holds (the
    high-side pad no larger than the low side's, nor than the kernel's reach)."""
    (_, C, H, W), (F, _, Kh, Kw) = x_shape, w_shape
    Cg, Fg = C // groups, F // groups
    if stride != (1, 1) or (Kh, Kw) == (1, 1):
        return False
    if not (MIN_CHANNELS <= Cg <= MAX_IN_CHANNELS and MIN_CHANNELS <= Fg <= MAX_OUT_CHANNELS):
        return False
    return all(_layout_holds(*axis) for axis in zip((H, W), out_hw, (Kh, Kw), padding, dilation))


def _layout_holds(size, out, kernel, pad, dilation):
    """Along one axis: the dropped outputs fit in the padded length (``out <= size + pad``) and the
    last tap of the last output reads at most ``pad`` past the image (the next row's zeros)."""
    return out <= size + pad and out + (kernel - 1) * dilation <= size + 2 * pad


class Rows:
    """The row layout of one convolution (see the module docstring): ``Wp``, ``Hs``, ``M`` and
    the row offset of each tap, taps in ``(i, j)`` order."""

    def __init__(self, x_shape, kernel, padding, dilation):
        self.N, _, H, W = x_shape
        (Kh, Kw), (ph, pw), (dh, dw) = kernel, padding, dilation
        self.Wp, self.Hs = W + pw, H + ph
        self.M = self.N * self.Hs * self.Wp  # output rows computed, dropped ones included
        self.lead = ph * self.Wp + pw  # the row of sample 0's pixel (0, 0)
        self.offsets = [i * dh * self.Wp + j * dw for i in range(Kh) for j in range(Kw)]

    def pack(self, a, lead, total):
        """``a (N, C, h, w)`` -> ``(total, C)`` rows, zero but for pixel ``(n, h, w)`` at row
        ``lead + (n Hs + h) Wp + w``: one transposed copy."""
        N, C, h, w = a.shape
        rows = numpy.zeros((total, C), dtype=a.dtype)
        rows[lead:lead + self.M].reshape(N, self.Hs, self.Wp, C)[:, :h, :w] = a.transpose(0, 2, 3, 1)
        return rows

    def unpack(self, rows, hw):
        """The inverse of :meth:`pack` with ``lead = 0``: ``(M, C)`` rows -> ``(N, C, h, w)``, contiguous."""
        C = rows.shape[1]
        grid = rows[:self.M].reshape(self.N, self.Hs, self.Wp, C)[:, :hw[0], :hw[1]]
        return numpy.ascontiguousarray(grid.transpose(0, 3, 1, 2))


def tap_weights(w, groups):
    """``w (F, C/g, Kh, Kw)`` -> ``(G, Kh Kw, C/g, F/g)``: each group's ``w_t``, the ``(C, F)`` matrix of tap t."""
    F, Cg, Kh, Kw = w.shape
    return numpy.ascontiguousarray(w.reshape(groups, F // groups, Cg, Kh * Kw).transpose(0, 3, 2, 1))


def shifted_products(src, offsets, weights, out):
    """``out[q] = sum over t of src[q + offsets[t]] @ weights[t]`` for every row ``q`` of ``out``, in
    blocks of :data:`ROW_BLOCK` rows.  ``src (>= M + max(offsets), K)``, ``weights (T, K, F)``,
    ``out (M, F)`` (any view whose rows are BLAS-strided, e.g. one group's columns).  A block and
    the product buffer stay in the cache while the taps are added."""
    M = out.shape[0]
    product = numpy.empty((ROW_BLOCK, weights.shape[2]), dtype=out.dtype)
    for start in range(0, M, ROW_BLOCK):
        stop = min(M, start + ROW_BLOCK)
        block, extra = out[start:stop], product[:stop - start]
        numpy.matmul(src[start + offsets[0]:stop + offsets[0]], weights[0], out=block)
        for offset, w_t in zip(offsets[1:], weights[1:]):
            numpy.matmul(src[start + offset:stop + offset], w_t, out=extra)
            block += extra
    return out


def _groups(total, groups):
    """The column slice of each of ``groups`` equal groups of ``total`` channels."""
    size = total // groups
    return [slice(g * size, (g + 1) * size) for g in range(groups)]


def forward(x, w, padding, dilation, groups, out_hw):
    """``conv2d(x, w)`` with stride 1: ``(N, C, H, W), (F, C/g, Kh, Kw)`` -> ``(N, F, Ho, Wo)``."""
    F = w.shape[0]
    rows = Rows(x.shape, w.shape[2:], padding, dilation)
    x_rows = rows.pack(x, rows.lead, rows.M + rows.offsets[-1])  # (M + max offset, C)
    w_taps = tap_weights(w, groups)  # (G, T, Cg, Fg)
    y_rows = numpy.empty((rows.M, F), dtype=x.dtype)  # (M, F)
    for g, (cs, fs) in enumerate(zip(_groups(x.shape[1], groups), _groups(F, groups))):
        shifted_products(x_rows[:, cs], rows.offsets, w_taps[g], y_rows[:, fs])
    return rows.unpack(y_rows, out_hw)


def backward_data(dy, w, x_shape, padding, dilation, groups):
    """``dx (N, C, H, W) = x_shape`` of a stride-1 convolution, from ``dy (N, F, Ho, Wo)`` and ``w``."""
    C = x_shape[1]
    rows = Rows(x_shape, w.shape[2:], padding, dilation)
    reach = rows.offsets[-1]
    # dx_rows[lead + q] = sum over t of dy_rows[lead + q - offset_t]: with dy packed `reach` rows
    # down, that is row q + (lead + reach - offset_t) of dy_ext, so the offsets are mirrored.
    dy_ext = rows.pack(dy, reach, rows.M + rows.lead + reach)  # (M + lead + reach, F)
    mirrored = [rows.lead + reach - offset for offset in rows.offsets]
    w_taps = tap_weights(w, groups).transpose(0, 1, 3, 2)  # (G, T, Fg, Cg): w_t.T
    dx_rows = numpy.empty((rows.M, C), dtype=dy.dtype)  # row q: the input pixel at row lead + q
    for g, (cs, fs) in enumerate(zip(_groups(C, groups), _groups(dy.shape[1], groups))):
        shifted_products(dy_ext[:, fs], mirrored, w_taps[g], dx_rows[:, cs])
    return rows.unpack(dx_rows, x_shape[2:])


def backward_filter(x, dy, w_shape, padding, dilation, groups):
    """``dw (F, C/g, Kh, Kw) = w_shape`` of a stride-1 convolution, from ``x`` and ``dy``."""
    F, Cg, Kh, Kw = w_shape
    rows = Rows(x.shape, (Kh, Kw), padding, dilation)
    x_rows = rows.pack(x, rows.lead, rows.M + rows.offsets[-1])  # (M + max offset, C)
    dy_rows = rows.pack(dy, 0, rows.M)  # (M, F), zero on the dropped rows
    dw_taps = numpy.zeros((groups, Kh * Kw, Cg, F // groups), dtype=x.dtype)  # (G, T, Cg, Fg)
    part = numpy.empty((Cg, F // groups), dtype=x.dtype)
    for g, (cs, fs) in enumerate(zip(_groups(x.shape[1], groups), _groups(F, groups))):
        for start in range(0, rows.M, ROW_BLOCK):  # a block of dy's rows stays in the cache for every tap
            stop = min(rows.M, start + ROW_BLOCK)
            for t, offset in enumerate(rows.offsets):
                numpy.matmul(x_rows[start + offset:stop + offset, cs].T, dy_rows[start:stop, fs], out=part)
                dw_taps[g, t] += part
    return numpy.ascontiguousarray(dw_taps.transpose(0, 3, 2, 1)).reshape(F, Cg, Kh, Kw)  # (G, Fg, Cg, T)
