"""Moving a distributed 4-D tensor: scatter, gather, allgather, redistribute.

All communication goes through ``refconv.collectives``:

==================  ==============================  =================================
function            collective                      result
==================  ==============================  =================================
``scatter``         Scatterv from root              this rank's block
``gather``          Gatherv to root                 the global array on root, else None
``allgather``       Allgatherv                      the global array on every rank
``redistribute``    Alltoallv (the "shuffle")       this rank's block under dst_dist
==================  ==============================  =================================

``scatter``, ``gather`` and ``allgather`` take any array that speaks DLPack or
``__cuda_array_interface__`` (a torch tensor, a JAX array; zero-copy where it can,
:func:`refconv.arrays.as_array`) and return NumPy or CuPy arrays, which speak DLPack
too: ``torch.from_dlpack(refconv.gather(...))`` shares their memory.

Replicated data is sent once: each global element has exactly one *owner*, the
rank that holds it with coordinate 0 on every grid axis the distribution does
not use, and, on each axis it does use, the lowest coordinate holding that
element's blocks.  Only owners send in gather, allgather and redistribute.
"""

import dataclasses
import functools
import itertools

import numpy

from refconv import collectives
from refconv.arrays import array_module, as_array
from refconv.distribution import Distribution, block_range


def _segments(dist, coords, dim):
    """[(global start, global stop, local start)] of every block ``coords`` holds in dim."""
    length = dist.global_shape[dim]
    if dist.blocks(dim) is None:
        return [(0, length, 0)]
    nblocks, table = dist.blocks(dim)
    out, local = [], 0
    for j in table[coords[dist.axis_of(dim)]]:
        s, e = block_range(length, nblocks, j)
        out.append((s, e, local))
        local += e - s
    return out


def block_of(length, parts, x):
    """The index of the ``block_range(length, parts, ·)`` block holding element ``x``: its inverse, in O(1)."""
    base, extra = divmod(length, parts)
    boundary = extra * (base + 1)
    return x // (base + 1) if x < boundary else extra + (x - boundary) // base


def _holders(dist):
    """Per dim (None where replicated) ``{block j: frozenset of the coordinates holding it}`` on the
    dim's axis: the inverse of ``dist.blocks(d)[1]``, made once per layout and shared by every rank
    (cached by the layout's arguments: hashing the Distribution hashes its tables, O(ranks))."""
    return _holders_of(dist.grid_shape, dist.global_shape, dist.dims, dist.names)


@functools.lru_cache(maxsize=1024)
def _holders_of(grid_shape, global_shape, dims, names):
    dist = Distribution(grid_shape, global_shape, dims, names)   # the cached layout (distribution._layout)
    out = []
    for d in range(len(dist.global_shape)):
        if dist.blocks(d) is None:
            out.append(None)
            continue
        held = {}
        for c, js in enumerate(dist.blocks(d)[1]):
            for j in js:
                held.setdefault(j, set()).add(c)
        out.append({j: frozenset(cs) for j, cs in held.items()})
    return tuple(out)


def _dims_by_axis(dist):
    """Per grid axis, the tensor dims split over it (in dim order)."""
    return [[d for d in range(len(dist.global_shape)) if dist.axis_of(d) == a] for a in range(len(dist.grid_shape))]


def _rank_of(dist, coords):
    rank = 0
    for c, p in zip(coords, dist.grid_shape):
        rank = rank * p + c
    return rank


def owned_boxes(dist, rank):
    """Boxes of global elements ``rank`` owns: a list of 4-tuples (5-tuples for a volume) of
    (global start, global stop, local start), one per dim.  O(this rank's blocks x their
    replication), not O(ranks): a cell's owner is the lowest coordinate in ``_holders``."""
    coords = dist.coords_of(rank)
    ndim = len(dist.global_shape)
    holders = _holders(dist)
    per_axis = []          # per grid axis: list of {dim: segment} cells owned
    for a, dims in enumerate(_dims_by_axis(dist)):
        if not dims:
            if coords[a] != 0:
                return []
            continue
        tables = {d: dist.blocks(d)[1] for d in dims}
        cells = []
        for combo in itertools.product(*[tables[d][coords[a]] for d in dims]):
            owner = min(frozenset.intersection(*[holders[d][j] for d, j in zip(dims, combo)]))
            if owner == coords[a]:
                cells.append(dict(zip(dims, combo)))
        per_axis.append((dims, cells))
    segments = [{s[0]: s for s in _segments(dist, coords, d)} for d in range(ndim)]
    boxes = []
    for choice in itertools.product(*[cells for _, cells in per_axis]):
        box = [None] * ndim
        for cell in choice:
            for d, j in cell.items():
                nblocks = dist.blocks(d)[0]
                box[d] = segments[d][block_range(dist.global_shape[d], nblocks, j)[0]]
        for d in range(ndim):
            if box[d] is None:               # replicated dim
                box[d] = (0, dist.global_shape[d], 0)
        boxes.append(tuple(box))
    return boxes


