"""Stationary-Y: ``y`` stays, ``x`` moves (ALGORITHMS.md section 4).

=========  ====================================  =====================================
tensor     on channel-group rank i               moved by
=========  ====================================  =====================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)         forward: allgather · backward: reduce-scatter
w, dw      ``w[F_i, :]``  (F_i, C, Kh, Kw)       dw: allreduce over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')       halo exchange only
=========  ====================================  =====================================

forward: allgather ``x[:, C_i]`` into the full ``x`` (kept for backward-filter);
``y[:, F_i]`` is then local.  backward: ``dw[F_i, :]`` is local; backward-data
gives a partial ``dx`` over all C, and a reduce-scatter leaves ``dx[:, C_i]``.
Cheap when ``C h w < F h' w'``.
"""

from refconv import collectives
from refconv.spatial import LocalConv


class StationaryY:
    name = "stationary-y"

    def __init__(self, grid, geom, backend):
        self.comm = grid.channel_comm
        self.local = LocalConv(grid, geom, backend)
        self.c_counts = geom.channel_counts(geom.C, grid.P_c)  # |C_i| for every i

    @staticmethod
    def weight_dims(P_c, filter_groups=None):
        return ("channel", None, None, None)  # w[F_i, :]

    def forward(self, x_loc, w_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_i, C, Kh, Kw)
        x_full = collectives.allgather(self.comm, x_loc, self.c_counts, axis=1)  # (n, C, h, w)
        y_loc, self._x_win = self.local.forward(x_full, w_loc)  # y_loc: (n, F_i, h', w')
        return y_loc

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        dw_loc = self.local.backward_filter(self._x_win, dy_loc, w_loc.shape)  # (F_i, C, Kh, Kw)
        dx_part = self.local.backward_data(dy_loc, w_loc, self._x_win.shape)  # (n, C, h, w), partial over F
        dx_loc = collectives.reduce_scatter(self.comm, dx_part, self.c_counts, axis=1)  # (n, C_i, h, w)
        return dx_loc, dw_loc
