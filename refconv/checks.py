"""Argument checks: the one validator that the reference, the kernels, the layers
and the command line share.

Every check raises ``ValueError`` whose message names the argument and says
what was expected, e.g. ``"stride: expected positive integers, got (0, 1)"``.
Checks of shared input run identically on every rank, before any collective, so
every rank raises the same error and none is left waiting.
"""

import numbers
import os

import numpy

FLOAT_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))


def integer(value, name, *, minimum=1):
    """An int (a bool is not one) of at least ``minimum``, returned as a Python int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = {1: "a positive int", 0: "a non-negative int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name}: expected {what}, got {value!r}")
    return int(value)


def positive_int(value, name):
    """An int >= 1 (a bool is not one), returned as a Python int."""
    return integer(value, name, minimum=1)


def divisors(n):
    """The divisors of ``n``, ascending: what a split of ``n`` ranks may be (for error messages too)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def one_of(value, name, choices):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


def float_dtype(dtype, name="dtype"):
    """``numpy.dtype(dtype)`` if it is float32 or float64."""
    try:
        dtype = numpy.dtype(dtype)
    except TypeError:
        raise ValueError(f"{name}: expected float32 or float64, got {dtype!r}") from None
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected float32 or float64, got {dtype}")
    return dtype


def pair(value, name, *, minimum):
    """Normalise an int or an (h, w) pair to a tuple of two ints >= minimum."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (int(value), int(value))
    try:
        h, w = value
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an int or an (h, w) pair of ints, got {value!r}") from None
    for v in (h, w):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{name}: expected an int or an (h, w) pair of ints, got {value!r}")
    if h < minimum or w < minimum:
        what = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name}: expected {what} integers, got {(int(h), int(w))}")
    return int(h), int(w)


def array(x, name, ndim):
    """Check that ``x`` has ``ndim`` dims and a float32/float64 dtype."""
    if not hasattr(x, "ndim") or not hasattr(x, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected float32 or float64, got {x.dtype}")
    return x


def same_dtype(**arrays):
    """All named arrays (None ignored) share one dtype; returns it."""
    named = {k: v for k, v in arrays.items() if v is not None}
    dtypes = {str(v.dtype) for v in named.values()}
    if len(dtypes) > 1:
        listing = ", ".join(f"{k}={v.dtype}" for k, v in named.items())
        raise ValueError(f"mixed dtypes: expected one dtype for all arrays, got {listing}")
    return next(iter(named.values())).dtype


def forward_arrays(x, w, b):
    """The arrays of a convolution forward: 4-D ``x`` and ``w``, an ``(F,)`` bias, one dtype."""
    if getattr(x, "ndim", None) == 3:
        raise ValueError(f"x: expected 4 dimensions (N, C, H, W), got shape {tuple(x.shape)}: an unbatched "
                         f"(C, H, W) input, which torch also takes, is not supported; pass x[None]")
    array(x, "x", 4)
    array(w, "w", 4)
    if b is not None:
        array(b, "b", 1)
        if b.shape[0] != w.shape[0]:
            raise ValueError(f"b: expected shape ({w.shape[0]},) to match F of w, got {tuple(b.shape)}")
    same_dtype(x=x, w=w, b=b)


def shape4(shape, name):
    """A 4-tuple of positive ints (an NCHW or FCKhKw shape)."""
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"{name}: expected a 4-tuple of ints, got {shape!r}") from None
    if len(shape) == 4 and min(shape) == 0:
        raise ValueError(f"{name}: expected 4 positive sizes, got {shape}: torch returns an empty result for an "
                         f"empty batch or image, refconv does not run empty tensors; skip the call when a size is 0")
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"{name}: expected 4 positive sizes, got {shape}")
    return shape


PADDING_STRINGS = ("same", "valid")
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def conv_padding(padding, kernel, stride, dilation):
    """``((top, bottom), (left, right))``: the pads of each spatial dim, as torch.nn.Conv2d takes
    ``padding``: an int, an ``(h, w)`` pair, ``'valid'`` (none) or ``'same'`` (output size = input
    size; ``d (K - 1)`` in all, the odd one on the high side, as torch pads it; stride 1 only).
    """
    if isinstance(padding, str):
        one_of(padding, "padding", PADDING_STRINGS)
        if padding == "valid":
            return (0, 0), (0, 0)
        if tuple(stride) != (1, 1):
            raise ValueError(f"padding: padding='same' is not supported for strided convolutions "
                             f"(got stride={tuple(stride)}); use stride=1 or give padding as integers")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in total)
    ph, pw = pair(padding, "padding", minimum=0)
    return (ph, ph), (pw, pw)


def padding_mode(mode, pads, in_hw):
    """``mode`` if it is one of :data:`PADDING_MODES` and the pads fit it as torch requires:
    reflect pads shorter than the input, circular pads no longer than it."""
    one_of(mode, "padding_mode", PADDING_MODES)
    for (lo, hi), size, dim in zip(pads, in_hw, "HW"):
        if (mode == "reflect" and max(lo, hi) >= size) or (mode == "circular" and max(lo, hi) > size):
            bound = "shorter than" if mode == "reflect" else "at most"
            raise ValueError(f"padding: padding_mode={mode!r} needs pads {bound} the input along {dim} "
                             f"({size}), got {(lo, hi)}; use smaller padding or padding_mode='zeros'")
    return mode


def conv_output_size(size, kernel, stride, padding, dilation, dim):
    """The output length of one spatial dim, as torch.nn.functional.conv2d computes it.
    ``padding``: an int (both sides) or a ``(low, high)`` pair."""
    low, high = (padding, padding) if isinstance(padding, numbers.Integral) else padding
    span = dilation * (kernel - 1) + 1
    if size + low + high < span:
        raise ValueError(
            f"kernel: the dilated kernel spans {span} along {dim} but the padded input "
            f"is only {size + low + high} long (input {size} + padding {low} + {high})"
        )
    return (size + low + high - span) // stride + 1


def conv_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """Validate a convolution and return its normalised parameters.

    Returns ``(stride, padding, dilation, groups, (Ho, Wo))`` with ``padding`` the low-side
    pads ``(top, left)``: output pixel ``(oh, ow)`` reads input ``(oh*sh - top + i*dh, ...)``;
    the high-side pads (they differ for ``'same'`` with an even dilated kernel) only make
    ``(Ho, Wo)`` longer.  ``padding`` as :func:`conv_padding` takes it.
    """
    N, C, H, W = x_shape = shape4(x_shape, "x_shape")
    F, Cg, Kh, Kw = w_shape = shape4(w_shape, "w_shape")
    stride = pair(stride, "stride", minimum=1)
    dilation = pair(dilation, "dilation", minimum=1)
    pads = conv_padding(padding, (Kh, Kw), stride, dilation)
    groups = positive_int(groups, "groups")
    if C % groups:
        raise ValueError(f"groups: {groups} does not divide the input channels C={C}")
    if F % groups:
        raise ValueError(f"groups: {groups} does not divide the output channels F={F}")
    if Cg != C // groups:
        raise ValueError(
            f"w: expected w.shape[1] = C/groups = {C // groups} input channels per group, "
            f"got w.shape = {tuple(w_shape)} for x.shape = {tuple(x_shape)}"
        )
    Ho = conv_output_size(H, Kh, stride[0], pads[0], dilation[0], "H")
    Wo = conv_output_size(W, Kw, stride[1], pads[1], dilation[1], "W")
    return stride, (pads[0][0], pads[1][0]), dilation, groups, (Ho, Wo)


def dy_shape(dy, x_shape, w_shape, out_hw):
    """``dy`` must be ``(N, F, Ho, Wo)`` for a convolution of ``x_shape`` by ``w_shape``."""
    expected = (x_shape[0], w_shape[0], *out_hw)
    if tuple(dy.shape) != expected:
        raise ValueError(f"dy: expected shape {expected} (N, F, Ho, Wo), got {tuple(dy.shape)}")


def output_file(path, name):
    """A file that a command will write (or append to): its folder must exist and be writable,
    and ``path`` must not be a folder or a read-only file.  Check it at the start, on every
    rank, rather than fail at the end on the one rank that writes."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{name}: {path!r} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise ValueError(f"{name}: the folder {folder!r} does not exist; create it or give a path in one that does")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{name}: {path!r} is not writable here; give a path you may write")
    return path


def output_folder(path, name):
    """A folder that a command will create (if missing) and write into: it must be a folder,
    or not exist under a writable folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name}: {path!r} exists and is not a folder")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: {path!r} is not writable here ({existing!r} is not a writable folder); give "
                         f"a folder you may write")
    return path
