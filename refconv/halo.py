"""Halo exchange for spatially split activations (docs/algorithms.md section 3).

A rank owns input rows ``[h0, h1)`` and columns ``[w0, w1)`` of ``x`` and output
rows ``[o0, o1)`` (columns likewise) of ``y``.  The output rows read the input
window

    [o0*s - p,  (o1 - 1)*s - p + d*(K - 1) + 1)

which may start before row 0 or end past the image (zero padding), and may reach
past the nearest neighbour.  :class:`Halo` computes those windows exactly for
every rank of the spatial group and moves the pieces:

- ``extend(x_loc)``: ``(n, c, h, w)`` -> ``(n, c, h_win, w_win)``, the window with
  pieces received from their owners and zeros outside the image; the local
  convolution (or pooling) then runs with ``padding=0``.
- ``reduce(dx_win)``: the adjoint, ``(n, c, h_win, w_win)`` -> ``(n, c, h, w)``:
  each piece is sent back to its owner and added there.

When the spatial group has one rank, no message is sent: the window is the
zero-padded local block, or the block itself (no copy) when nothing is padded or
cut off.  Only the cells outside the image are filled; every other cell of a
window is written once, by its owner's piece.
"""

import dataclasses

from refconv import collectives
from refconv.distribution import block_range


def input_window(o0, o1, kernel, stride, padding, dilation):
    """The (unclipped) input range ``[lo, hi)`` that output range ``[o0, o1)`` reads."""
    return o0 * stride - padding, (o1 - 1) * stride - padding + dilation * (kernel - 1) + 1


@dataclasses.dataclass(frozen=True)
class Box:
    """A rectangle of rows ``[h0, h1)`` and columns ``[w0, w1)``."""

    h0: int
    h1: int
    w0: int
    w1: int

    def intersect(self, other):
        box = Box(max(self.h0, other.h0), min(self.h1, other.h1), max(self.w0, other.w0), min(self.w1, other.w1))
        return box if box.h0 < box.h1 and box.w0 < box.w1 else None

    def slices(self, origin):
        """Slices of this box inside an array whose element (0, 0) is ``origin``'s corner."""
        return (slice(self.h0 - origin.h0, self.h1 - origin.h0), slice(self.w0 - origin.w0, self.w1 - origin.w0))

    @property
    def shape(self):
        return (self.h1 - self.h0, self.w1 - self.w0)


def halo_geometry(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation):
    """``(owned, window)``: per spatial rank ``h * P_W + w``, the input Box it owns and the
    (unclipped) input Box its output block reads.  Pure geometry, no communication."""
    P_H, P_W = grid_hw
    owned, window = [], []
    for h in range(P_H):
        for w in range(P_W):
            (h0, h1), (w0, w1) = block_range(in_hw[0], P_H, h), block_range(in_hw[1], P_W, w)
            (o0, o1), (q0, q1) = block_range(out_hw[0], P_H, h), block_range(out_hw[1], P_W, w)
            lo_h, hi_h = input_window(o0, o1, kernel[0], stride[0], padding[0], dilation[0])
            lo_w, hi_w = input_window(q0, q1, kernel[1], stride[1], padding[1], dilation[1])
            owned.append(Box(h0, h1, w0, w1))
            window.append(Box(lo_h, hi_h, lo_w, hi_w))
    return owned, window


def halo_pixels(owned, window, me):
    """``(sent, received)``: pixels (per sample and channel) rank ``me`` sends to and receives
    from the other ranks in :meth:`Halo.extend` (:meth:`Halo.reduce` mirrors them)."""
    size = lambda box: 0 if box is None else box.shape[0] * box.shape[1]  # noqa: E731
    others = [r for r in range(len(owned)) if r != me]
    return (sum(size(owned[me].intersect(window[r])) for r in others),
            sum(size(owned[r].intersect(window[me])) for r in others))


