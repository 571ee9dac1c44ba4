"""Stationary-X: ``x`` stays, partial ``y`` moves (docs/algorithms.md section 4).

=========  ====================================  =====================================
tensor     on channel-group rank i               moved by
=========  ====================================  =====================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)         forward: halo exchange · backward: halo return
w, dw      ``w[:, C_i]``  (F, C_i, Kh, Kw)       backward: allreduce of dw over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')       forward: reduce-scatter · backward: allgather
b, db      ``b[F_i]``                            backward: allreduce of db over the weight peers
=========  ====================================  =====================================

forward: local conv of ``x[:, C_i]`` with ``w[:, C_i]`` is a partial ``y`` over all
F; a reduce-scatter over the channel group sums the partials and leaves
``y[:, F_i]``.  backward: allgather ``dy[:, F_i]`` into the full ``dy``; then
``dw[:, C_i]`` and ``dx[:, C_i]`` are local.  Cheap when ``F h' w' < C h w``.

Stationary-W (stationary_w.py) extends this class: it runs X's forward and
backward over part of the channel group, between an allgather of ``x`` and a
reduce-scatter of ``dx``.
"""

from refconv import collectives
from refconv.algorithms.base import (Call, ChannelAlgorithm, gradient_records, halo_records, local_blocks,
                                    segmented_allreduce)


class StationaryX(ChannelAlgorithm):
    name = "stationary-x"
    weight_layout = (None, "channel", None, None)  # w[:, C_i]

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """This rank's calls, in order: the halo exchange of x[:, C_i], the reduce-scatter of the
        partial y; the allgather of dy, the halo return, then the segmented allreduce."""
        b, P_c = local_blocks(geom, grid_shape, coords), grid_shape[1]
        exchange, back = halo_records(geom, grid_shape, coords, b.C_i)
        y_full = b.n * geom.F * b.out_cells * geom.itemsize  # the partial y, and the gathered dy
        return (exchange + [Call("reduce_scatter", P_c, y_full)]  # forward
                + [Call("allgather", P_c, y_full)] + back  # backward
                + gradient_records(geom, grid_shape, coords, (geom.F, b.C_i) + geom.kernel))

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F, C_i, Kh, Kw); b_loc: (F_i,) or None
        # halo exchange -> x_win (n, C_i, h_win, w_win), with the interior of y convolved behind it
        self.x_win, y_part = self.conv_behind_halo(x_loc, w_loc)  # (n, F, h', w'), partial over C
        y_loc = collectives.reduce_scatter(self.channel_comm, y_part, self.f_counts, axis=1)  # (n, F_i, h', w')
        return self.add_bias(y_loc, b_loc)

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        dy_full = collectives.allgather(self.channel_comm, dy_loc, self.f_counts, axis=1)  # (n, F, h', w')
        # dx_win: (n, C_i, h_win, w_win); dw_loc: (F, C_i, Kh, Kw) partial over n, h', w'
        # halo return of dx_win -> dx_loc (n, C_i, h, w), with backward-filter behind it
        dx_loc, dw_loc = self.backward_behind_halo(dy_full, w_loc)
        # over the weight peers: summed, or with self.overlap, started (DistConv2d waits for them)
        dw_loc, db_loc = segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc), self.overlap,
                                             self.bucketed)
        return dx_loc, dw_loc, db_loc
