"""Exercise 8, a reference solution: the segmented allreduce."""

from refconv import collectives


def weight_peers(comm, grid_shape):
    P_c, P_H, P_W = grid_shape[1:]
    channel = comm.rank // (P_H * P_W) % P_c  # the second coordinate of a row-major (n, c, h, w)
    # one color per channel coordinate: P_c disjoint groups of P / P_c ranks, ordered by world rank
    return collectives.split(comm, channel, comm.rank)


def finish_gradients(peers, dw_loc, db_loc):
    # each group sums its own shard, at the same time as the other groups sum theirs
    return collectives.allreduce(peers, dw_loc), collectives.allreduce(peers, db_loc)
