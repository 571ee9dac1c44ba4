"""Halo exchange for spatially split activations (docs/algorithms.md section 3).

A rank owns input rows ``[h0, h1)`` and columns ``[w0, w1)`` of ``x`` and output
rows ``[o0, o1)`` (columns likewise) of ``y``.  The output rows read the input
window

    [o0*s - p,  (o1 - 1)*s - p + d*(K - 1) + 1)

which may start before row 0 or end past the image (zero padding), and may reach past the
nearest neighbour.  :class:`Halo` computes those windows exactly and moves the pieces:

- ``extend(x_loc)``: ``(n, c, h, w)`` -> ``(n, c, h_win, w_win)``, the window with
  pieces received from their owners and zeros outside the image; the local
  convolution (or pooling) then runs with ``padding=0``.
- ``reduce(dx_win)``: the adjoint, ``(n, c, h_win, w_win)`` -> ``(n, c, h, w)``:
  each piece is sent back to its owner and added there.

With ``padding_mode`` reflect, replicate or circular, the cells outside the
image are copies of image cells (:func:`source_index`), and they too come from
the ranks that own them (:func:`halo_plan`).

``start_extend`` and ``start_reduce`` start the same exchanges and return a
:class:`Started`, whose ``wait()`` finishes them, so that compute can run while they
are in flight: in forward, the interior of the output, which reads no halo cell
(:attr:`Halo.interior`); in backward, this rank's own cells of ``dx_win``
(:attr:`Halo.kept_box`), once the cells sent back (:attr:`Halo.return_boxes`) are
computed, and backward-filter.

When the spatial group has one rank, no message is sent: the window is the padded local
block, or the block itself (no copy) when nothing is padded or cut off.  Only the
zero-padding cells are filled; every other cell of a window is written once, by its owner's piece.

Everything here is per spatial axis, for any number of them: a volume split over
depth, height and width (a 3-D convolution on ``ProcessGrid(..., depth=P_D)``) has
windows ``(n, c, d_win, h_win, w_win)``, Boxes of three ranges, and pieces that are
rows of one block by columns of another by planes of a third, so the corners and
edges of a block come from the diagonal neighbours that own them.  The spatial rank
is row-major over the spatial grid (``h * P_W + w``; ``(d * P_H + h) * P_W + w``).
"""

import dataclasses
import functools
import itertools

import numpy

from refconv import checks, collectives
from refconv.distribution import block_range
from refconv.shapes import memory


def input_window(o0, o1, kernel, stride, padding, dilation):
    """The (unclipped) input range ``[lo, hi)`` that output range ``[o0, o1)`` reads."""
    return o0 * stride - padding, (o1 - 1) * stride - padding + dilation * (kernel - 1) + 1


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Box:
    """A rectangle of rows ``[h0, h1)`` and columns ``[w0, w1)``: ``Box(h0, h1, w0, w1)``; in a
    volume, a box of planes ``[d0, d1)`` too: ``Box(d0, d1, h0, h1, w0, w1)``.  ``lo`` and ``hi``
    hold the bounds per axis, the same for any number of axes."""

    lo: tuple
    hi: tuple
    LETTERS = "dhw"  # the names of the bounds, of the last axes: h0, h1, w0, w1 (and d0, d1)

    def __init__(self, *bounds):
        if not bounds or len(bounds) % 2 or len(bounds) > 2 * len(self.LETTERS):
            raise ValueError(f"Box: expected a (start, stop) pair per axis, got {bounds}")
        object.__setattr__(self, "lo", tuple(int(b) for b in bounds[0::2]))
        object.__setattr__(self, "hi", tuple(int(b) for b in bounds[1::2]))

    @classmethod
    def of(cls, lo, hi):
        """The box of ``[lo[k], hi[k])`` along each axis ``k``."""
        return cls(*itertools.chain.from_iterable(zip(lo, hi)))

    def _letters(self):
        return self.LETTERS[len(self.LETTERS) - len(self.lo):]

    def __getattr__(self, name):  # h0, h1, w0, w1 (d0, d1): called only for names not found otherwise
        if len(name) == 2 and name[1] in "01" and name[0] in self.LETTERS and "lo" in self.__dict__:
            letters = self._letters()
            if name[0] in letters:
                return (self.lo, self.hi)[int(name[1])][letters.index(name[0])]
        raise AttributeError(name)

    def __repr__(self):
        return "Box(" + ", ".join(f"{c}0={a}, {c}1={b}" for c, a, b in zip(self._letters(), self.lo, self.hi)) + ")"

    def intersect(self, other):
        box = Box.of(map(max, self.lo, other.lo), map(min, self.hi, other.hi))
        return box if all(a < b for a, b in zip(box.lo, box.hi)) else None

    def slices(self, origin=None):
        """Slices of this box inside an array whose element (0, 0) is ``origin``'s corner (by
        default the origin itself: a box of a local block's own coordinates)."""
        corner = origin.lo if origin is not None else (0,) * len(self.lo)
        return tuple(slice(a - o, b - o) for a, b, o in zip(self.lo, self.hi, corner))

    @property
    def shape(self):
        return tuple(b - a for a, b in zip(self.lo, self.hi))


