"""Padding modes other than zeros, as torch.nn.Conv2d applies them: pad the input explicitly,
then convolve with ``padding=0``.

``padding_mode`` reflect, replicate and circular fill the cells outside the image with
copies of image cells (torch.nn.functional.pad's ``reflect``, ``replicate`` and
``circular``; numpy.pad's ``reflect``, ``edge`` and ``wrap``).  Padding is then a
gather of image cells, and its adjoint, for the gradient, a scatter-add: a cell copied
into the padding receives the gradient of each of its copies.

This is the serial oracle of the distributed halo (:func:`refconv.halo.source_index`
computes the same copies by arithmetic, independently of numpy.pad).
"""

import numpy

from refconv import checks

NUMPY_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}  # torch's name -> numpy.pad's


def pads_of(x_shape, w_shape, stride, padding, dilation, padding_mode):
    """``((top, bottom), (left, right))`` of a convolution (one ``(low, high)`` per spatial dim:
    three for a 3-D one), checked against ``padding_mode`` (reflect pads shorter than the
    input, circular ones no longer: torch's limits)."""
    dims = len(w_shape) - 2
    stride = checks.spatial(stride, "stride", minimum=1, dims=dims)
    dilation = checks.spatial(dilation, "dilation", minimum=1, dims=dims)
    pads = checks.conv_padding(padding, tuple(w_shape[2:]), stride, dilation)
    checks.padding_mode(padding_mode, pads, tuple(x_shape[2:]))
    return pads


def _sources(x_shape, pads, mode):
    """The image row (and column, and plane in 3-D) each row (and column, ...) of the padded input holds."""
    return tuple(numpy.pad(numpy.arange(x_shape[2 + a]), pads[a], mode=NUMPY_MODES[mode]) for a in range(len(pads)))


def pad(x, pads, mode):
    """``x (N, C, H, W)`` -> ``(N, C, top + H + bottom, left + W + right)``, the padding filled by ``mode``
    (and likewise ``(N, C, D, H, W)`` with three pairs of pads)."""
    return x[(slice(None), slice(None)) + numpy.ix_(*_sources(x.shape, pads, mode))]


def pad_adjoint(dx_padded, x_shape, pads, mode):
    """The adjoint of :func:`pad`: each padded cell's gradient added to the image cell it copies."""
    dx = numpy.zeros(tuple(x_shape), dtype=dx_padded.dtype)
    numpy.add.at(dx, (slice(None), slice(None)) + numpy.ix_(*_sources(x_shape, pads, mode)), dx_padded)
    return dx
