"""Exercise 12, a reference solution: Stationary-Y with the allgather of x replaced by SUMMA's broadcasts.

Each rank j of the channel group broadcasts its block ``x[:, C_j]`` in turn and every rank adds
``x[:, C_j] * w[F_i, C_j]`` into its ``y[:, F_i]``: the sum over C runs as the blocks arrive, and a
rank never needs the whole gathered ``x`` at once to start.  Backward is Stationary-Y's.
"""

from refconv import collectives
from refconv.algorithms.base import Call, ChannelAlgorithm, gradient_records, halo_records, local_blocks, \
    segmented_allreduce


class SummaY(ChannelAlgorithm):
    name = "summa-y"
    weight_layout = ("channel", None, None, None)  # w[F_i, :], as Stationary-Y

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        b, P_c = local_blocks(geom, grid_shape, coords), grid_shape[1]
        exchange, back = halo_records(geom, grid_shape, coords, geom.C)
        c_blocks = [geom.C // P_c + (j < geom.C % P_c) for j in range(P_c)]
        x_blocks = [Call("bcast", P_c, b.n * c_j * b.cells * geom.itemsize) for c_j in c_blocks]
        return (x_blocks + exchange * P_c  # forward: one broadcast (and one halo exchange) per block of x
                + back + [Call("reduce_scatter", P_c, b.n * geom.C * b.cells * geom.itemsize)]  # backward: Y's
                + gradient_records(geom, grid_shape, coords, (b.F_i, geom.C) + geom.kernel))

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_i, C, Kh, Kw); b_loc: (F_i,)
        comm, c0, y_loc, self.x_wins = self.channel_comm, 0, None, []
        for j, c_j in enumerate(self.c_counts):
            x_j = collectives.bcast(comm, x_loc if comm.rank == j else None, root=j)  # (n, C_j, h, w)
            x_win = self.halo.extend(x_j, self.xp)  # (n, C_j, h_win, w_win)
            self.x_wins.append(x_win)  # kept for backward-filter
            part = self.conv(x_win, self.xp.ascontiguousarray(w_loc[:, c0:c0 + c_j]))  # (n, F_i, h', w')
            y_loc = part if y_loc is None else y_loc + part
            c0 += c_j
        return self.add_bias(y_loc, b_loc)

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        x_win = self.xp.concatenate(self.x_wins, axis=1)  # (n, C, h_win, w_win)
        dx_win = self.conv_data(dy_loc, w_loc, x_win.shape)  # partial over F
        dx_part = self.halo.reduce(dx_win, self.xp)  # (n, C, h, w)
        dx_loc = collectives.reduce_scatter(self.channel_comm, dx_part, self.c_counts, axis=1)  # (n, C_i, h, w)
        dw_loc = self.conv_filter(x_win, dy_loc, w_loc.shape)  # (F_i, C, Kh, Kw), partial over n, h', w'
        return (dx_loc,) + segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc))