def halo_geometry(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation):
    """``(owned, window)``: per spatial rank ``h * P_W + w`` (row-major over the spatial grid,
    of any number of axes), the input Box it owns and the (unclipped) input Box its output
    block reads.  Pure geometry, no communication."""
    owned, window = [], []
    for coords in itertools.product(*(range(p) for p in grid_hw)):  # row-major: the spatial rank's order
        own = [block_range(size, p, k) for size, p, k in zip(in_hw, grid_hw, coords)]
        out = [block_range(size, p, k) for size, p, k in zip(out_hw, grid_hw, coords)]
        win = [input_window(o0, o1, *geometry) for (o0, o1), *geometry in zip(out, kernel, stride, padding, dilation)]
        owned.append(Box.of(*zip(*own)))
        window.append(Box.of(*zip(*win)))
    return owned, window


def halo_geometry_out(window, kernel, stride, dilation):
    """The output extents ``(h', w')`` that a window Box of input rows and columns gives."""
    return tuple((length - dilation[k] * (kernel[k] - 1) - 1) // stride[k] + 1
                 for k, length in enumerate(window.shape))


def source_index(lo, hi, size, mode="zeros"):
    """The image row (or column) each window row ``lo, ..., hi - 1`` holds: itself inside the image
    ``[0, size)``; outside it, -1 for ``"zeros"`` (padding no rank owns), else the row the
    padding copies, as torch.nn.functional.pad does: ``"reflect"`` mirrors about the edge row
    (row -1 holds row 1), ``"replicate"`` repeats it (row -1 holds row 0), ``"circular"`` wraps
    around (row -1 holds row size - 1)."""
    rows = numpy.arange(lo, hi)
    if mode == "zeros":
        return numpy.where((rows >= 0) & (rows < size), rows, -1)
    if mode == "replicate":
        return numpy.clip(rows, 0, size - 1)
    if mode == "circular":
        return rows % size
    period = max(2 * (size - 1), 1)  # reflect: ... 2, 1, [0, 1, ..., size - 1], size - 2, ...
    folded = rows % period
    return numpy.where(folded < size, folded, period - folded)


@dataclasses.dataclass(frozen=True)
class Piece:
    """The cells of one rank's window that one owner's block fills: per spatial axis, the
    window positions ``win[k]`` hold the owner's local rows ``own[k]`` (rows, then columns; planes
    first in a volume).  Each is a slice where it counts up by one (always, for zero padding),
    else an index array (padding that reflects, repeats or wraps reads a row out of order, or twice)."""

    win: tuple
    own: tuple
    shape: tuple  # (rows, columns), or (planes, rows, columns)

    win_h = property(lambda self: self.win[-2], doc="The window rows (the second-to-last axis).")
    win_w = property(lambda self: self.win[-1], doc="The window columns.")
    own_h = property(lambda self: self.own[-2], doc="The owner's local rows.")
    own_w = property(lambda self: self.own[-1], doc="The owner's local columns.")

    def window_index(self):
        return _index(self.win)

    def owned_index(self):
        return _index(self.own)

    def is_whole(self, block_shape):
        """Whether the owned cells are the whole block, each once."""
        return all(isinstance(own, slice) and own == slice(0, length) for own, length in zip(self.own, block_shape))


