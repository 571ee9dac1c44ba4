"""Stationary-W: the weights stay, both activations move (ALGORITHMS.md section 4).

The channel group is factored ``P_c = p_f * p_c'``; channel coordinate
``i = a * p_c' + b``.  ``F_a`` is the union of the F blocks of ranks
``(a, 0..p_c'-1)`` (contiguous) and ``C_b`` the union of the C blocks of ranks
``(0..p_f-1, b)`` (blocks ``b, p_c'+b, ...``: not contiguous unless ``p_f = 1``).

=========  =========================================  ===========================================
tensor     on rank (a, b)                             moved by
=========  =========================================  ===========================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)              forward: allgather over the p_f ranks (., b)
                                                      backward: reduce-scatter over (., b)
w, dw      ``w[F_a, C_b]``  (F_a, C_b, Kh, Kw)        dw: allreduce over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')            forward: reduce-scatter over the p_c' ranks (a, .)
                                                      backward: allgather over (a, .)
=========  =========================================  ===========================================

``p_f = 1`` is Stationary-X and ``p_c' = 1`` is Stationary-Y.  The order of the
gathered ``x`` pieces (by ``a``) is the order of ``C_b`` in the weight, so the
non-contiguous block needs no reordering.
"""

from refconv import collectives
from refconv.distribution import Split
from refconv.spatial import LocalConv


class StationaryW:
    name = "stationary-w"

    def __init__(self, grid, geom, backend, filter_groups):
        self.p_f = filter_groups
        self.p_cp = grid.P_c // filter_groups
        self.comm_f, self.comm_c = grid.stationary_w_comms(filter_groups)  # (., b) and (a, .)
        self.local = LocalConv(grid, geom, backend)
        a, b = divmod(grid.coords[1], self.p_cp)
        c_counts = geom.channel_counts(geom.C, grid.P_c)
        f_counts = geom.channel_counts(geom.F, grid.P_c)
        self.c_counts = [c_counts[k * self.p_cp + b] for k in range(self.p_f)]  # |C_i| of ranks (., b)
        self.f_counts = [f_counts[a * self.p_cp + j] for j in range(self.p_cp)]  # |F_i| of ranks (a, .)

    @staticmethod
    def weight_dims(P_c, filter_groups):
        """``w[F_a, C_b]``: F in blocks ``a*p_c' .. a*p_c'+p_c'-1``, C in blocks ``b, p_c'+b, ...``."""
        return (Split.stationary_w_filters(P_c, filter_groups), Split.stationary_w_channels(P_c, filter_groups), None, None)

    def forward(self, x_loc, w_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_a, C_b, Kh, Kw)
        x_b = collectives.allgather(self.comm_f, x_loc, self.c_counts, axis=1)  # (n, C_b, h, w)
        y_part, self._x_win = self.local.forward(x_b, w_loc)  # (n, F_a, h', w'), partial over C
        return collectives.reduce_scatter(self.comm_c, y_part, self.f_counts, axis=1)  # (n, F_i, h', w')

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        dy_a = collectives.allgather(self.comm_c, dy_loc, self.f_counts, axis=1)  # (n, F_a, h', w')
        dw_loc = self.local.backward_filter(self._x_win, dy_a, w_loc.shape)  # (F_a, C_b, Kh, Kw)
        dx_part = self.local.backward_data(dy_a, w_loc, self._x_win.shape)  # (n, C_b, h, w), partial over F
        dx_loc = collectives.reduce_scatter(self.comm_f, dx_part, self.c_counts, axis=1)  # (n, C_i, h, w)
        return dx_loc, dw_loc
