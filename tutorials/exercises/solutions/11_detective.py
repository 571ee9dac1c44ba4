"""Exercise 11, a reference solution: the detective's code with its three bugs fixed.

tests/docs_and_tutorials/test_exercises.py lists each bug (``BUGS``): the line fixed here and the line the
skeleton had; it plants each back and checks that it is caught.
"""

import itertools

import numpy

from refconv import collectives
from tutorials.exercises import kit


def block(L, P, k):
    """``[a, b)``: block ``k`` of ``L`` split ``P`` ways as ``numpy.array_split`` splits it."""
    base, extra = divmod(L, P)
    a = k * base + min(k, extra)
    return a, a + base + (k < extra)


# -- a 1-D halo: rows, "same" padding -------------------------------------------------------------------
def halo_window(H, P, r, K, s, p, d):
    """The rows ``[lo, hi)`` that rank ``r``'s output rows read."""
    Ho = (H + 2 * p - d * (K - 1) - 1) // s + 1
    o0, o1 = block(Ho, P, r)  # the output rows are split on their own
    return o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1


def halo_exchange(comm, x_loc, layer):
    """``x_loc (n, c, h_r)`` -> the window ``(n, c, hi - lo)`` rank r's output rows read, zeros outside."""
    P, me = comm.size, comm.rank
    (H,), args = layer.size, (layer.kernel[0], layer.stride[0], layer.padding[0], layer.dilation[0])
    lo, hi = halo_window(H, P, me, *args)
    sends, receives = {}, {}
    for q in range(P):
        if q != me:
            q_lo, q_hi = halo_window(H, P, q, *args)
            for out, (a, b), (c, e) in ((sends, (q_lo, q_hi), block(H, P, me)), (receives, (lo, hi), block(H, P, q))):
                if max(a, c) < min(b, e):
                    out[q] = max(a, c), min(b, e)
    h0 = block(H, P, me)[0]
    n, c = x_loc.shape[:2]
    got = collectives.exchange(comm, {q: x_loc[:, :, a - h0:b - h0] for q, (a, b) in sends.items()},
                               {q: (n, c, b - a) for q, (a, b) in receives.items()}, x_loc.dtype)
    x_win = numpy.zeros((n, c, hi - lo), dtype=x_loc.dtype)
    a, b = max(lo, h0), min(hi, h0 + x_loc.shape[2])
    if a < b:
        x_win[:, :, a - lo:b - lo] = x_loc[:, :, a - h0:b - h0]
    for q, (a, b) in receives.items():
        x_win[:, :, a - lo:b - lo] = got[q]
    return x_win


# -- a 3-D halo: every rank whose block my window overlaps -------------------------------------------------
def _boxes(layer, rank):
    coords = numpy.unravel_index(rank, layer.grid)
    owned, window = [], []
    for L, P, k, K, s, p, d in zip(layer.size, layer.grid, coords, layer.kernel, layer.stride, layer.padding,
                                   layer.dilation):
        owned.append(block(L, P, k))
        o0, o1 = block((L + 2 * p - d * (K - 1) - 1) // s + 1, P, k)
        window.append((o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1))
    return owned, window


def _cut(a, b):
    box = [(max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b)]
    return box if all(lo < hi for lo, hi in box) else None


def halo_pieces(layer, me):
    """``(sends, receives)``: {q: box} of the cells of mine rank q's window reads, and of q's mine reads."""
    mine, my_window = _boxes(layer, me)
    sends, receives = {}, {}
    for offset in itertools.product(*(range(-k, P - k) for k, P in zip(numpy.unravel_index(me, layer.grid),
                                                                       layer.grid))):
        if not any(offset):
            continue  # myself
        q = int(numpy.ravel_multi_index(tuple(k + o for k, o in zip(numpy.unravel_index(me, layer.grid), offset)),
                                        layer.grid))
        owned, window = _boxes(layer, q)
        if _cut(mine, window):
            sends[q] = _cut(mine, window)
        if _cut(owned, my_window):
            receives[q] = _cut(owned, my_window)
    return sends, receives


def halo_exchange_3d(comm, x_loc, layer):
    """``x_loc (n, c, d, h, w)`` -> the window ``(n, c, d_win, h_win, w_win)``, zeros outside the volume."""
    mine, window = _boxes(layer, comm.rank)
    sends, receives = halo_pieces(layer, comm.rank)
    def at(box, origin):  # box as slices of an array whose first cell is origin's corner
        return (slice(None),) * 2 + tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))
    n, c = x_loc.shape[:2]
    got = collectives.exchange(comm, {q: x_loc[at(box, mine)] for q, box in sends.items()},
                               {q: (n, c) + tuple(b - a for a, b in box) for q, box in receives.items()}, x_loc.dtype)
    x_win = numpy.zeros((n, c) + tuple(hi - lo for lo, hi in window), dtype=x_loc.dtype)
    own = _cut(mine, window)
    if own:
        x_win[at(own, window)] = x_loc[at(own, mine)]
    for q, box in receives.items():
        x_win[at(box, window)] = got[q]
    return x_win


# -- Stationary-X's forward, with the bias every rank keeps whole -------------------------------------------
def forward(comm, x_loc, w_loc, b, layer):
    """``x_loc (n, C_i, H, W)``, ``w_loc = w[:, C_i]``, ``b (F,)`` (whole on every rank) -> ``y[:, F_i]``."""
    y_part = kit.conv_forward(x_loc, w_loc, **layer.geometry)  # (n, F, H', W'), partial over C
    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W')
    f0 = sum(layer.f_counts[:comm.rank])
    return y_loc + b[f0:f0 + y_loc.shape[1]].reshape(1, -1, 1, 1)  # once, after the sum


# -- what you found ------------------------------------------------------------------------------------------
def suspects():
    return {1: "halo_window", 2: "halo_pieces", 3: "forward"}
