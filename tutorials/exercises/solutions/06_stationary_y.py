"""Exercise 6, a reference solution: Stationary-Y (y stays, x moves)."""

from refconv import collectives
from tutorials.exercises import kit


def forward(comm, x_loc, w_loc, b_loc, layer):
    x = collectives.allgather(comm, x_loc, layer.c_counts, axis=1)  # (n, C, H, W)
    layer.saved["x"] = x  # kept: backward-filter needs all of C
    y_loc = kit.conv_forward(x, w_loc, **layer.geometry)  # (n, F_i, H', W'), complete: no sum left
    return y_loc + b_loc.reshape(1, -1, 1, 1)


def backward(comm, dy_loc, w_loc, layer):
    x = layer.saved["x"]
    dx_part = kit.conv_backward_data(dy_loc, w_loc, x.shape, **layer.geometry)  # (n, C, H, W), partial over F
    dx_loc = collectives.reduce_scatter(comm, dx_part, layer.c_counts, axis=1)  # (n, C_i, H, W)
    dw_loc = kit.conv_backward_filter(x, dy_loc, w_loc.shape, **layer.geometry)  # (F_i, C, Kh, Kw)
    return dx_loc, dw_loc, kit.bias_grad(dy_loc)
