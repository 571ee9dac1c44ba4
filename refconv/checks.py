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


class ArgumentError(ValueError):
    """A bad argument to one of refconv's own functions (a ``ValueError``), caught before it reaches MPI:
    the same mistake on any backend, real ranks or simulated ones (the MPI zoo counts it as detected)."""


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


# The spatial dims of a 2-D (NCHW) and a 3-D (NCDHW) convolution: how a tuple of one
# value per dim is called in messages, and the dims' letters.
SPATIAL_TUPLE = {2: "an (h, w) pair", 3: "a (d, h, w) triple"}
DIM_NAMES = {2: "HW", 3: "DHW"}


def pair(value, name, *, minimum):
    """Normalise an int or an (h, w) pair to a tuple of two ints >= minimum."""
    return spatial(value, name, minimum=minimum, dims=2)


def triple(value, name, *, minimum):
    """Normalise an int or a (d, h, w) triple to a tuple of three ints >= minimum."""
    return spatial(value, name, minimum=minimum, dims=3)


def spatial(value, name, *, minimum, dims):
    """Normalise an int, or one int per spatial dim, to a tuple of ``dims`` ints >= minimum."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (int(value),) * dims
    try:
        values = tuple(value)
    except TypeError:
        values = None
    # type(v) is int: the common case, without the slower check of the numbers.Integral ABC (checks run on
    # every call of the reference and of every layer)
    if values is None or len(values) != dims or \
            any(type(v) is not int and (isinstance(v, bool) or not isinstance(v, numbers.Integral)) for v in values):
        raise ValueError(f"{name}: expected an int or {SPATIAL_TUPLE[dims]} of ints, got {value!r}")
    if min(values) < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name}: expected {kind} integers, got {tuple(int(v) for v in values)}")
    return tuple(int(v) for v in values)


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
    dtypes = {v.dtype for v in named.values()}       # dtype objects: str() of one takes microseconds
    if len(dtypes) > 1:
        listing = ", ".join(f"{k}={v.dtype}" for k, v in named.items())
        raise ValueError(f"mixed dtypes: expected one dtype for all arrays, got {listing}")
    return next(iter(named.values())).dtype


def forward_arrays(x, w, b, dims=2):
    """The arrays of a convolution forward: ``x`` and ``w`` with ``2 + dims`` dims, an ``(F,)`` bias, one dtype."""
    batched, unbatched = {2: ("(N, C, H, W)", "(C, H, W)"), 3: ("(N, C, D, H, W)", "(C, D, H, W)")}[dims]
    if getattr(x, "ndim", None) == dims + 1:
        raise ValueError(f"x: expected {dims + 2} dimensions {batched}, got shape {tuple(x.shape)}: an unbatched "
                         f"{unbatched} input, which torch also takes, is not supported; pass x[None]")
    array(x, "x", dims + 2)
    array(w, "w", dims + 2)
    if b is not None:
        array(b, "b", 1)
        if b.shape[0] != w.shape[0]:
            raise ValueError(f"b: expected shape ({w.shape[0]},) to match F of w, got {tuple(b.shape)}")
    same_dtype(x=x, w=w, b=b)


def shape4(shape, name):
    """A 4-tuple of positive ints (an NCHW or FCKhKw shape)."""
    return shape_of(shape, name, 4)


def shape5(shape, name):
    """A 5-tuple of positive ints (an NCDHW or FCKdKhKw shape)."""
    return shape_of(shape, name, 5)


def activation_shape(shape, name):
    """The shape of images ``(N, C, H, W)`` or of volumes ``(N, C, D, H, W)``: what a layer that
    takes either (a container, a Redistribute, a model) checks; each layer in it checks its own dims."""
    return shape_of(shape, name, 5 if hasattr(shape, "__len__") and len(shape) == 5 else 4)


def shape_of(shape, name, ndim):
    """An ``ndim``-tuple of positive ints."""
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"{name}: expected a {ndim}-tuple of ints, got {shape!r}") from None
    if len(shape) == ndim and min(shape) == 0:
        raise ValueError(f"{name}: expected {ndim} positive sizes, got {shape}: torch returns an empty result for an "
                         f"empty batch or image, refconv does not run empty tensors; skip the call when a size is 0")
    if len(shape) != ndim or min(shape) < 1:
        raise ValueError(f"{name}: expected {ndim} positive sizes, got {shape}")
    return shape


PADDING_STRINGS = ("same", "valid")
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def conv_padding(padding, kernel, stride, dilation):
    """``((top, bottom), (left, right))``: the pads of each spatial dim, as torch.nn.Conv2d takes
    ``padding``: an int, an ``(h, w)`` pair, ``'valid'`` (none) or ``'same'`` (output size = input
    size; ``d (K - 1)`` in all, the odd one on the high side, as torch pads it; stride 1 only).
    With a 3-D ``kernel``, one ``(low, high)`` pair per dim of ``(d, h, w)``, as torch.nn.Conv3d.
    """
    dims = len(kernel)
    if isinstance(padding, str):
        one_of(padding, "padding", PADDING_STRINGS)
        if padding == "valid":
            return ((0, 0),) * dims
        if tuple(stride) != (1,) * dims:
            raise ValueError(f"padding: padding='same' is not supported for strided convolutions "
                             f"(got stride={tuple(stride)}); use stride=1 or give padding as integers")
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in total)
    return tuple((p, p) for p in spatial(padding, "padding", minimum=0, dims=dims))


def padding_mode(mode, pads, in_hw):
    """``mode`` if it is one of :data:`PADDING_MODES` and the pads fit it as torch requires:
    reflect pads shorter than the input, circular pads no longer than it."""
    one_of(mode, "padding_mode", PADDING_MODES)
    for (lo, hi), size, dim in zip(pads, in_hw, DIM_NAMES[len(pads)]):
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


def conv_geometry(x_shape, w_shape, stride, padding, dilation, groups, dims=2):
    """Validate a convolution and return its normalised parameters.

    Returns ``(stride, padding, dilation, groups, (Ho, Wo))`` with ``padding`` the low-side
    pads ``(top, left)``: output pixel ``(oh, ow)`` reads input ``(oh*sh - top + i*dh, ...)``;
    the high-side pads (they differ for ``'same'`` with an even dilated kernel) only make
    ``(Ho, Wo)`` longer.  ``padding`` as :func:`conv_padding` takes it.  With ``dims=3``
    (NCDHW, ``w`` of ``F x C/groups x Kd x Kh x Kw``) every spatial tuple has three entries,
    ``(d, h, w)``, and the output size is ``(Do, Ho, Wo)``.
    """
    x_shape = shape_of(x_shape, "x_shape", dims + 2)
    w_shape = shape_of(w_shape, "w_shape", dims + 2)
    (N, C), (F, Cg), kernel = x_shape[:2], w_shape[:2], w_shape[2:]
    stride = spatial(stride, "stride", minimum=1, dims=dims)
    dilation = spatial(dilation, "dilation", minimum=1, dims=dims)
    pads = conv_padding(padding, kernel, stride, dilation)
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
    out = tuple(conv_output_size(x_shape[2 + a], kernel[a], stride[a], pads[a], dilation[a], DIM_NAMES[dims][a])
                for a in range(dims))
    return stride, tuple(low for low, _ in pads), dilation, groups, out


def dy_shape(dy, x_shape, w_shape, out_hw):
    """``dy`` must be ``(N, F, Ho, Wo)`` (or ``(N, F, Do, Ho, Wo)``) for a convolution of ``x_shape`` by ``w_shape``."""
    expected = (x_shape[0], w_shape[0], *out_hw)
    if tuple(dy.shape) != expected:
        layout = {2: "(N, F, Ho, Wo)", 3: "(N, F, Do, Ho, Wo)"}[len(out_hw)]
        raise ValueError(f"dy: expected shape {expected} {layout}, got {tuple(dy.shape)}")


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
