"""Per-rank communication of one convolution layer, predicted, and the cheapest algorithm.

ALGORITHMS.md section 4 gives, per rank and layer, the buffer ``m`` of every
collective each algorithm makes.  :func:`layer_records` writes those down for
any grid, uneven blocks and halos included, exactly as
:data:`refconv.collectives.stats` records them (``tests/mpi/test_cost_model.py``
checks that prediction against the measurement).  The alpha-beta model then
prices each call:

    ring allgather / reduce-scatter   (q-1) * alpha + (q-1)/q * m * beta
    ring allreduce                    2 (q-1) * alpha + 2 (q-1)/q * m * beta
    halo (point to point)             one alpha per message + bytes * beta

Local compute is the same for X, Y and W (each rank does ``1/P`` of the
FLOPs), so :func:`choose_algorithm` compares communication alone.  It is what
``DistConv2d(algorithm="auto")`` uses.
"""

import dataclasses

import numpy

from refconv.distribution import block_range
from refconv.halo import halo_geometry, halo_pixels

ALPHA = 2e-6  # seconds per message step (a typical inter-node latency)
BETA = 1 / 10e9  # seconds per byte (10 GB/s)


@dataclasses.dataclass(frozen=True)
class Call:
    """One collective as CommStats records it, with its ring-model price."""

    kind: str
    comm_size: int
    bytes: int
    messages: int = 0  # halo only: point-to-point messages sent

    @property
    def wire_bytes(self):
        q = self.comm_size
        if self.kind == "halo":
            return self.bytes
        return (2 if self.kind == "allreduce" else 1) * (q - 1) / q * self.bytes

    def seconds(self, alpha=ALPHA, beta=BETA):
        q = self.comm_size
        steps = self.messages if self.kind == "halo" else (2 if self.kind == "allreduce" else 1) * (q - 1)
        return steps * alpha + self.wire_bytes * beta


def _size(length, parts, index):
    s, e = block_range(length, parts, index)
    return e - s


