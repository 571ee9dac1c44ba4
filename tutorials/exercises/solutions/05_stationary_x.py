"""Exercise 5, a reference solution: Stationary-X (x stays, the partial y moves)."""

from refconv import collectives
from tutorials.exercises import kit


def forward(comm, x_loc, w_loc, b_loc, layer):
    layer.saved["x_loc"] = x_loc  # backward-filter reads it
    y_part = kit.conv_forward(x_loc, w_loc, **layer.geometry)  # (n, F, H', W'), a partial sum over C
    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W'), summed
    return y_loc + b_loc.reshape(1, -1, 1, 1)  # the bias once, after the sum


def backward(comm, dy_loc, w_loc, layer):
    x_loc = layer.saved["x_loc"]
    dy = collectives.allgather(comm, dy_loc, layer.f_counts, axis=1)  # (n, F, H', W')
    dx_loc = kit.conv_backward_data(dy, w_loc, x_loc.shape, **layer.geometry)  # (n, C_i, H, W): sums over all F
    dw_loc = kit.conv_backward_filter(x_loc, dy, w_loc.shape, **layer.geometry)  # (F, C_i, Kh, Kw)
    return dx_loc, dw_loc, kit.bias_grad(dy_loc)  # db[F_i]: this rank's own filters
