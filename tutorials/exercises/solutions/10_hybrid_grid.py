"""Exercise 10, a reference solution: Stationary-X on a sample x channel x height grid."""

import numpy

from refconv import collectives
from tutorials.exercises import kit


def communicators(comm, grid):
    P_N, P_c, P_H = grid
    n, c, h = numpy.unravel_index(comm.rank, grid)
    channel_comm = collectives.split(comm, int(n * P_H + h), comm.rank)  # all but c fixed
    spatial_comm = collectives.split(comm, int(n * P_c + c), comm.rank)  # all but h fixed
    peers = collectives.split(comm, int(c), comm.rank)  # c fixed: the weight peers
    return channel_comm, spatial_comm, peers


def forward(comms, x_loc, w_loc, b_loc, layer):
    channel_comm, spatial_comm, _ = comms
    halo = layer.saved["halo"] = layer.halo(spatial_comm)
    x_win = layer.saved["x_win"] = halo.extend(x_loc, numpy)  # (n, C_c, h_win, w_win): the halo exchange
    y_part = kit.conv_forward(x_win, w_loc, layer.stride, (0, 0), layer.dilation)  # (n, F, h', W'), partial over C
    y_loc = collectives.reduce_scatter(channel_comm, y_part, layer.f_counts, axis=1)  # (n, F_c, h', W')
    return y_loc + b_loc.reshape(1, -1, 1, 1)


def backward(comms, dy_loc, w_loc, layer):
    channel_comm, _, peers = comms
    halo, x_win = layer.saved["halo"], layer.saved["x_win"]
    dy = collectives.allgather(channel_comm, dy_loc, layer.f_counts, axis=1)  # (n, F, h', W')
    dx_win = kit.conv_backward_data(dy, w_loc, x_win.shape, layer.stride, (0, 0), layer.dilation)
    dx_loc = halo.reduce(dx_win, numpy)  # the halo return: (n, C_c, h, W)
    dw_part = kit.conv_backward_filter(x_win, dy, w_loc.shape, layer.stride, (0, 0), layer.dilation)
    # the segmented allreduce: partial over my samples and rows; the peers hold the same shard
    return dx_loc, collectives.allreduce(peers, dw_part), collectives.allreduce(peers, kit.bias_grad(dy_loc))