def _index(per_axis):
    """The index of ``a[:, :, rows, cols]`` (``a[:, :, planes, rows, cols]``): every row with every
    column; ``numpy.ix_`` where two or more axes are index arrays."""
    if sum(not isinstance(i, slice) for i in per_axis) <= 1:
        return (slice(None), slice(None)) + tuple(per_axis)
    return (slice(None), slice(None)) + numpy.ix_(*(numpy.arange(i.start, i.stop) if isinstance(i, slice) else i
                                                    for i in per_axis))


def _as_slice(idx):
    """``idx`` as a slice when it counts up by one, else as it is."""
    start = int(idx[0])
    return slice(start, start + len(idx)) if numpy.array_equal(idx, numpy.arange(start, start + len(idx))) else idx


def _axis_pieces(lo, hi, size, parts, mode):
    """Along one axis of ``size`` rows split ``parts`` ways, for the window rows ``[lo, hi)``: per
    block ``k``, ``(positions, rows, count)``, the window positions that hold rows of block ``k``
    and those rows counted from the block's first; None where there are none."""
    source = None if mode == "zeros" else source_index(lo, hi, size, mode)
    return [_axis_piece(lo, hi, size, parts, k, source) for k in range(parts)]


def _axis_piece(lo, hi, size, parts, k, source=None):
    """Block ``k``'s entry of :func:`_axis_pieces`; ``source``: the window's ``source_index`` (None for
    zero padding: the window's rows inside the image, in order, so intersect the intervals)."""
    a, b = block_range(size, parts, k)
    if source is None:
        start, stop = max(lo, a), min(hi, b)
        return (slice(start - lo, stop - lo), slice(start - a, stop - a), stop - start) if start < stop else None
    positions = numpy.flatnonzero((source >= a) & (source < b))
    return (_as_slice(positions), _as_slice(source[positions] - a), len(positions)) if len(positions) else None


def halo_plan(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation, padding_mode="zeros"):
    """``(owned, window, pieces)``: :func:`halo_geometry`'s boxes, and ``pieces[(owner, reader)]``,
    the :class:`Piece` of ``owner``'s block in ``reader``'s window (pairs that share nothing are
    left out; ``owner == reader`` is the rank's own part).  Pure geometry, no communication.

    With ``padding_mode`` other than zeros the padding cells are copies of image cells, so they
    come from the ranks that own those cells: the ranks at the edge of the grid reflect or repeat
    their own rows, or a neighbour's where the padding is wider than their block; circular
    padding makes the first and last ranks along an axis neighbours."""
    owned, window = halo_geometry(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation)
    pieces = {}
    for reader, win in enumerate(window):  # a piece is rows of one block by columns of another (by planes of a third)
        per_axis = [_axis_pieces(lo, hi, size, parts, padding_mode)
                    for lo, hi, size, parts in zip(win.lo, win.hi, in_hw, grid_hw)]
        for owner, parts in enumerate(itertools.product(*per_axis)):  # row-major: the owner's spatial rank
            if all(parts):
                win_index, own_index, shape = zip(*parts)
                pieces[(owner, reader)] = Piece(win_index, own_index, shape)
    return owned, window, pieces


def halo_pieces_of(me, grid_hw, in_hw, out_hw, kernel, stride, padding, dilation, padding_mode="zeros"):
    """The entries of :func:`halo_plan`'s ``pieces`` that involve spatial rank ``me`` (as owner or reader), in
    its order, without the all-pairs loop: per axis, the owners meeting ``me``'s window and the coordinates
    whose window meets ``me``'s block: O(sum of the axes' sizes), not O(spatial ranks squared).  Cached (the
    planner asks the same for every algorithm of a grid): a new dict of shared Pieces."""
    return dict(_pieces_of(int(me), *(tuple(int(v) for v in a) for a in (grid_hw, in_hw, out_hw, kernel, stride, padding,
                                                                        dilation)), padding_mode))


