"""Sample and spatial parallelism (ALGORITHMS.md section 3).

=================  ===========================================  ======================
tensor             layout on rank (n, h, w) of a P_N x P_H x P_W grid   collective
=================  ===========================================  ======================
x, dx              ``x[N_n, :, H_h, W_w]``                       halo exchange (forward),
                                                                 halo return (backward-data)
w, dw, b, db       replicated                                    allreduce of dw, db over
                                                                 the weight peers (all ranks)
y, dy              ``y[N_n, :, H'_h, W'_w]``                     none
=================  ===========================================  ======================

Forward and backward-data are local once each rank holds the input window its
output block reads (:class:`refconv.halo.Halo`); backward-filter gives a partial
sum over the local samples and rows, finished by the layer's segmented
allreduce (here over every rank, since ``P_c = 1``).

:class:`LocalConv` is also the local step of the channel algorithms: each of
Stationary-X, -Y and -W convolves its (gathered) channels through it, which is
how spatial splits compose with all three.
"""

from refconv.halo import Halo


class LocalConv:
    """The convolution of this rank's spatial block: halo-extend, then ``padding=0``.

    ``geom`` is the layer's :class:`refconv.conv.ConvGeometry`.
    """

    def __init__(self, grid, geom, backend):
        self.geom = geom
        self.backend = backend
        self.halo = Halo(
            grid.sub_comm(("height", "width")), (grid.P_H, grid.P_W),
            geom.in_shape[2:], geom.out_shape[2:], geom.w_shape[2:], geom.stride, geom.padding, geom.dilation,
        )

    def _kw(self):
        g = self.geom
        return dict(stride=g.stride, padding=0, dilation=g.dilation, groups=g.groups)

    def forward(self, x_loc, w):
        """``x_loc (n, c, h, w)`` -> ``(y (n, f, h', w'), x_win (n, c, h_win, w_win))``."""
        x_win = self.halo.extend(x_loc, self.backend.xp)  # (n, c, h_win, w_win)
        return self.backend.conv2d_forward(x_win, w, **self._kw()), x_win

    def backward_data(self, dy, w, x_win_shape):
        """``dy (n, f, h', w')`` -> ``dx (n, c, h, w)``: the window's gradient, returned to its owners."""
        dx_win = self.backend.conv2d_backward_data(dy, w, x_win_shape, **self._kw())  # (n, c, h_win, w_win)
        return self.halo.reduce(dx_win, self.backend.xp)

    def backward_filter(self, x_win, dy, w_shape):
        """Partial ``dw`` over this rank's samples and rows."""
        return self.backend.conv2d_backward_filter(x_win, dy, w_shape, **self._kw())


class SampleSpatial:
    """Sample x spatial parallelism with replicated weights (``P_c = 1``).

    forward: halo exchange · backward: halo return, then allreduce of dw (by the layer)
    """

    name = "sample-spatial"

    def __init__(self, grid, geom, backend):
        self.local = LocalConv(grid, geom, backend)
        self.geom = geom

    @staticmethod
    def weight_dims(P_c, filter_groups=None):
        """Every rank holds the whole ``F x C/groups x Kh x Kw`` weight."""
        return (None, None, None, None)

    def forward(self, x_loc, w_loc):
        # x_loc: (n, C, h, w); w_loc: (F, C/groups, Kh, Kw)
        y_loc, self._x_win = self.local.forward(x_loc, w_loc)  # y_loc: (n, F, h', w')
        return y_loc

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F, h', w')
        dw_loc = self.local.backward_filter(self._x_win, dy_loc, w_loc.shape)  # partial over n, h', w'
        dx_loc = self.local.backward_data(dy_loc, w_loc, self._x_win.shape)  # (n, C, h, w)
        return dx_loc, dw_loc
