"""Exercise 4, a reference solution: the halo exchange and its adjoint for any number of spatial axes.

A rank's window and every other rank's block are boxes (a range per axis); a piece is their
intersection, so a corner (or, in a volume, an edge) is simply the box of a diagonal
neighbour that the window overlaps on every axis.  Nothing here is specific to 2 or 3 axes.
"""

import numpy

from refconv import collectives


def _range(L, P, k):
    base, extra = divmod(L, P)
    a = k * base + min(k, extra)
    return a, a + base + (k < extra)

def _boxes(layer, rank):
    """``(owned, window)`` of ``rank``: per axis ``[a, b)`` it owns and ``[lo, hi)`` its outputs read."""
    coords = numpy.unravel_index(rank, layer.grid)
    owned, window = [], []
    for L, P, k, K, s, p, d in zip(layer.size, layer.grid, coords, layer.kernel, layer.stride, layer.padding,
                                   layer.dilation):
        owned.append(_range(L, P, k))
        o0, o1 = _range((L + 2 * p - d * (K - 1) - 1) // s + 1, P, k)
        window.append((o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1))
    return owned, window

def _cut(a, b):
    """The box where boxes ``a`` and ``b`` overlap, or None."""
    box = [(max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b)]
    return box if all(lo < hi for lo, hi in box) else None

def _at(box, origin):
    """``box`` as slices of an array whose first cell is ``origin``'s corner (n, c first)."""
    return (slice(None), slice(None)) + tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(box, origin))

def _pieces(layer, me, P):
    """``(sends, receives)``: {q: box}, the cells of mine q's window reads; of q's my window reads
    (``receives`` holds my own cells too, under ``me``)."""
    mine, my_window = _boxes(layer, me)
    sends, receives = {}, {}
    for q in range(P):
        owned, window = _boxes(layer, q)
        if q != me and _cut(mine, window):
            sends[q] = _cut(mine, window)
        if _cut(owned, my_window):
            receives[q] = _cut(owned, my_window)
    return sends, receives

def halo_exchange(comm, x_loc, layer):
    me, P = comm.rank, comm.size
    mine, window = _boxes(layer, me)
    sends, receives = _pieces(layer, me, P)
    n, c = x_loc.shape[:2]
    got = collectives.exchange(comm, {q: x_loc[_at(box, mine)] for q, box in sends.items()},
                               {q: (n, c) + tuple(hi - lo for lo, hi in box) for q, box in receives.items() if q != me},
                               x_loc.dtype)
    x_win = numpy.zeros((n, c) + tuple(hi - lo for lo, hi in window), dtype=x_loc.dtype)  # zeros: the padding
    for q, box in receives.items():
        x_win[_at(box, window)] = x_loc[_at(box, mine)] if q == me else got[q]
    return x_win

def halo_return(comm, dx_win, layer):
    me, P = comm.rank, comm.size
    mine, window = _boxes(layer, me)
    sends, receives = _pieces(layer, me, P)
    n, c = dx_win.shape[:2]
    got = collectives.exchange(comm, {q: dx_win[_at(box, window)] for q, box in receives.items() if q != me},
                               {q: (n, c) + tuple(hi - lo for lo, hi in box) for q, box in sends.items()}, dx_win.dtype)
    dx_loc = numpy.zeros((n, c) + tuple(b - a for a, b in mine), dtype=dx_win.dtype)
    if me in receives:
        dx_loc[_at(receives[me], mine)] += dx_win[_at(receives[me], window)]
    for q, box in sends.items():
        dx_loc[_at(box, mine)] += got[q]
    return dx_loc

halo_exchange_3d, halo_return_3d = halo_exchange, halo_return  # the same code: boxes have as many axes as x
