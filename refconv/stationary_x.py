"""Stationary-X: ``x`` stays, partial ``y`` moves (ALGORITHMS.md section 4).

=========  ====================================  =====================================
tensor     on channel-group rank i               moved by
=========  ====================================  =====================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)         halo exchange only
w, dw      ``w[:, C_i]``  (F, C_i, Kh, Kw)       dw: allreduce over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')       forward: reduce-scatter · backward: allgather
=========  ====================================  =====================================

forward: local conv of ``x[:, C_i]`` with ``w[:, C_i]`` is a partial ``y`` over all
F; a reduce-scatter over the channel group sums the partials and leaves
``y[:, F_i]``.  backward: allgather ``dy[:, F_i]`` into the full ``dy``; then
``dw[:, C_i]`` and ``dx[:, C_i]`` are local.  Cheap when ``F h' w' < C h w``.
"""

from refconv import collectives
from refconv.spatial import LocalConv


class StationaryX:
    name = "stationary-x"

    def __init__(self, grid, geom, backend):
        self.comm = grid.channel_comm
        self.local = LocalConv(grid, geom, backend)
        self.f_counts = geom.channel_counts(geom.F, grid.P_c)  # |F_i| for every i

    @staticmethod
    def weight_dims(P_c, filter_groups=None):
        return (None, "channel", None, None)  # w[:, C_i]

    def forward(self, x_loc, w_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F, C_i, Kh, Kw)
        y_part, self._x_win = self.local.forward(x_loc, w_loc)  # y_part: (n, F, h', w'), partial over C
        return collectives.reduce_scatter(self.comm, y_part, self.f_counts, axis=1)  # (n, F_i, h', w')

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        dy_full = collectives.allgather(self.comm, dy_loc, self.f_counts, axis=1)  # (n, F, h', w')
        dw_loc = self.local.backward_filter(self._x_win, dy_full, w_loc.shape)  # (F, C_i, Kh, Kw)
        dx_loc = self.local.backward_data(dy_full, w_loc, self._x_win.shape)  # (n, C_i, h, w)
        return dx_loc, dw_loc
