"""Exercise 2, a reference solution: sample parallelism's backward."""

from refconv import collectives
from tutorials.exercises import kit


def backward_data(comm, dy_loc, w, x_loc_shape, stride, padding, dilation):
    # dx[n] reads only sample n's dy and the (replicated) weights: local, no collective
    return kit.conv_backward_data(dy_loc, w, x_loc_shape, stride, padding, dilation)  # (n_i, C, H, W)


def backward_filter(comm, x_loc, dy_loc, w_shape, stride, padding, dilation):
    # dw and db sum over every sample: this rank's share is a partial sum, finished by an allreduce
    dw_part = kit.conv_backward_filter(x_loc, dy_loc, w_shape, stride, padding, dilation)  # (F, C, Kh, Kw)
    db_part = kit.bias_grad(dy_loc)  # (F,)
    return collectives.allreduce(comm, dw_part), collectives.allreduce(comm, db_part)
