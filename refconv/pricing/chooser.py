"""``algorithm: auto`` for one bound convolution: the fastest channel algorithm on its grid.

``choose_for_layer`` prices every algorithm (and ``p_f``) of a conv on its grid with
the whole-step model of :mod:`refconv.pricing.perf` (compute and every call, priced by
a machine file) instead of bytes alone.  Without a machine it uses the built-in
default figures and warns so.
"""

from refconv.pricing import graph, machine as machine_mod, perf


def choose_for_layer(in_shape, out_channels, kernel, *, grid_shape, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, padding_mode="zeros", machine=None):
    """``(algorithm, filter_groups, table)`` for a conv of global input ``in_shape`` on a grid
    ``(P_N, P_c, P_H, P_W)`` (for a 3-D conv, ``in_shape`` ``(N, C, D, H, W)`` on a grid
    ``(P_N, P_c, P_D, P_H, P_W)``, ``kernel`` a triple); ``table`` maps ``(algorithm, p_f)`` to
    predicted seconds per forward + backward on the rank with the largest blocks.

    ``machine``: a :class:`refconv.pricing.machine.Machine`, a path or built-in name, or
    None (built-in defaults, with a warning).  With ``P_c = 1`` the answer is
    ``("stationary-x", None, {...})``: the conv is sample/spatial parallel.
    Raises ValueError naming the argument when the layer cannot run on the grid.
    """
    if not isinstance(machine, machine_mod.Machine):
        machine = machine_mod.load(machine)
    spec = {"type": "conv", "out": out_channels, "kernel": tuple(kernel), "stride": stride, "padding": padding,
            "dilation": dilation, "groups": groups, "bias": bias, "padding_mode": padding_mode}
    shape, grid = tuple(in_shape), tuple(grid_shape)
    if len(grid) != len(shape) or len(tuple(kernel)) != len(shape) - 2:
        raise ValueError(f"grid_shape: expected {len(shape)} sizes for input {shape} (and a kernel of "
                         f"{len(shape) - 2}), got {grid} (kernel {tuple(kernel)})")
    layer = graph.Layer.of(spec, shape)
    if min(layer.out_shape[2:]) < 1:
        raise ValueError(f"in_shape: {shape} gives an empty output")
    (N, C), (P_N, P_c) = shape[:2], grid[:2]
    if (P_N > N or P_c > min(C, out_channels)
            or any(p > L for p, L in zip(grid[2:], layer.out_shape[2:]))):
        raise ValueError(f"grid_shape: {grid} leaves a rank an empty block of input {shape} -> {layer.out_shape}")
    choices = perf.candidates(P_c, groups, (C, out_channels)) if P_c > 1 else [("stationary-x", None)]
    table = {}
    for algorithm, p_f in choices:
        cost = perf.layer_cost(layer, grid, machine, algorithm, p_f)
        table[(algorithm, p_f)] = cost.seconds
    (algorithm, p_f), _ = min(table.items(), key=lambda kv: kv[1])
    return algorithm, p_f, table
