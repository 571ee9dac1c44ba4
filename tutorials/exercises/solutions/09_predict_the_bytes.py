"""Exercise 9, a reference solution: each algorithm's calls in closed form (docs/algorithms.md section 4)."""

ITEM = 8  # float64


def _block(length, parts, k):
    return length // parts + (k < length % parts)


def predict(algorithm, problem, grid_shape, coords, p_f=None):
    p = problem
    (P_N, P_c), (n_k, c_k) = grid_shape[:2], coords[:2]
    n = _block(p.N, P_N, n_k)  # this rank's samples
    hw, out = p.H * p.W, p.out_hw[0] * p.out_hw[1]
    F_i, C_i = _block(p.F, P_c, c_k), _block(p.C, P_c, c_k)
    K = p.Kh * p.Kw
    peers = P_N  # the weight peers: the ranks of my channel coordinate
    if P_c == 1:  # no channel split: sample parallelism, whatever was asked
        return [("allreduce", peers, p.F * p.C * K * ITEM), ("allreduce", peers, p.F * ITEM)]
    if algorithm == "stationary-x":
        y_full = n * p.F * out * ITEM  # the partial y reduce-scattered, and dy gathered
        calls = [("reduce_scatter", P_c, y_full), ("allgather", P_c, y_full)]
        dw = p.F * C_i * K
    elif algorithm == "stationary-y":
        x_full = n * p.C * hw * ITEM  # x gathered, and the partial dx reduce-scattered
        calls = [("allgather", P_c, x_full), ("reduce_scatter", P_c, x_full)]
        dw = F_i * p.C * K
    else:  # stationary-w: rank c = a p_c' + b
        p_c = P_c // p_f
        a, b = divmod(c_k, p_c)
        C_b = sum(_block(p.C, P_c, k * p_c + b) for k in range(p_f))
        F_a = sum(_block(p.F, P_c, a * p_c + j) for j in range(p_c))
        x_b, y_a = n * C_b * hw * ITEM, n * F_a * out * ITEM
        calls = [("allgather", p_f, x_b), ("reduce_scatter", p_c, y_a), ("allgather", p_c, y_a),
                 ("reduce_scatter", p_f, x_b)]
        dw = F_a * C_b * K
    return calls + [("allreduce", peers, dw * ITEM), ("allreduce", peers, F_i * ITEM)]