class Halo:
    """Windows and halo pieces of every rank of a ``P_H x P_W`` spatial group.

    ``in_hw``, ``out_hw``: global input and output sizes; ``kernel``, ``stride``,
    ``padding``, ``dilation``: ``(h, w)`` pairs.  ``comm``: the spatial group
    (``grid.sub_comm(("height", "width"))``), ranked ``h * P_W + w``.
    """

    def __init__(self, comm, grid_hw, in_hw, out_hw, kernel, stride, padding, dilation):
        self.comm = comm
        self.P_H, self.P_W = grid_hw
        self.owned, self.window = halo_geometry(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation)
        self.image = Box(0, in_hw[0], 0, in_hw[1])
        self.me = comm.Get_rank()

    @property
    def window_shape(self):
        """``(h_win, w_win)`` of this rank's window."""
        return self.window[self.me].shape

    def _plan(self, sender, receiver):
        """The part of ``sender``'s owned block that lies in ``receiver``'s window."""
        return self.owned[sender].intersect(self.window[receiver])

    def extend(self, x_loc, xp, fill=0.0):
        """``x_loc (n, c, h, w)`` -> the window ``(n, c, h_win, w_win)``; ``fill`` outside the image
        (0 for convolution and average pooling, ``-inf`` for max pooling).

        On one rank, when the window is the whole image (no padding, nothing cut
        off), ``x_loc`` itself is returned: no copy; do not write into it."""
        n, c = x_loc.shape[:2]
        me, own, win = self.me, self.owned[self.me], self.window[self.me]
        if win == own and self.comm.Get_size() == 1:
            return x_loc
        x_win = xp.empty((n, c) + win.shape, dtype=x_loc.dtype)  # (n, c, h_win, w_win)
        for strip in _outside(win, self.image):  # padding: the only cells no rank owns
            x_win[(slice(None), slice(None)) + strip.slices(win)] = fill
        piece = own.intersect(win)  # my own rows and columns of the window
        if piece is not None:
            x_win[(slice(None), slice(None)) + piece.slices(win)] = x_loc[(slice(None), slice(None)) + piece.slices(own)]
        if self.comm.Get_size() == 1:
            return x_win
        sends, recv_shapes, pieces = {}, {}, {}
        for r in range(self.comm.Get_size()):
            if r == me:
                continue
            out_piece = self._plan(me, r)  # rows of mine that rank r reads
            if out_piece is not None:
                sends[r] = x_loc[(slice(None), slice(None)) + out_piece.slices(own)]
            in_piece = self._plan(r, me)  # rows of rank r that I read
            if in_piece is not None:
                recv_shapes[r] = (n, c) + in_piece.shape
                pieces[r] = in_piece
        received = collectives.exchange(self.comm, sends, recv_shapes, x_loc.dtype, like=x_loc)
        for r, piece in pieces.items():
            x_win[(slice(None), slice(None)) + piece.slices(win)] = received[r]
        return x_win

    def reduce(self, dx_win, xp):
        """The adjoint of :meth:`extend`: ``(n, c, h_win, w_win)`` -> ``(n, c, h, w)``, pieces summed
        at their owners.  On one rank, when the window is the whole image, ``dx_win`` itself is returned."""
        n, c = dx_win.shape[:2]
        me, own, win = self.me, self.owned[self.me], self.window[self.me]
        if win == own and self.comm.Get_size() == 1:
            return dx_win
        piece = own.intersect(win)  # my own rows and columns of the window: their gradient stays here
        if piece == own:
            dx_loc = xp.empty((n, c) + own.shape, dtype=dx_win.dtype)  # (n, c, h, w), all written below
        else:  # some of my rows are read by no output of mine (stride, or a neighbour's window only)
            dx_loc = xp.zeros((n, c) + own.shape, dtype=dx_win.dtype)
        if piece is not None:
            dx_loc[(slice(None), slice(None)) + piece.slices(own)] = dx_win[(slice(None), slice(None)) + piece.slices(win)]
        if self.comm.Get_size() == 1:
            return dx_loc
        sends, recv_shapes, pieces = {}, {}, {}
        for r in range(self.comm.Get_size()):
            if r == me:
                continue
            back = self._plan(r, me)  # my window rows owned by rank r: their gradient goes home
            if back is not None:
                sends[r] = dx_win[(slice(None), slice(None)) + back.slices(win)]
            home = self._plan(me, r)  # my rows in rank r's window: r sends their gradient
            if home is not None:
                recv_shapes[r] = (n, c) + home.shape
                pieces[r] = home
        received = collectives.exchange(self.comm, sends, recv_shapes, dx_win.dtype, like=dx_win)
        for r, piece in pieces.items():
            dx_loc[(slice(None), slice(None)) + piece.slices(own)] += received[r]
        return dx_loc


def _outside(box, image):
    """Up to four boxes covering the part of ``box`` outside ``image``: full-width strips
    above and below it, then the left and right strips beside it."""
    inner = box.intersect(image)
    if inner is None:
        return [box]
    strips = [Box(box.h0, inner.h0, box.w0, box.w1), Box(inner.h1, box.h1, box.w0, box.w1),
              Box(inner.h0, inner.h1, box.w0, inner.w0), Box(inner.h0, inner.h1, inner.w1, box.w1)]
    return [b for b in strips if b.h0 < b.h1 and b.w0 < b.w1]
