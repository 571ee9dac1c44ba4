"""Exercise 3, a reference solution: a 1-D halo exchange and its adjoint."""

import numpy

from refconv import collectives


def _rows(L, P, r):
    base, extra = divmod(L, P)
    a = r * base + min(r, extra)
    return a, a + base + (r < extra)


def _window(layer, P, r):
    """The rows [lo, hi) rank r's output rows read."""
    (H,), (K,), (s,), (p,), (d,) = layer.size, layer.kernel, layer.stride, layer.padding, layer.dilation
    o0, o1 = _rows((H + 2 * p - d * (K - 1) - 1) // s + 1, P, r)
    return o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1


def _overlaps(layer, P, me):
    """``(sends, receives)``: {q: (a, b)}, the rows of mine q's window reads; of q's mine reads."""
    H = layer.size[0]
    sends, receives = {}, {}
    for q in range(P):
        if q == me:
            continue
        for out, (lo, hi), (a, b) in ((sends, _window(layer, P, q), _rows(H, P, me)),
                                      (receives, _window(layer, P, me), _rows(H, P, q))):
            if max(lo, a) < min(hi, b):
                out[q] = max(lo, a), min(hi, b)
    return sends, receives


def halo_exchange(comm, x_loc, layer):
    P, me = comm.size, comm.rank
    h0, _ = _rows(layer.size[0], P, me)
    lo, hi = _window(layer, P, me)
    sends, receives = _overlaps(layer, P, me)
    n, c = x_loc.shape[:2]
    got = collectives.exchange(comm, {q: x_loc[:, :, a - h0:b - h0] for q, (a, b) in sends.items()},
                               {q: (n, c, b - a) for q, (a, b) in receives.items()}, x_loc.dtype)
    x_win = numpy.zeros((n, c, hi - lo), dtype=x_loc.dtype)  # (n, c, h_win): padding rows stay 0
    pieces = dict(got)
    own = max(lo, h0), min(hi, h0 + x_loc.shape[2])
    if own[0] < own[1]:
        pieces[me] = x_loc[:, :, own[0] - h0:own[1] - h0]
        receives[me] = own
    for q, (a, b) in receives.items():
        x_win[:, :, a - lo:b - lo] = pieces[q]
    return x_win


def halo_return(comm, dx_win, layer):
    P, me = comm.size, comm.rank
    h0, h1 = _rows(layer.size[0], P, me)
    lo, _ = _window(layer, P, me)
    sends, receives = _overlaps(layer, P, me)
    n, c = dx_win.shape[:2]
    # the adjoint moves the same pieces the other way: what I received, I send back to be added there
    got = collectives.exchange(comm, {q: dx_win[:, :, a - lo:b - lo] for q, (a, b) in receives.items()},
                               {q: (n, c, b - a) for q, (a, b) in sends.items()}, dx_win.dtype)
    dx_loc = numpy.zeros((n, c, h1 - h0), dtype=dx_win.dtype)  # (n, c, h_r)
    a, b = max(lo, h0), min(lo + dx_win.shape[2], h1)
    if a < b:
        dx_loc[:, :, a - h0:b - h0] += dx_win[:, :, a - lo:b - lo]
    for q, (a, b) in sends.items():
        dx_loc[:, :, a - h0:b - h0] += got[q]
    return dx_loc
