"""What the algorithm modules share: the layer's global problem, the record of one
call, the local convolution of a rank's halo-extended window, and the one
communication step every algorithm ends with, the segmented allreduce.

Each algorithm module (:mod:`.spatial`, :mod:`.stationary_x`,
:mod:`.stationary_y`, :mod:`.stationary_w`, :mod:`.grouped`) writes out, where they happen, its
halo exchange and return, its channel collectives and its call of
:func:`segmented_allreduce`, and lists the same calls in its ``records()``.

The same classes run a 3-D convolution (:class:`refconv.layers.DistConv3d`): the
geometry is then of NCDHW volumes (``ConvGeometry.of(..., dims=3)``), the grid is seen
as ``(P_N, P_c, P_D, P_H, P_W)`` (:func:`grid_view`), the halo exchange runs over the
depth, height and width ranks, and the local passes are the backend's ``conv3d_*``.
Nothing else differs: the channel collectives and the segmented allreduce move whole
blocks whatever their number of spatial dims, and the shape comments' ``h, w`` read
``d, h, w``.
"""

import dataclasses
import math

import numpy

from refconv import checks, collectives
from refconv.distribution import block_size, block_sizes
from refconv.halo import Box, Halo, exchanges, halo_pieces_of

ALPHA = 2e-6  # default seconds per message step (a typical inter-node latency)
BETA = 1 / 10e9  # default seconds per byte (10 GB/s)
# What runs behind the halo calls, as their records say (Record.overlap)
BEHIND_EXCHANGE = "interior of the forward convolution"
BEHIND_RETURN = "own cells of backward-data, backward-filter"
BEHIND_RETURN_WHOLE = "backward-filter"  # a block too small for the split (Halo.no_overlap)
BEHIND_RETURN_OWN = "own cells of backward-data"  # when backward-filter runs behind the next call instead
BEHIND_NEXT = "backward-filter"  # behind the collective that follows the halo return (Stationary-Y's)
POLL_CHUNKS = 4  # bands of the work behind a halo call, MPI_Test between them (Algorithm.bands; measured:
#                  docs/benchmarks.md, python -m refconv.bench.overlap halo)


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """The global problem of one convolution layer (build it with :meth:`of`, which validates)."""

    in_shape: tuple  # (N, C, H, W), or (N, C, D, H, W)
    w_shape: tuple  # (F, C/groups, Kh, Kw), or (F, C/groups, Kd, Kh, Kw)
    out_shape: tuple  # (N, F, H', W'), or (N, F, D', H', W')
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)  # the low-side pads (top, left); out_shape carries the high side ('same')
    dilation: tuple = (1, 1)
    groups: int = 1
    bias: bool = True
    itemsize: int = 4  # bytes per element of x, w and y
    padding_mode: str = "zeros"  # what the padding holds: zeros, reflect, replicate or circular

    @classmethod
    def of(cls, in_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1, bias=True, itemsize=4,
           padding_mode="zeros", dims=2):
        """``dims=3``: a 3-D convolution, every spatial tuple ``(d, h, w)``."""
        in_shape, w_shape = checks.shape_of(in_shape, "input_shape", dims + 2), checks.shape_of(w_shape, "w_shape",
                                                                                                 dims + 2)
        stride, low, dilation, groups, out_hw = checks.conv_geometry(
            in_shape, w_shape, stride, padding, dilation, groups, dims=dims)
        pads = checks.conv_padding(padding, w_shape[2:], stride, dilation)
        padding_mode = checks.padding_mode(padding_mode, pads, in_shape[2:])
        return cls(in_shape, w_shape, (in_shape[0], w_shape[0]) + out_hw, stride, low, dilation, groups,
                   bool(bias), int(itemsize), padding_mode)

    @property
    def C(self):
        return self.in_shape[1]

    @property
    def F(self):
        return self.w_shape[0]

    @property
    def kernel(self):
        return self.w_shape[2:]

    @property
    def dims(self):
        """The number of spatial dims: 2, or 3 for a volume."""
        return len(self.kernel)

    def with_batch(self, N):
        """The same layer on a batch of ``N`` samples."""
        return dataclasses.replace(self, in_shape=(N,) + self.in_shape[1:], out_shape=(N,) + self.out_shape[1:])