def _box_size(box):
    return int(numpy.prod([e - s for s, e, _ in box]))


def _local_slices(box):
    return tuple(slice(l, l + e - s) for s, e, l in box)


def _global_slices(box):
    return tuple(slice(s, e) for s, e, _ in box)


def _pack(local, boxes, xp):
    if not boxes:
        return xp.empty(0, local.dtype)
    return xp.concatenate([xp.ravel(local[_local_slices(b)]) for b in boxes])


def _unpack_global(out, flat, boxes):
    offset = 0
    for b in boxes:
        n = _box_size(b)
        out[_global_slices(b)] = flat[offset:offset + n].reshape([e - s for s, e, _ in b])
        offset += n


def _check(local, dist, grid):
    if tuple(dist.grid_shape) != tuple(grid.shape):
        raise ValueError(f"distribution is for a grid of shape {dist.grid_shape}, "
                         f"the grid has shape {grid.shape}")
    if local is not None and tuple(local.shape) != dist.local_shape(grid.rank):
        raise ValueError(f"local block has shape {tuple(local.shape)}; rank {grid.rank} "
                         f"holds {dist.local_shape(grid.rank)} under {dist}")


def _check_size(local, dist, grid):
    """Like _check, but the distribution may be of any grid shape over the same ranks:
    redistribute moves data between layers on different grids of one communicator."""
    if int(numpy.prod(dist.grid_shape)) != grid.size:
        raise ValueError(f"distribution is for a grid of shape {dist.grid_shape} "
                         f"({int(numpy.prod(dist.grid_shape))} ranks), the communicator has {grid.size}")
    if local is not None and tuple(local.shape) != dist.local_shape(grid.rank):
        raise ValueError(f"local block has shape {tuple(local.shape)}; rank {grid.rank} "
                         f"holds {dist.local_shape(grid.rank)} under {dist}")


def scatter(global_array, dist, grid, root=0):
    """Root's global array -> this rank's block (root reads ``global_array``;
    other ranks may pass None).

    A missing or wrongly shaped array on the root raises the same ValueError on
    every rank.  To bind a layer to the array's shape first, use
    ``layer.scatter_input(x)``.
    """
    _check(None, dist, grid)
    error = None
    if grid.rank == root:
        try:
            global_array = None if global_array is None else as_array(global_array, "global_array")
        except (TypeError, RuntimeError, BufferError) as exc:  # e.g. a torch tensor that requires grad
            error = (f"global_array: cannot be read as an array ({exc}); pass a NumPy or CuPy array, or "
                     f"a tensor that speaks DLPack (for torch, tensor.detach())")
        shape = getattr(global_array, "shape", None)
        if error is None and (shape is None or tuple(shape) != tuple(dist.global_shape)):
            error = (f"global_array: expected an array of shape {tuple(dist.global_shape)} on root rank {root}, "
                     f"got {'None' if global_array is None else shape if shape is not None else type(global_array).__name__}")
    error = collectives.bcast_object(grid.comm, error, root=root)
    if error:
        raise ValueError(error)
    blocks = None
    if grid.rank == root:
        blocks = [dist.extract(global_array, r) for r in range(grid.size)]
    return collectives.scatter(grid.comm, blocks, dist.local_shape(grid.rank), root=root)


