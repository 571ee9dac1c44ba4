"""Stationary-Y: ``y`` stays, ``x`` moves (docs/algorithms.md section 4).

=========  ====================================  =====================================
tensor     on channel-group rank i               moved by
=========  ====================================  =====================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)         forward: allgather, then halo exchange
                                                 backward: halo return, then reduce-scatter
w, dw      ``w[F_i, :]``  (F_i, C, Kh, Kw)       backward: allreduce of dw over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')       none
b, db      ``b[F_i]``                            backward: allreduce of db over the weight peers
=========  ====================================  =====================================

forward: allgather ``x[:, C_i]`` into the full ``x`` (kept for backward-filter);
``y[:, F_i]`` is then local.  backward: ``dw[F_i, :]`` is local; backward-data
gives a partial ``dx`` over all C, and a reduce-scatter leaves ``dx[:, C_i]``.
Cheap when ``C h w < F h' w'``.
"""

from refconv import collectives
from refconv.algorithms.base import (Call, ChannelAlgorithm, gradient_records, halo_records, local_blocks,
                                    segmented_allreduce)


class StationaryY(ChannelAlgorithm):
    name = "stationary-y"
    weight_layout = ("channel", None, None, None)  # w[F_i, :]
    filter_behind_next = True  # behind the reduce-scatter of dx

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """This rank's calls, in order: the allgather of x, its halo exchange; the halo return of
        the partial dx, its reduce-scatter, then the segmented allreduce."""
        b, P_c = local_blocks(geom, grid_shape, coords), grid_shape[1]
        exchange, back = halo_records(geom, grid_shape, coords, geom.C)
        x_full = b.n * geom.C * b.cells * geom.itemsize  # the gathered x, and the partial dx
        return ([Call("allgather", P_c, x_full)] + exchange  # forward
                + back + [Call("reduce_scatter", P_c, x_full)]  # backward
                + gradient_records(geom, grid_shape, coords, (b.F_i, geom.C) + geom.kernel))

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_i, C, Kh, Kw); b_loc: (F_i,) or None
        x_full = collectives.allgather(self.channel_comm, x_loc, self.c_counts, axis=1)  # (n, C, h, w)
        # halo exchange -> x_win (n, C, h_win, w_win), with the interior of y convolved behind it
        self.x_win, y_loc = self.conv_behind_halo(x_full, w_loc)  # (n, F_i, h', w')
        return self.add_bias(y_loc, b_loc)

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        # dx_win: (n, C, h_win, w_win), partial over F; dw_loc: (F_i, C, Kh, Kw) partial over n, h', w'
        # halo return of dx_win -> dx_part (n, C, h, w), then its reduce-scatter -> dx_loc (n, C_i, h, w),
        # with backward-filter behind the reduce-scatter
        def reduce_scatter(dx_part, overlap):
            return collectives.ireduce_scatter(self.channel_comm, dx_part, self.c_counts, axis=1, overlap=overlap)
        dx_loc, dw_loc = self.backward_behind_halo(dy_loc, w_loc, then=reduce_scatter)
        # over the weight peers: summed, or with self.overlap, started (DistConv2d waits for them)
        dw_loc, db_loc = segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc), self.overlap,
                                             self.bucketed)
        return dx_loc, dw_loc, db_loc