def layer_records(algorithm, in_shape, out_channels, kernel, *, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                  groups=1, grid_shape=(1, 1, 1, 1), coords=(0, 0, 0, 0), filter_groups=None, bias=True, itemsize=4):
    """The calls one forward + backward of ``DistConv2d`` makes on the rank at ``coords``.

    ``algorithm`` as the layer takes it; with ``P_c = 1`` it is sample/spatial whatever
    its name.  Sizes are global; the rank's blocks follow ``numpy.array_split``.
    """
    N, C, H, W = in_shape
    F = out_channels
    P_N, P_c, P_H, P_W = grid_shape
    c_n, c_c, c_h, c_w = coords
    Kh, Kw = kernel
    out_hw = tuple((L + 2 * p - d * (K - 1) - 1) // s + 1
                   for L, K, s, p, d in zip((H, W), kernel, stride, padding, dilation))
    n = _size(N, P_N, c_n)
    h, w = _size(H, P_H, c_h), _size(W, P_W, c_w)
    ho, wo = _size(out_hw[0], P_H, c_h), _size(out_hw[1], P_W, c_w)
    peers = P_N * P_H * P_W  # the weight peers
    calls = []

    def halo(channels):
        """The halo exchange (forward) and its return (backward-data) of ``channels`` channels."""
        if P_H * P_W == 1:
            return
        owned, window = halo_geometry((P_H, P_W), (H, W), out_hw, kernel, stride, padding, dilation)
        me = c_h * P_W + c_w
        sent, received = halo_pixels(owned, window, me)
        to = sum(1 for r in range(len(owned)) if r != me and owned[me].intersect(window[r]) is not None)
        back = sum(1 for r in range(len(owned)) if r != me and owned[r].intersect(window[me]) is not None)
        calls.append(Call("halo", P_H * P_W, n * channels * sent * itemsize, to))
        calls.append(Call("halo", P_H * P_W, n * channels * received * itemsize, back))

    def gradients(f_rows, c_cols):
        calls.append(Call("allreduce", peers, f_rows * c_cols * Kh * Kw * itemsize))
        if bias:
            calls.append(Call("allreduce", peers, (_size(F, P_c, c_c) if P_c > 1 else F) * itemsize))

    if P_c == 1:
        halo(C)
        gradients(F, C // groups)
        return calls
    C_i, F_i = _size(C, P_c, c_c), _size(F, P_c, c_c)
    if algorithm == "stationary-x":
        halo(C_i)
        m = n * F * ho * wo * itemsize
        calls += [Call("reduce_scatter", P_c, m), Call("allgather", P_c, m)]
        gradients(F, C_i)
    elif algorithm == "stationary-y":
        halo(C)
        m = n * C * h * w * itemsize
        calls += [Call("allgather", P_c, m), Call("reduce_scatter", P_c, m)]
        gradients(F_i, C)
    elif algorithm == "stationary-w":
        p_f = filter_groups
        p_cp = P_c // p_f
        a, b = divmod(c_c, p_cp)
        C_b = sum(_size(C, P_c, k * p_cp + b) for k in range(p_f))
        F_a = sum(_size(F, P_c, a * p_cp + j) for j in range(p_cp))
        halo(C_b)
        x_m, y_m = n * C_b * h * w * itemsize, n * F_a * ho * wo * itemsize
        calls += [Call("allgather", p_f, x_m), Call("reduce_scatter", p_cp, y_m),
                  Call("allgather", p_cp, y_m), Call("reduce_scatter", p_f, x_m)]
        gradients(F_a, C_b)
    else:
        raise ValueError(f"algorithm: expected stationary-x, -y or -w, got {algorithm!r}")
    return calls


def candidates(P_c):
    """``(algorithm, filter_groups)`` pairs worth pricing on a channel group of ``P_c``."""
    out = [("stationary-x", None), ("stationary-y", None)]
    out += [("stationary-w", p_f) for p_f in range(2, P_c) if P_c % p_f == 0]  # p_f = 1 is X, P_c is Y
    return out


def choose_algorithm(in_shape, out_channels, kernel, *, grid_shape, alpha=ALPHA, beta=BETA, **geometry):
    """``(algorithm, filter_groups, table)``: the cheapest channel algorithm for this layer.

    ``table`` maps each candidate to its predicted seconds per iteration, priced on
    the rank with the largest blocks (coordinate 0 everywhere).
    """
    table = {}
    for algorithm, p_f in candidates(grid_shape[1]):
        calls = layer_records(algorithm, in_shape, out_channels, kernel, grid_shape=grid_shape,
                              filter_groups=p_f, **geometry)
        table[(algorithm, p_f)] = sum(c.seconds(alpha, beta) for c in calls)
    (algorithm, p_f), _ = min(table.items(), key=lambda item: item[1])
    return algorithm, p_f, table


def main(argv=None):
    """``python -m refconv.cost_model --shape N C H W --F 64 --K 3 --grid 1 4 1 1``: a table."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m refconv.cost_model", description=main.__doc__)
    parser.add_argument("--shape", type=int, nargs=4, default=(32, 64, 56, 56), metavar=("N", "C", "H", "W"))
    parser.add_argument("--F", type=int, default=64)
    parser.add_argument("--K", type=int, default=3)
    parser.add_argument("--grid", type=int, nargs=4, default=(1, 4, 1, 1), metavar=("P_N", "P_c", "P_H", "P_W"))
    parser.add_argument("--alpha", type=float, default=ALPHA, help="seconds per message step")
    parser.add_argument("--beta", type=float, default=BETA, help="seconds per byte")
    args = parser.parse_args(argv)
    pad = (args.K // 2, args.K // 2)
    best, best_p_f, table = choose_algorithm(tuple(args.shape), args.F, (args.K, args.K), grid_shape=tuple(args.grid),
                                             padding=pad, alpha=args.alpha, beta=args.beta)
    print(f"layer x{tuple(args.shape)} F={args.F} K={args.K} 'same' padding on grid {tuple(args.grid)}, float32")
    for (algorithm, p_f), seconds in sorted(table.items(), key=lambda item: item[1]):
        calls = layer_records(algorithm, tuple(args.shape), args.F, (args.K, args.K), padding=pad,
                              grid_shape=tuple(args.grid), filter_groups=p_f)
        wire = sum(c.wire_bytes for c in calls)
        label = algorithm + (f" p_f={p_f}" if p_f else "")
        mark = "  <- chosen" if (algorithm, p_f) == (best, best_p_f) else ""
        print(f"  {label:20s} {wire / 1e6:10.3f} MB on the wire {seconds * 1e3:9.3f} ms{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
