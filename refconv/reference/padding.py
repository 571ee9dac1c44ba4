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
    """``((top, bottom), (left, right))`` of a convolution, checked against ``padding_mode``
    (reflect pads shorter than the input, circular ones no longer: torch's limits)."""
    stride, dilation = checks.pair(stride, "stride", minimum=1), checks.pair(dilation, "dilation", minimum=1)
    pads = checks.conv_padding(padding, tuple(w_shape[2:]), stride, dilation)
    checks.padding_mode(padding_mode, pads, tuple(x_shape[2:]))
    return pads


def _sources(x_shape, pads, mode):
    """The image row (and column) each row (and column) of the padded input holds."""
    return tuple(numpy.pad(numpy.arange(x_shape[2 + a]), pads[a], mode=NUMPY_MODES[mode]) for a in range(2))


def pad(x, pads, mode):
    """``x (N, C, H, W)`` -> ``(N, C, top + H + bottom, left + W + right)``, the padding filled by ``mode``."""
    rows, cols = _sources(x.shape, pads, mode)
    return x[(slice(None), slice(None)) + numpy.ix_(rows, cols)]


def pad_adjoint(dx_padded, x_shape, pads, mode):
    """The adjoint of :func:`pad`: each padded cell's gradient added to the image cell it copies."""
    rows, cols = _sources(x_shape, pads, mode)
    dx = numpy.zeros(tuple(x_shape), dtype=dx_padded.dtype)
    numpy.add.at(dx, (slice(None), slice(None)) + numpy.ix_(rows, cols), dx_padded)
    return dx