def gather(local, dist, grid, root=0):
    """Every rank's block -> the global array on root; None on the other ranks."""
    local = as_array(local, "local")
    _check(local, dist, grid)
    xp = array_module(local)
    boxes = [owned_boxes(dist, r) for r in range(grid.size)]
    sizes = [(sum(_box_size(b) for b in bx),) for bx in boxes]
    parts = collectives.gather(grid.comm, _pack(local, boxes[grid.rank], xp), sizes, root=root)
    if parts is None:
        return None
    out = xp.empty(dist.global_shape, local.dtype)
    for flat, bx in zip(parts, boxes):
        _unpack_global(out, flat, bx)
    return out


def allgather(local, dist, grid):
    """Every rank's block -> the global array on every rank (one Allgatherv)."""
    local = as_array(local, "local")
    _check(local, dist, grid)
    xp = array_module(local)
    boxes = [owned_boxes(dist, r) for r in range(grid.size)]
    counts = [sum(_box_size(b) for b in bx) for bx in boxes]
    flat = collectives.allgather(grid.comm, _pack(local, boxes[grid.rank], xp), counts)
    out = xp.empty(dist.global_shape, local.dtype)
    offset = 0
    for n, bx in zip(counts, boxes):
        _unpack_global(out, flat[offset:offset + n], bx)
        offset += n
    return out


def _plan(src_boxes, dst, q):
    """Pieces rank r sends to q: [(src local slices, dst local slices)] in a fixed order."""
    coords = dst.coords_of(q)
    dst_segs = [_segments(dst, coords, d) for d in range(len(dst.global_shape))]
    plan = []
    for box in src_boxes:
        per_dim = []
        for (s, e, ls), segs in zip(box, dst_segs):
            hits = []
            for ds, de, dl in segs:
                lo, hi = max(s, ds), min(e, de)
                if lo < hi:
                    hits.append((slice(ls + lo - s, ls + hi - s), slice(dl + lo - ds, dl + hi - ds)))
            per_dim.append(hits)
        for combo in itertools.product(*per_dim):
            plan.append((tuple(c[0] for c in combo), tuple(c[1] for c in combo)))
    return plan


def _plan_size(plan):
    return sum(int(numpy.prod([sl.stop - sl.start for sl in src])) for src, _ in plan)


def _blocks_meeting(dist, d, start, stop):
    """The blocks of dim ``d`` under ``dist`` that meet the global range [start, stop)."""
    nblocks = dist.blocks(d)[0]
    length = dist.global_shape[d]
    return range(block_of(length, nblocks, start), block_of(length, nblocks, stop - 1) + 1)


def _receivers(dst, boxes):
    """The ranks whose ``dst`` block may meet one of ``boxes`` (a superset, sorted): per grid axis the
    coordinates holding a block each box meets, in every dim on that axis (every coordinate where
    ``dst`` replicates over the axis)."""
    holders, found = _holders(dst), set()
    for box in boxes:
        per_axis = []
        for a, dims in enumerate(_dims_by_axis(dst)):
            if not dims:
                per_axis.append(range(dst.grid_shape[a]))
                continue
            coords = None
            for d in dims:
                held = set().union(*[holders[d][j] for j in _blocks_meeting(dst, d, box[d][0], box[d][1])
                                     if j in holders[d]])
                coords = held if coords is None else coords & held
            per_axis.append(sorted(coords))
        found.update(_rank_of(dst, c) for c in itertools.product(*per_axis))
    return sorted(found)


def _senders(src, dst, rank):
    """The ranks whose owned ``src`` boxes may meet ``rank``'s ``dst`` block (a superset, sorted): per grid
    axis of ``src`` the owners of the blocks ``rank``'s block meets (coordinate 0 where ``src`` does not use it)."""
    holders, coords = _holders(src), dst.coords_of(rank)
    per_axis = []
    for a, dims in enumerate(_dims_by_axis(src)):
        if not dims:
            per_axis.append((0,))
            continue
        met = [sorted({j for s, e, _ in _segments(dst, coords, d) for j in _blocks_meeting(src, d, s, e)})
               for d in dims]
        owners = set()
        for combo in itertools.product(*met):
            holding = frozenset.intersection(*[holders[d].get(j, frozenset()) for d, j in zip(dims, combo)])
            if holding:
                owners.add(min(holding))
        per_axis.append(sorted(owners))
    return sorted(_rank_of(src, c) for c in itertools.product(*per_axis))