@functools.lru_cache(maxsize=4096)
def _pieces_of(me, grid_hw, in_hw, out_hw, kernel, stride, padding, dilation, padding_mode):
    coords = numpy.unravel_index(me, grid_hw)
    mine, readers = [], []   # per axis [(coordinate, axis piece)]: the owners in my window, the readers of my block
    for size, out, p, k, geometry in zip(in_hw, out_hw, grid_hw, coords, zip(kernel, stride, padding, dilation)):
        windows = [input_window(*block_range(out, p, c), *geometry) for c in range(p)]   # per coordinate [lo, hi)
        sources = [None if padding_mode == "zeros" else source_index(lo, hi, size, padding_mode) for lo, hi in windows]
        lo, hi = windows[k]
        mine.append([(c, piece) for c, piece in enumerate(_axis_pieces(lo, hi, size, p, padding_mode)) if piece])
        theirs = [(c, _axis_piece(lo, hi, size, p, k, source)) for c, ((lo, hi), source) in enumerate(zip(windows, sources))]
        readers.append([(c, piece) for c, piece in theirs if piece])
    pieces = {}
    for key_axis, per_axis in ((0, mine), (1, readers)):
        for combo in itertools.product(*per_axis):
            other = int(numpy.ravel_multi_index([c for c, _ in combo], grid_hw))
            win_index, own_index, shape = zip(*[piece for _, piece in combo])
            pieces[(other, me) if key_axis == 0 else (me, other)] = Piece(win_index, own_index, shape)
    return dict(sorted(pieces.items(), key=lambda item: (item[0][1], item[0][0])))  # halo_plan's order: reader, owner


def exchanges(pieces, me):
    """``(sends, receives)``: ``{reader: Piece}`` of the ranks that read rank ``me``'s block and
    ``{owner: Piece}`` of the ranks whose blocks ``me`` reads, other ranks only."""
    sends = {r: p for (s, r), p in pieces.items() if s == me and r != me}
    receives = {s: p for (s, r), p in pieces.items() if r == me and s != me}
    return sends, receives


