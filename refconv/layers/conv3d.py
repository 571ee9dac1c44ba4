"""``DistConv3d``: one 3-D convolution split over a process grid of five axes,
``sample x channel x depth x height x width``.

It is :class:`refconv.layers.DistConv2d` with a depth axis, and nothing else: the same
parameters and layouts, and the same algorithm classes (:mod:`refconv.algorithms`),
which see the grid as ``(P_N, P_c, P_D, P_H, P_W)``
(:func:`refconv.algorithms.base.grid_view`):

==========  =====================================  ==========================================
tensor      on rank (n, c, d, h, w)                moved by
==========  =====================================  ==========================================
x, dx       ``x[N_n, C_c, D_d, H_h, W_w]``         forward: halo exchange over depth, height
                                                   and width (faces, edges and corners), plus
                                                   the algorithm's channel collectives
                                                   backward: the halo return, likewise
w, dw       the algorithm's layout of ``F x C``,   backward: allreduce of dw over the weight
            ``Kd x Kh x Kw`` whole                 peers (every axis but channel)
y, dy       ``y[N_n, F_c, D'_d, H'_h, W'_w]``      the algorithm's channel collectives
==========  =====================================  ==========================================

Stationary-X, -Y and -W (``algorithm=``) and sample/spatial parallelism (``P_c = 1``) run
as in 2-D.  ``ProcessGrid(comm, ..., depth=P_D)`` splits depth; a grid without a depth
split (``depth=1``) leaves every rank whole volumes along depth.  Every option of the
serial :func:`refconv.reference.conv3d_forward` is taken: stride, padding (ints, triples,
``'same'``, ``'valid'``), ``padding_mode``, dilation, groups, bias.  ``algorithm='auto'``
asks the planner's chooser when the layer is bound, as in 2-D: it prices X, Y and W (every
``p_f``) on the grid ``(P_N, P_c, P_D, P_H, P_W)`` with ``machine=`` (docs/planning.md).
"""

from refconv.layers.conv import DistConv2d


class DistConv3d(DistConv2d):
    """A 3-D convolution (NCDHW, weights ``F x C/groups x Kd x Kh x Kw``) whose activations and
    weights are split over ``grid``; the arguments of :class:`refconv.layers.DistConv2d`, with
    ``kernel_size``, ``stride``, ``padding`` and ``dilation`` an int or a ``(d, h, w)`` triple and
    ``input_shape`` ``(N, C, D, H, W)``.  ``algorithm``: "stationary-x", "stationary-y",
    "stationary-w" (with ``filter_groups``) or "auto"."""

    dims = 3
    ndim = 5


__all__ = ["DistConv3d"]