def _sends(mine, dst, size):
    """sends[q] for q < size: the pieces of ``mine`` (owned boxes) each rank q receives; O(the receivers)."""
    sends = [()] * size                  # one shared empty plan: K pointers, not K lists (64 KiB at 1024 ranks)
    for q in _receivers(dst, mine):
        sends[q] = _plan(mine, dst, q)
    return sends


def send_counts(src_dist, dst_dist, rank):
    """Elements ``rank`` sends to each rank (itself included) in :func:`redistribute` from
    ``src_dist`` to ``dst_dist``: pure geometry, no communication (the planner prices it)."""
    size = int(numpy.prod(dst_dist.grid_shape))
    return [_plan_size(plan) for plan in _sends(owned_boxes(src_dist, rank), dst_dist, size)]


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """One rank's part of :func:`redistribute` from ``src`` to ``dst``: pure geometry, made
    once (``plan_shuffle``) and reused by every call (``refconv.layers.Redistribute`` plans
    at bind).  A piece is (src local slices, dst local slices), in a fixed order."""
    src: object                 # the Distribution sent from
    dst: object                 # the Distribution received into
    rank: int
    sends: list                 # sends[q]: the pieces this rank sends to rank q
    receives: list              # receives[r]: the pieces rank r sends to this rank


def plan_shuffle(src_dist, dst_dist, rank):
    """The :class:`Shuffle` of ``rank`` from ``src_dist`` to ``dst_dist`` (same global shape).

    Its cost depends on this rank's part, not on the number of ranks: only the ranks whose blocks
    can meet this rank's are intersected with it (``_receivers``, ``_senders``), and the rest of
    the K-long lists are empty."""
    if src_dist.global_shape != dst_dist.global_shape:
        raise ValueError(f"redistribute: global shapes differ: {src_dist.global_shape} "
                         f"vs {dst_dist.global_shape}")
    size = int(numpy.prod(src_dist.grid_shape))
    receives = [()] * size               # as in _sends: the empty plans are one shared ()
    for r in _senders(src_dist, dst_dist, rank):
        receives[r] = _plan(owned_boxes(src_dist, r), dst_dist, rank)
    return Shuffle(src_dist, dst_dist, rank, sends=_sends(owned_boxes(src_dist, rank), dst_dist, size),
                   receives=receives)


def redistribute(local, src_dist, dst_dist, grid, *, shuffle=None):
    """This rank's block under ``src_dist`` -> its block under ``dst_dist`` (same global
    shape), with one uneven all-to-all.  Each element is sent once, by its owner.

    The two distributions may be of different grid shapes (consecutive layers on
    different grids); ``grid`` is any grid over the communicator of both: only its
    ``comm``, ``rank`` and ``size`` are used.  Rank ``r`` has coordinates
    ``src_dist.coords_of(r)`` in one and ``dst_dist.coords_of(r)`` in the other.
    ``shuffle``: this rank's plan (``plan_shuffle``), made here when not given."""
    _check_size(local, src_dist, grid)
    _check_size(None, dst_dist, grid)
    if shuffle is None:
        shuffle = plan_shuffle(src_dist, dst_dist, grid.rank)
    elif (shuffle.src, shuffle.dst, shuffle.rank) != (src_dist, dst_dist, grid.rank):
        raise ValueError(f"redistribute: shuffle was planned for rank {shuffle.rank} from {shuffle.src} "
                         f"to {shuffle.dst}, not rank {grid.rank} from {src_dist} to {dst_dist}")
    xp = array_module(local)
    nothing = xp.empty(0, local.dtype)      # one for every rank this one sends nothing to (most, at scale)
    sends = [xp.concatenate([xp.ravel(local[s]) for s, _ in plan]) if plan else nothing for plan in shuffle.sends]
    received = collectives.alltoallv(grid.comm, sends, [(_plan_size(p),) for p in shuffle.receives],
                                     dtype=local.dtype)
    out = xp.empty(dst_dist.local_shape(grid.rank), local.dtype)
    for flat, plan in zip(received, shuffle.receives):
        offset = 0
        for _, dst in plan:
            shape = [sl.stop - sl.start for sl in dst]
            n = int(numpy.prod(shape))
            out[dst] = flat[offset:offset + n].reshape(shape)
            offset += n
    return out
