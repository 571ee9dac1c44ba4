"""Exercise 7, a reference solution: Stationary-W (the weights stay, both activations move)."""

from refconv import collectives
from tutorials.exercises import kit


def groups(comm, layer):
    p_c = comm.size // layer.p_f
    a, b = divmod(comm.rank, p_c)
    gather_comm = collectives.split(comm, b, a)  # the p_f ranks (., b), ordered by a
    reduce_comm = collectives.split(comm, a, b)  # the p_c' ranks (a, .), ordered by b
    return gather_comm, reduce_comm


def _counts(comm, layer):
    """|C| of the ranks (., b) in gather_comm's order, |F| of the ranks (a, .) in reduce_comm's."""
    p_c = comm.size // layer.p_f
    a, b = divmod(comm.rank, p_c)
    return ([layer.c_counts[k * p_c + b] for k in range(layer.p_f)],
            [layer.f_counts[a * p_c + j] for j in range(p_c)])


def forward(comm, x_loc, w_loc, b_loc, layer):
    gather_comm, reduce_comm = layer.saved["comms"] = groups(comm, layer)
    c_counts, f_counts = _counts(comm, layer)
    x_b = collectives.allgather(gather_comm, x_loc, c_counts, axis=1)  # (n, C_b, H, W): blocks in a's order
    layer.saved["x_b"] = x_b
    y_a = kit.conv_forward(x_b, w_loc, **layer.geometry)  # (n, F_a, H', W'), partial over C
    y_loc = collectives.reduce_scatter(reduce_comm, y_a, f_counts, axis=1)  # (n, F_i, H', W')
    return y_loc + b_loc.reshape(1, -1, 1, 1)


def backward(comm, dy_loc, w_loc, layer):
    gather_comm, reduce_comm = layer.saved["comms"]
    c_counts, f_counts = _counts(comm, layer)
    x_b = layer.saved["x_b"]
    dy_a = collectives.allgather(reduce_comm, dy_loc, f_counts, axis=1)  # (n, F_a, H', W')
    dx_b = kit.conv_backward_data(dy_a, w_loc, x_b.shape, **layer.geometry)  # (n, C_b, H, W), partial over F
    dx_loc = collectives.reduce_scatter(gather_comm, dx_b, c_counts, axis=1)  # (n, C_i, H, W)
    dw_loc = kit.conv_backward_filter(x_b, dy_a, w_loc.shape, **layer.geometry)  # (F_a, C_b, Kh, Kw)
    return dx_loc, dw_loc, kit.bias_grad(dy_loc)