@dataclasses.dataclass(frozen=True)
class Call:
    """One call as :data:`refconv.collectives.stats` records it.

    ``bytes`` is the full (gathered or reduced) buffer ``m`` of a collective, or the
    bytes this rank sends in a halo exchange or shuffle; ``messages`` counts those sends
    (a shuffle's non-empty ones).  Two facts for the planner, which a measurement does not
    see and equality ignores: ``axes``, the grid axes the communicator spans (None: the
    kind's usual ones), and ``grad``, a weight-gradient allreduce (backward may overlap it).
    """

    kind: str
    comm_size: int
    bytes: int
    messages: int = 0
    axes: tuple = dataclasses.field(default=None, compare=False)
    grad: bool = dataclasses.field(default=False, compare=False)

    @property
    def wire_bytes(self):
        """Bytes this rank sends in a ring collective: ``(q-1)/q m``, twice for an allreduce."""
        q = self.comm_size
        if self.kind == "halo":
            return self.bytes
        return (2 if self.kind == "allreduce" else 1) * (q - 1) / q * self.bytes

    @property
    def steps(self):
        """Message steps of the ring algorithm (point-to-point messages for a halo)."""
        if self.kind == "halo":
            return self.messages
        return (2 if self.kind == "allreduce" else 1) * (self.comm_size - 1)

    def seconds(self, alpha=ALPHA, beta=BETA):
        """The alpha-beta price: ``steps * alpha + wire_bytes * beta``."""
        return self.steps * alpha + self.wire_bytes * beta


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The extents of one rank's blocks: samples, its channel-group blocks ``C_i`` of ``C`` and
    ``F_i`` of ``F``, and per spatial dim its input and output rows (``spatial``, ``out``:
    ``(h, w)`` and ``(h', w')``, or ``(d, h, w)`` and ``(d', h', w')``)."""

    n: int
    C_i: int
    F_i: int
    spatial: tuple
    out: tuple

    h = property(lambda self: self.spatial[-2])
    w = property(lambda self: self.spatial[-1])
    ho = property(lambda self: self.out[-2])
    wo = property(lambda self: self.out[-1])

    @property
    def cells(self):
        """Input cells per sample and channel: ``h w`` (``d h w``)."""
        return math.prod(self.spatial)

    @property
    def out_cells(self):
        """Output cells per sample and channel: ``h' w'`` (``d' h' w'``)."""
        return math.prod(self.out)


def grid_view(grid, geom):
    """``(grid_shape, coords)`` of ``grid`` as a layer of ``geom`` sees it: ``(P_N, P_c, P_H, P_W)``
    for a 2-D convolution, ``(P_N, P_c, P_D, P_H, P_W)`` for a 3-D one (``P_D = 1`` on a grid
    that does not split depth)."""
    if geom.dims == 3:
        return grid.volume_shape, grid.volume_coords
    return grid.shape, grid.coords


def local_blocks(geom, grid_shape, coords):
    """The :class:`Blocks` of the rank at ``coords`` of a ``(P_N, P_c, P_H, P_W)`` grid
    (``(P_N, P_c, P_D, P_H, P_W)`` for a volume)."""
    N, C, F = geom.in_shape[0], geom.C, geom.F
    (P_N, P_c), (c_n, c_c) = grid_shape[:2], coords[:2]
    spatial = tuple(block_size(n, p, k) for n, p, k in zip(geom.in_shape[2:], grid_shape[2:], coords[2:]))
    out = tuple(block_size(n, p, k) for n, p, k in zip(geom.out_shape[2:], grid_shape[2:], coords[2:]))
    return Blocks(block_size(N, P_N, c_n), block_size(C, P_c, c_c), block_size(F, P_c, c_c), spatial, out)


def halo_records(geom, grid_shape, coords, channels):
    """``(exchange, back)``: the halo exchange of the forward and its return in backward-data,
    each a list of one :class:`Call` (empty lists when the spatial group has one rank)."""
    spatial = tuple(grid_shape[2:])  # (P_H, P_W), or (P_D, P_H, P_W)
    if math.prod(spatial) == 1:
        return [], []
    me = int(numpy.ravel_multi_index(coords[2:], spatial))  # the spatial rank: h P_W + w, (d P_H + h) P_W + w
    pieces = halo_pieces_of(me, spatial, geom.in_shape[2:], geom.out_shape[2:], geom.kernel, geom.stride,
                            geom.padding, geom.dilation, geom.padding_mode)
    sends, receives = exchanges(pieces, me)  # my cells others read; theirs I read
    pixels = lambda ps: sum(math.prod(p.shape) for p in ps.values())  # noqa: E731
    per_pixel = local_blocks(geom, grid_shape, coords).n * channels * geom.itemsize
    exchange = Call("halo", math.prod(spatial), pixels(sends) * per_pixel, len(sends))
    back = Call("halo", math.prod(spatial), pixels(receives) * per_pixel, len(receives))
    return [exchange], [back]


def gradient_records(geom, grid_shape, coords, dw_shape):
    """The segmented allreduce: ``dw`` (a shard of ``dw_shape``) and ``db`` (this rank's
    ``F_i``) over the ``P_N P_H P_W`` weight peers; ``grad``: these are the calls that may
    overlap the rest of backward (``segmented_allreduce``)."""
    peers = math.prod(grid_shape) // grid_shape[1]  # P_N P_H P_W (P_N P_D P_H P_W)
    calls = [Call("allreduce", peers, math.prod(dw_shape) * geom.itemsize, grad=True)]
    if geom.bias:
        calls.append(Call("allreduce", peers, local_blocks(geom, grid_shape, coords).F_i * geom.itemsize, grad=True))
    return calls


def segmented_allreduce(peers, dw_loc, db_loc, overlap=None, bucketed=None):
    """forward: nothing · backward: allreduce of this rank's ``dw`` shard and ``db`` block among
    its weight peers, in place; both started here (``collectives.iallreduce_``).

    Ranks with different channel coordinates hold different shards and belong to
    different peer sets, so ``P_c`` disjoint allreduces run at once, each of one
    shard (docs/algorithms.md section 4).  :func:`gradient_records` lists the calls.

    ``overlap=None``: waited for here; returns the summed ``(dw, db)``.  ``overlap`` a
    string (what runs meanwhile, recorded with the calls): not waited for; returns the two
    :class:`refconv.collectives.Request` (``db``'s None without bias), whose ``wait()``
    gives the sums.  ``DistConv2d`` waits when its gradients are read, before the
    optimizer's step.  Both paths make the same MPI call (Iallreduce), so the sums are the
    same bits whether they overlap or not.

    ``bucketed`` (``GradientsInFlight.bucketed()``, where the model packs gradients into
    buckets): ``dw`` and ``db`` are handed to the model's buckets instead, which start (and
    wait for, or not, as the model's overlap says) one allreduce per bucket; returns their
    :class:`refconv.collectives.buckets.Slot`.
    """
    if bucketed is not None:
        return bucketed(0, dw_loc), None if db_loc is None else bucketed(1, db_loc)
    dw_req = collectives.iallreduce_(peers, dw_loc, overlap=overlap or "")
    db_req = None if db_loc is None else collectives.iallreduce_(peers, db_loc, overlap=overlap or "")
    if overlap:
        return dw_req, db_req
    return dw_req.wait(), None if db_req is None else db_req.wait()


class Algorithm:
    """An algorithm bound to a grid and a problem.

    It holds this rank's :class:`refconv.halo.Halo` (the spatial group's windows), the
    weight peers (the communicator of the segmented allreduce), and the local
    convolution of a halo-extended window, which runs with ``padding=0`` and does not
    communicate.  Subclasses set ``name`` and ``weight_layout`` (or ``weight_dims``) and implement ``records``,
    ``forward(x_loc, w_loc, b_loc) -> y_loc`` and ``backward(dy_loc, w_loc) ->
    (dx_loc, dw_loc, db_loc)``, with ``dw_loc``, ``db_loc`` summed over the weight peers.
    """

    name = None
    asked_as = None  # what a layer asks for to run this class, where that is another name (grouped.py)
    weight_layout = (None, None, None, None)  # the weight's dims over the grid axes; see weight_dims
    # backward-filter runs behind the call that moves dx on after the halo return (backward_behind_halo's
    # ``then``: Stationary-Y's and -W's reduce-scatter), not behind the return; the planner prices it so
    filter_behind_next = False

    def __init__(self, grid, geom, backend, filter_groups=None):
        self.grid, self.geom, self.backend, self.xp = grid, geom, backend, backend.xp
        self.filter_groups = filter_groups
        grid_shape, _ = grid_view(grid, geom)  # (P_N, P_c, P_H, P_W), or (P_N, P_c, P_D, P_H, P_W)
        self.halo = Halo(grid.sub_comm(grid.spatial_axes), grid_shape[2:], geom.in_shape[2:],
                         geom.out_shape[2:], geom.kernel, geom.stride, geom.padding, geom.dilation, geom.padding_mode)
        self.peers = grid.weight_peers_comm
        self.overlap = None  # what the gradients' allreduce overlaps (DistConv2d sets it); None: waited for at once
        self.bucketed = None  # the model's buckets, where it has them (DistConv2d sets it: segmented_allreduce)
        self.overlap_halo = False  # compute behind the halo exchange and return (DistConv2d sets it)
        self.poll_chunks = 1  # bands of the work behind a halo call, MPI_Test between them (DistConv2d sets it)
        self._local = dict(stride=geom.stride, padding=0, dilation=geom.dilation, groups=geom.groups)

    @classmethod
    def weight_dims(cls, P_c, filter_groups=None, groups=1):
        """How ``F x C/groups x Kh x Kw`` is laid out: a grid axis (or a Split) per dim."""
        return cls.weight_layout

    @staticmethod
    def resolve_filter_groups(P_c, filter_groups, groups=1):
        """The ``filter_groups`` this algorithm runs with; only Stationary-W takes one."""
        if filter_groups is not None:
            raise ValueError(f"filter_groups: only 'stationary-w' takes filter_groups, got {filter_groups!r}")
        return None

    # -- the halo exchange and return with compute behind them ---------------------------
    def conv_behind_halo(self, x_loc, w_loc):
        """forward: halo exchange, the local convolution behind it · ``(x_win, y_part)``.

        Where the block is large enough (``self.halo.interior``; else ``self.halo.no_overlap``
        says why not), the output is convolved in two parts: its interior, which reads no halo
        cell, and the boundary strips around it.  With ``overlap_halo`` the exchange is started,
        the interior convolved while it is in flight, and the strips after the wait; without,
        the exchange is waited for first.  The same products either way, so the same bits."""
        box = self.halo.interior
        overlap = BEHIND_EXCHANGE if self.overlap_halo and box else ""
        started = self.halo.start_extend(x_loc, self.xp, overlap=overlap)  # halo exchange started
        if not overlap:
            started.wait()
        if box is None:
            x_win = started.wait()  # (n, c, h_win, w_win)
            return x_win, self.conv(x_win, w_loc)
        whole = (slice(None), slice(None))
        y = None
        for band in self.bands(box):  # the interior, MPI_Test between bands (poll_chunks)
            inner = self.conv(started.partial[self.halo.input_of(band)], w_loc)  # (n, F, band rows, box columns)
            if y is None:
                y = self.xp.empty(inner.shape[:2] + self.halo.out_shape, dtype=inner.dtype)  # (n, F, h', w')
            y[whole + band.slices()] = inner
            collectives.progress()
        x_win = started.wait()
        for strip in self.halo.output_strips(self.halo.out_shape):  # the cells that read the halo
            y[whole + strip.slices()] = self.conv(x_win[self.halo.input_of(strip)], w_loc)
        return x_win, y

    def backward_behind_halo(self, dy, w_loc, then=None):
        """backward: backward-data, the halo return of its window with compute behind it ·
        ``(dx_part, dw_part)``, partial sums (the caller reduces them).

        ``then(dx_part, overlap)``: where the algorithm moves ``dx_part`` on (Stationary-Y's
        reduce-scatter), it starts that call and returns its Request; backward-filter then
        runs behind it instead of behind the halo return, and the first item returned is that
        call's result.

        Where the block is large enough (``self.halo.interior``, forward's rule; else
        ``self.halo.no_overlap`` says why not), ``dx_win`` is computed in two parts: first the
        cells sent back to their owners (``halo.return_boxes``), then this rank's own
        (``halo.kept_box``), each from the ``dy`` cells that add into it (:meth:`conv_data_box`).
        With ``overlap_halo`` the return is started between the two, so that the own cells and
        backward-filter (which needs no halo: forward kept ``x_win``) run while it is in flight;
        without, it is started and waited for once ``dx_win`` is whole.  Where the block is too
        small, ``dx_win`` is computed whole and only backward-filter runs behind the return.
        The same sums of the same products either way, so the same bits."""
        halo, xp = self.halo, self.xp
        split = halo.interior is not None  # None on one rank, or a block too small to pay
        on = self.overlap_halo and halo.size > 1
        if split:
            dx_win = xp.empty(self.x_win.shape, dtype=dy.dtype)  # (n, c, h_win, w_win)
            for box in halo.return_boxes:  # the cells sent back (cells in no box are read by no one)
                dx_win[(slice(None), slice(None)) + box.slices()] = self.conv_data_box(dy, w_loc, box)
        else:
            dx_win = self.conv_data(dy, w_loc, self.x_win.shape)  # (n, c, h_win, w_win)
        if then is None:
            overlap = (BEHIND_RETURN if split else BEHIND_RETURN_WHOLE) if on else ""
        else:  # backward-filter goes behind the next call
            overlap = BEHIND_RETURN_OWN if on and split else ""
        back = halo.start_reduce(dx_win, xp, overlap=overlap) if overlap else None  # halo return started
        if split and halo.kept_box is not None:  # this rank's own cells, behind the return
            for band in self.bands(halo.kept_box):  # MPI_Test between bands (poll_chunks)
                dx_win[(slice(None), slice(None)) + band.slices()] = self.conv_data_box(dy, w_loc, band)
                collectives.progress()
        if back is None:
            back = halo.start_reduce(dx_win, xp)
            back.wait()
        if then is not None:
            started = then(back.wait(), BEHIND_NEXT if self.overlap_halo else "")  # e.g. the reduce-scatter
            if not self.overlap_halo:
                started.wait()
            dw_part = self.conv_filter(self.x_win, dy, w_loc.shape)
            return started.wait(), dw_part
        dw_part = self.conv_filter(self.x_win, dy, w_loc.shape)
        return back.wait(), dw_part

    def bands(self, box):
        """``box`` cut into ``poll_chunks`` bands of rows (of planes in a volume; fewer where it has
        fewer), in order.

        The work behind a halo call is computed band by band, and ``collectives.progress()``
        (MPI_Test of every call in flight) runs between them: MPICH moves a nonblocking call
        only inside an MPI call unless its progress thread runs (docs/parallel.md "Progress").
        The bands are cut the same in the blocking path, so the bits do not depend on it."""
        k = max(1, min(self.poll_chunks, box.hi[0] - box.lo[0]))  # rows (planes in a volume)
        edges = [box.lo[0] + (box.hi[0] - box.lo[0]) * i // k for i in range(k + 1)]
        return [Box.of((a,) + box.lo[1:], (b,) + box.hi[1:]) for a, b in zip(edges, edges[1:])]

    def conv_data_box(self, dy, w_loc, box):
        """Backward-data of the window cells in Box ``box`` only: ``(n, c) + box.shape``.

        Only the outputs that read a cell of the box add into it (``halo.outputs_reading``), so
        their ``dy`` is convolved back onto the rows and columns (planes too, in a volume) they
        span, and the box is cut out of that: each cell gets the products of the whole
        ``conv_data``, summed in its order (BLAS may round a smaller product differently in the
        last bit, so the blocking path makes the same split)."""
        halo = self.halo
        ranges = halo.outputs_reading(box)  # per spatial axis, the outputs [i0, i1) that read the box
        n, c = dy.shape[0], self.x_win.shape[1]
        out = self.xp.zeros((n, c) + box.shape, dtype=dy.dtype)  # cells no output reads stay 0
        if any(i0 == i1 for i0, i1 in ranges):
            return out
        span = Box.of([i0 * s for (i0, _), s in zip(ranges, halo.stride)],
                      [(i1 - 1) * s + d * (k - 1) + 1
                       for (_, i1), s, d, k in zip(ranges, halo.stride, halo.dilation, halo.kernel)])
        dy_part = dy[(slice(None), slice(None)) + tuple(slice(i0, i1) for i0, i1 in ranges)]
        part = self.conv_data(self.xp.ascontiguousarray(dy_part), w_loc, (n, c) + span.shape)
        cut = box.intersect(span)  # the box's cells that some output reads
        if cut is not None:
            out[(slice(None), slice(None)) + cut.slices(box)] = part[(slice(None), slice(None)) + cut.slices(span)]
        return out

    # -- local compute on this rank's window (no communication) -----------------------
    def conv(self, x_win, w_loc):
        if self.geom.dims == 3:
            y = self.backend.conv3d_forward(x_win, w_loc, **self._local)
        else:
            y = self.backend.conv2d_forward(x_win, w_loc, **self._local)
        self._priced("conv_fwd", x_win.shape, w_loc.shape, y.shape)
        return y

    def conv_data(self, dy, w_loc, x_win_shape):
        if self.geom.dims == 3:
            dx = self.backend.conv3d_backward_data(dy, w_loc, x_win_shape, **self._local)
        else:
            dx = self.backend.conv2d_backward_data(dy, w_loc, x_win_shape, **self._local)
        self._priced("conv_bwd_data", x_win_shape, w_loc.shape, dy.shape)
        return dx

    def conv_filter(self, x_win, dy, w_shape):
        if self.geom.dims == 3:
            dw = self.backend.conv3d_backward_filter(x_win, dy, w_shape, **self._local)
        else:
            dw = self.backend.conv2d_backward_filter(x_win, dy, w_shape, **self._local)
        self._priced("conv_bwd_filter", x_win.shape, w_shape, dy.shape)
        return dw

    def _priced(self, op, window, w_shape, y_shape):
        """On a priced simulated rank, the pass's time on the logical clock (refconv.simulated.clock)."""
        collectives.priced("conv", op, window, w_shape, y_shape, self.geom.stride, self.geom.dilation, self.geom.groups)

    def add_bias(self, y_loc, b_loc):
        if b_loc is None:
            return y_loc
        if self.geom.dims == 3:  # (n, F_i, d', h' w'): the 2-D bias add on a view, the same bytes
            return self.backend.bias_add(y_loc.reshape(y_loc.shape[:3] + (-1,)), b_loc).reshape(y_loc.shape)
        return self.backend.bias_add(y_loc, b_loc)

    def bias_grad(self, dy_loc):
        """This rank's partial ``db``: ``dy`` summed over its samples and rows (None without bias)."""
        if not self.geom.bias:
            return None
        return self.backend.conv3d_backward_bias(dy_loc) if self.geom.dims == 3 else self.backend.bias_grad(dy_loc)


class ChannelAlgorithm(Algorithm):
    """An algorithm that moves activations over a channel group: ``channel_comm``, whose
    rank ``i`` holds ``f_counts[i]`` channels of ``y``; ``c_counts`` are the ``|C_i|`` of the
    ranks whose ``x`` this rank gathers (``channel_comm``'s for Stationary-Y, Stationary-W's
    ``gather_comm``'s; Stationary-X does not use them)."""

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self.channel_comm, self.c_counts, self.f_counts = self.channel_group(grid, geom, filter_groups)

    @staticmethod
    def channel_group(grid, geom, filter_groups):
        """``(comm, c_counts, f_counts)``: here the whole channel group, ``P_c`` ranks by
        channel coordinate, with the blocks ``|C_i|`` and ``|F_i|`` of each."""
        return grid.channel_comm, block_sizes(geom.C, grid.P_c), block_sizes(geom.F, grid.P_c)