class Halo:
    """Windows and halo pieces of every rank of a ``P_H x P_W`` spatial group (``P_D x P_H x P_W``
    for a volume).

    ``in_hw``, ``out_hw``: global input and output sizes; ``kernel``, ``stride``,
    ``padding`` (the low side: top, left), ``dilation``: ``(h, w)`` pairs (``(d, h, w)`` triples);
    ``padding_mode``: what the padding cells hold (:func:`source_index`).  ``comm``: the
    spatial group (``grid.sub_comm(("height", "width"))``), ranked ``h * P_W + w``
    (``grid.sub_comm(("depth", "height", "width"))``, ranked ``(d * P_H + h) * P_W + w``).
    """

    def __init__(self, comm, grid_hw, in_hw, out_hw, kernel, stride, padding, dilation, padding_mode="zeros"):
        self.comm = comm
        self.grid_shape = tuple(grid_hw)
        self.P_H, self.P_W = self.grid_shape[-2:]
        self.padding_mode = checks.one_of(padding_mode, "padding_mode", checks.PADDING_MODES)
        self.owned, self.window = halo_geometry(grid_hw, in_hw, out_hw, kernel, stride, padding, dilation)
        self.image = Box.of((0,) * len(in_hw), in_hw)
        self.me, self.size = comm.Get_rank(), comm.Get_size()
        self.pieces = halo_pieces_of(self.me, grid_hw, in_hw, out_hw, kernel, stride, padding, dilation, padding_mode)
        self.mine = self.pieces.get((self.me, self.me))  # my own block's part of my window
        self.sends, self.receives = exchanges(self.pieces, self.me)
        # extend and reduce run every step: their index tuples are built once, here.
        own, win = self.owned[self.me], self.window[self.me]
        self.is_block = win == own and self.size == 1  # one rank, nothing padded or cut off
        self.fill_index = [(slice(None), slice(None)) + strip.slices(win)  # zero padding: no rank owns it
                           for strip in (_outside(win, self.image) if self.padding_mode == "zeros" else ())]
        self.mine_index = (self.mine.window_index(), self.mine.owned_index()) if self.mine is not None else None
        self.mine_whole = self.mine is not None and self.mine.is_whole(own.shape)
        self.send_index = {r: piece.owned_index() for r, piece in self.sends.items()}      # my cells rank r reads
        self.recv_index = {s: piece.window_index() for s, piece in self.receives.items()}  # rank s's cells in my window
        self._indices = {}  # the index tuples above in each array module's memory (see indices)
        self.kernel, self.stride, self.dilation = tuple(kernel), tuple(stride), tuple(dilation)
        self.out_shape = tuple(halo_geometry_out(win, kernel, stride, dilation))  # (h', w'), or (d', h', w')
        self.interior, self.no_overlap = self._interior(self.out_shape, kernel, stride, dilation)

    def indices(self, xp):
        """``(mine_index, send_index, recv_index)`` with their index arrays built with ``xp``, once per module.

        Reflect, replicate and circular padding read rows out of order, so their pieces are indexed by
        arrays; indexing a CuPy array with NumPy arrays copies them to the device, synchronously, at
        every call.  Built here once, in the array module's memory, they cost nothing per step."""
        key = xp.__name__
        if key not in self._indices:
            on = lambda index: tuple(xp.asarray(i) if isinstance(i, numpy.ndarray) else i for i in index)  # noqa: E731
            mine = None if self.mine_index is None else tuple(map(on, self.mine_index))
            self._indices[key] = (mine, {r: on(i) for r, i in self.send_index.items()},
                                  {s: on(i) for s, i in self.recv_index.items()})
        return self._indices[key]

    @property
    def window_shape(self):
        """``(h_win, w_win)`` of this rank's window (``(d_win, h_win, w_win)`` in a volume)."""
        return self.window[self.me].shape

    def extend(self, x_loc, xp, fill=0.0):
        """``x_loc (n, c, h, w)`` -> the window ``(n, c, h_win, w_win)``: the pieces of every owner
        (the halo exchange), and ``fill`` in zero padding (0 for convolution and average
        pooling, ``-inf`` for max pooling).

        On one rank, when the window is the whole image (no padding, nothing cut
        off), ``x_loc`` itself is returned: no copy; do not write into it."""
        return self.start_extend(x_loc, xp, fill).wait()

    @memory.kind("comm")  # the window and its receive buffers (shapes-only runs: refconv.shapes.memory)
    def start_extend(self, x_loc, xp, fill=0.0, overlap=""):
        """Start :meth:`extend`: ``partial`` of the result is the window with every cell this rank
        holds already written (its own block's, and the zero padding), the halo cells in flight;
        ``wait()`` writes them and returns the window.  ``overlap``: what runs meanwhile."""
        if self.is_block:
            return Started(None, lambda _: x_loc, x_loc)
        n, c = x_loc.shape[:2]
        x_win = xp.empty((n, c) + self.window_shape, dtype=x_loc.dtype)  # (n, c, h_win, w_win)
        mine_index, send_index, recv_index = self.indices(xp)
        for index in self.fill_index:
            x_win[index] = fill
        if mine_index is not None:
            window_index, owned_index = mine_index
            x_win[window_index] = x_loc[owned_index]
        if self.size == 1:
            return Started(None, lambda _: x_win, x_win)
        sends = {r: x_loc[index] for r, index in send_index.items()}
        recv_shapes = {s: (n, c) + piece.shape for s, piece in self.receives.items()}
        request = collectives.iexchange(self.comm, sends, recv_shapes, x_loc.dtype, like=x_loc, overlap=overlap)

        def finish(received):
            for s, index in recv_index.items():
                x_win[index] = received[s]
            return x_win
        return Started(request, finish, x_win)

    def reduce(self, dx_win, xp):
        """The adjoint of :meth:`extend` (the halo return): ``(n, c, h_win, w_win)`` -> ``(n, c, h, w)``,
        each window cell's gradient sent to the owner of the cell it holds and added there.
        On one rank, when the window is the whole image, ``dx_win`` itself is returned."""
        return self.start_reduce(dx_win, xp).wait()

    def start_reduce(self, dx_win, xp, overlap=""):
        """Start :meth:`reduce`: the pieces sent back are copied and in flight; ``wait()`` adds this
        rank's own cells and the pieces received, and returns ``dx_loc``.  So the cells sent
        (:attr:`return_boxes`) must be final when this is called, the rest of ``dx_win`` (its own
        cells, :attr:`kept_box`) only at ``wait()``: backward-data computes them in between
        (``Algorithm.backward_behind_halo``)."""
        if self.is_block:
            return Started(None, lambda _: dx_win)
        n, c = dx_win.shape[:2]
        mine_index, send_index, recv_index = self.indices(xp)
        request = None
        if self.size > 1:
            sends = {s: dx_win[index] for s, index in recv_index.items()}  # back to the owners
            recv_shapes = {r: (n, c) + piece.shape for r, piece in self.sends.items()}
            request = collectives.iexchange(self.comm, sends, recv_shapes, dx_win.dtype, like=dx_win,
                                            overlap=overlap)

        def finish(received):
            own = self.owned[self.me]
            if self.mine_whole:
                window_index, _ = mine_index
                dx_loc = xp.empty((n, c) + own.shape, dtype=dx_win.dtype)  # (n, c, h, w), each cell held once
                dx_loc[...] = dx_win[window_index]
            else:  # rows read by no output of mine (stride, a neighbour's window only), or read twice
                dx_loc = xp.zeros((n, c) + own.shape, dtype=dx_win.dtype)
                if mine_index is not None:
                    window_index, owned_index = mine_index
                    _add_into(dx_loc, owned_index, dx_win[window_index], xp)
            for r, index in send_index.items():  # then the pieces received, in a fixed order
                _add_into(dx_loc, index, received[r], xp)
            return dx_loc
        return Started(request, finish)

    # -- backward-data in two parts: the cells sent back first, then this rank's own -------------
    @property
    def return_boxes(self):
        """The window Boxes (local to the window) of the cells :meth:`start_reduce` sends back: the
        bounding box of each piece of another rank's block in this window."""
        return [_bounding_box(piece.win) for piece in self.receives.values()]

    @property
    def kept_box(self):
        """The window Box (local to the window) of the cells this rank adds into its own block
        (None where it holds none)."""
        return None if self.mine is None else _bounding_box(self.mine.win)

    def outputs_reading(self, box):
        """``(rows, columns)`` (planes first in a volume): the local output ranges whose inputs
        meet window Box ``box`` (every output that adds into one of its cells in backward-data)."""
        ranges = []
        for axis, (lo, hi) in enumerate(zip(box.lo, box.hi)):
            reach, s = self.dilation[axis] * (self.kernel[axis] - 1), self.stride[axis]
            first = max(0, -(-(lo - reach) // s))  # output i reads window rows [i s, i s + reach]
            ranges.append((first, max(first, min(self.out_shape[axis], (hi - 1) // s + 1))))
        return tuple(ranges)

    # -- the interior: output cells that read no halo cell ---------------------------------
    def _interior(self, out_hw, kernel, stride, dilation):
        """``(box, reason)``: the Box of local output rows and columns whose input cells this rank
        holds before the exchange (its own block, and zero padding next to it), when overlap pays:
        along each split axis the rows (columns) that need the halo are at most a third of the
        block (Distconv's rule: a block of at least 3x the stencil).  Else ``(None, why not)``."""
        if self.size == 1:
            return None, "one rank in the spatial group: no halo exchange"
        own, win = self.owned[self.me], self.window[self.me]
        names = ("planes", "rows", "columns")[3 - len(out_hw):]
        spans = []
        for axis, (lo, hi, a, b, size) in enumerate(zip(win.lo, win.hi, own.lo, own.hi, self.image.hi)):
            zeros = self.padding_mode == "zeros"
            k0 = max(lo, lo if zeros and a == 0 else a)      # the window rows known before the exchange
            k1 = min(hi, hi if zeros and b == size else b)
            reach, s = dilation[axis] * (kernel[axis] - 1), stride[axis]
            rows = out_hw[axis]
            i0 = min(rows, max(0, -(-(k0 - lo) // s)))       # first output row whose window starts inside
            i1 = max(i0, min(rows, (k1 - lo - 1 - reach) // s + 1))
            if 3 * (rows - (i1 - i0)) > rows:
                name = names[axis]
                return None, (f"{rows - (i1 - i0)} of the block's {rows} output {name} need the halo (more than "
                              f"a third): too small a block for the overlap to pay")
            spans.append((i0, i1))
        return Box.of(*zip(*spans)), None

    def output_strips(self, out_hw):
        """The local output Boxes outside :attr:`interior`: rows above and below it (full width),
        then the columns left and right of it (in a volume: the planes before and after it first)."""
        return _peel(Box.of((0,) * len(out_hw), out_hw), self.interior)

    def input_of(self, box):
        """The window slices that the output Box ``box`` reads: ``x_win[(slice(None), slice(None)) + ...]``."""
        return (slice(None), slice(None)) + tuple(slice(a * s, (b - 1) * s + d * (k - 1) + 1) for a, b, k, s, d in
                                                  zip(box.lo, box.hi, self.kernel, self.stride, self.dilation))


class Started:
    """A halo exchange or return in flight: ``wait()`` finishes it (once) and returns the result;
    ``partial``, for an exchange, the window with the cells this rank holds already written."""

    def __init__(self, request, finish, partial=None):
        self._request, self._finish, self.partial = request, finish, partial
        self._done, self._result = False, None

    def wait(self):
        if not self._done:
            self._result = self._finish(self._request.wait() if self._request is not None else {})
            self._done, self._request, self._finish = True, None, None
        return self._result


def _bounding_box(per_axis):
    """The Box of a piece's window positions, per axis a slice or an index array."""
    bounds = [(idx.start, idx.stop) if isinstance(idx, slice) else (int(idx.min()), int(idx.max()) + 1)
              for idx in per_axis]
    return Box.of([lo for lo, _ in bounds], [hi for _, hi in bounds])


def _add_into(dx_loc, index, values, xp):
    """``dx_loc[index] += values`` for an index of a piece's owned cells, summing where several
    window cells hold one cell (reflect and replicate padding read a row twice)."""
    if all(isinstance(i, slice) for i in index[2:]):
        dx_loc[index] += values
    else:
        xp.add.at(dx_loc, index, values)


def _outside(box, image):
    """Up to four boxes covering the part of ``box`` outside ``image``: full-width strips
    above and below it, then the left and right strips beside it (six in a volume)."""
    inner = box.intersect(image)
    return [box] if inner is None else _peel(box, inner)


def _peel(outer, inner):
    """The non-empty boxes that cover ``outer`` less ``inner`` (inside it), axis by axis: along the
    first axis the slabs before and after ``inner`` (whole along the later axes), then along each
    next axis the slabs beside it within ``inner``'s range of the axes before."""
    boxes = []
    for k in range(len(outer.lo)):
        lo, hi = inner.lo[:k], inner.hi[:k]  # the axes already peeled: inside inner
        for a, b in ((outer.lo[k], inner.lo[k]), (inner.hi[k], outer.hi[k])):
            boxes.append(Box.of(lo + (a,) + outer.lo[k + 1:], hi + (b,) + outer.hi[k + 1:]))
    return [b for b in boxes if all(x < y for x, y in zip(b.lo, b.hi))]
