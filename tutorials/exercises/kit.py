"""What your answers may call: the local convolution passes, priced on the logical clock.

Each is :mod:`refconv.reference`'s pass (NumPy, float64 exact enough to compare), and on a
priced run (the score's) it also advances the rank's logical clock by the machine file's
price of that pass, as refconv's own algorithms do (``collectives.priced``).  Use these for
the local convolutions of your answers, so that your time and the reference's are priced
alike.  ``stride``, ``padding``, ``dilation`` are ``(h, w)`` pairs.
"""

from refconv import collectives
from refconv import reference as ref


def conv_forward(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """``y = x * w``: x ``(n, C, h, w)``, w ``(F, C, Kh, Kw)`` -> ``(n, F, h', w')`` (no bias)."""
    y = ref.conv2d_forward(x, w, None, stride=stride, padding=padding, dilation=dilation)
    collectives.priced("conv", "conv_fwd", x.shape, w.shape, y.shape, stride, dilation, 1)
    return y


def conv_backward_data(dy, w, x_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """``dx = dy *T w`` (the transposed convolution): dy ``(n, F, h', w')`` -> ``x_shape``."""
    dx = ref.conv2d_backward_data(dy, w, tuple(x_shape), stride=stride, padding=padding, dilation=dilation)
    collectives.priced("conv", "conv_bwd_data", tuple(x_shape), w.shape, dy.shape, stride, dilation, 1)
    return dx


def conv_backward_filter(x, dy, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """``dw = x * dy`` summed over the samples and output cells: -> ``w_shape``."""
    dw = ref.conv2d_backward_filter(x, dy, tuple(w_shape), stride=stride, padding=padding, dilation=dilation)
    collectives.priced("conv", "conv_bwd_filter", x.shape, tuple(w_shape), dy.shape, stride, dilation, 1)
    return dw


def bias_grad(dy):
    """``db``: dy summed over samples and output cells, ``(n, F, h', w')`` -> ``(F,)``."""
    return ref.conv2d_backward_bias(dy)


class Layer:
    """What a rank knows of its layer besides its arrays: ``C``, ``F``; ``c_counts`` and ``f_counts``,
    the sizes of every channel-group rank's blocks of ``C`` and ``F`` (``numpy.array_split``'s, in
    rank order); ``stride``, ``padding``, ``dilation``; ``p_f`` (Stationary-W's factor of the channel
    group, else None); and ``saved``, a dict your forward may fill for your backward."""

    def __init__(self, C, F, c_counts, f_counts, stride, padding, dilation, p_f=None):
        self.C, self.F, self.c_counts, self.f_counts = C, F, list(c_counts), list(f_counts)
        self.stride, self.padding, self.dilation, self.p_f = tuple(stride), tuple(padding), tuple(dilation), p_f
        self.saved = {}

    @property
    def geometry(self):
        """``dict(stride=..., padding=..., dilation=...)`` for the convolutions above."""
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation)


class HybridLayer(Layer):
    """A :class:`Layer` on a ``grid = (P_N, P_c, P_H)``: also ``size = (H, W)`` and ``out = (H', W')``
    (global), ``kernel = (Kh, Kw)``.  ``halo(spatial_comm)`` is refconv's halo exchange for it
    (:class:`refconv.halo.Halo`: ``extend(x_loc, numpy)`` and its adjoint ``reduce(dx_win, numpy)``),
    whose window is convolved with ``padding=(0, 0)``: the padding is in the window already."""

    def __init__(self, grid, size, out, kernel, **layer):
        super().__init__(**layer)
        self.grid, self.size, self.out, self.kernel = tuple(grid), tuple(size), tuple(out), tuple(kernel)

    def halo(self, spatial_comm):
        from refconv.halo import Halo
        return Halo(spatial_comm, (self.grid[2], 1), self.size, self.out, self.kernel, self.stride, self.padding,
                    self.dilation)


class HaloLayer:
    """What a rank knows of a halo exercise's layer: ``grid`` (ranks per spatial axis, numbered row-major),
    ``size`` (the global extent per axis), ``kernel``, ``stride``, ``padding``, ``dilation`` (per axis)."""

    def __init__(self, grid, size, kernel, stride, padding, dilation):
        self.grid, self.size, self.kernel = tuple(grid), tuple(size), tuple(kernel)
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
