"""Sample and spatial parallelism (docs/algorithms.md section 3).

=================  ===========================================  ======================
tensor             layout on rank (n, h, w) of a P_N x P_H x P_W grid   collective
=================  ===========================================  ======================
x, dx              ``x[N_n, :, H_h, W_w]``                       forward: halo exchange
                                                                 backward: halo return
w, dw, b, db       replicated                                    backward: allreduce of dw, db
                                                                 over the weight peers (all ranks)
y, dy              ``y[N_n, :, H'_h, W'_w]``                     none
=================  ===========================================  ======================

forward: the halo exchange gives each rank the input window its output block
reads; the convolution of that window is local.  backward: backward-filter is a
partial sum over the local samples and rows; backward-data gives the window's
gradient, whose halo rows go back to their owners and are added there; the
segmented allreduce (here over every rank, since ``P_c = 1``) finishes dw and db.

Every channel algorithm composes with spatial splits the same way: each one
halo-extends the channels it convolves, in its own module.
"""

from refconv.algorithms.base import Algorithm, gradient_records, halo_records, segmented_allreduce


class SampleSpatial(Algorithm):
    """Sample x spatial parallelism with replicated weights (``P_c = 1``)."""

    name = "sample-spatial"
    asked_as = "stationary-x"  # any algorithm asked for runs it where P_c = 1
    weight_layout = (None, None, None, None)  # every rank holds the whole F x C/groups x Kh x Kw weight

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """This rank's calls, in order: the halo exchange of x; the halo return of dx, then the
        segmented allreduce of dw (and db)."""
        exchange, back = halo_records(geom, grid_shape, coords, geom.C)
        return exchange + back + gradient_records(geom, grid_shape, coords, geom.w_shape)

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C, h, w); w_loc: (F, C/groups, Kh, Kw); b_loc: (F,) or None
        # halo exchange -> x_win (n, C, h_win, w_win), with the interior of y convolved behind it
        self.x_win, y_loc = self.conv_behind_halo(x_loc, w_loc)  # (n, F, h', w')
        return self.add_bias(y_loc, b_loc)

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F, h', w')
        # dx_win: (n, C, h_win, w_win); dw_loc: (F, C/groups, Kh, Kw) partial over n, h', w'
        # halo return of dx_win -> dx_loc (n, C, h, w), with backward-filter behind it
        dx_loc, dw_loc = self.backward_behind_halo(dy_loc, w_loc)
        # over the weight peers: summed, or with self.overlap, started (DistConv2d waits for them)
        dw_loc, db_loc = segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc), self.overlap,
                                             self.bucketed)
        return dx_loc, dw_loc, db_loc
