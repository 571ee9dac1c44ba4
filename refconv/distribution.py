"""How a 4-D tensor (NCHW activations, FCKhKw weights) is laid out on a ProcessGrid.

A 5-D tensor (NCDHW volumes, FCKdKhKw weights of a 3-D convolution) is laid out the
same way, one entry of ``dims`` per tensor dim; its depth dim is split over the grid's
``"depth"`` axis where the grid has one (``ProcessGrid(..., depth=P_D)``), else whole.
``grid_shape`` has 4 or 5 sizes (:func:`refconv.grid.axes_of` names them).

Each tensor dim is either replicated (``None``), split into contiguous blocks over
one grid axis (``"channel"``), or split in the general way by a ``Split``: the dim
is cut into ``nblocks`` ``numpy.array_split`` blocks and the rank with coordinate
``c`` on ``axis`` holds the blocks ``blocks_of(c)``, concatenated in that order.

Stationary-W (docs/algorithms.md section 4) needs the general case.  With
``P_c = p_f * p_c'`` and channel coordinate ``c = a * p_c' + b``::

    Split.stationary_w_filters(P_c, p_f)   F: blocks a*p_c' .. a*p_c'+p_c'-1  (contiguous)
    Split.stationary_w_channels(P_c, p_f)  C: blocks b, p_c'+b, 2p_c'+b, ...  (p_f pieces)

so the weight of rank (a, b) is ``w[F_a, C_b]`` with ::

    Distribution(grid, (F, C, Kh, Kw), (Split.stationary_w_filters(P_c, p_f),
                                        Split.stationary_w_channels(P_c, p_f), None, None),
                 names=("F", "C", "Kh", "Kw"))

Moving data between distributions is in ``refconv.sharding``.
"""

import functools
import itertools

import numpy

from refconv.arrays import array_module
from refconv.grid import DEPTH, axes_of


def block_range(length, parts, index):
    """(start, stop) of block ``index`` of ``length`` split ``parts`` ways.

    numpy.array_split semantics: the first ``length % parts`` blocks get one extra.
    """
    if parts < 1:
        raise ValueError(f"block_range: parts must be >= 1, got {parts}")
    if not 0 <= index < parts:
        raise ValueError(f"block_range: index must be in [0, {parts}), got {index}")
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


class Split:
    """Split a dim over grid ``axis`` into ``nblocks`` blocks (default: the axis size);
    coordinate ``c`` holds blocks ``blocks_of(c)``: a callable, or a sequence indexed
    by coordinate (default: block ``c`` alone)."""

    def __init__(self, axis, nblocks=None, blocks_of=None):
        if axis not in axes_of(5):
            raise ValueError(f"Split: unknown axis {axis!r}; axes are {axes_of(5)}")
        self.axis = axis
        self.nblocks = nblocks
        if blocks_of is not None and not callable(blocks_of):
            blocks_of = tuple(tuple(int(j) for j in b) for b in blocks_of)
        self.blocks_of = blocks_of

    @classmethod
    def block(cls, axis):
        """Contiguous blocks, one per coordinate of ``axis``."""
        return cls(axis)

    # The Stationary-W splits tabulate every coordinate of the channel axis (P_c of them): made once
    # per (P_c, p_f, groups) in a process and shared, not once per layer on every rank (at 1024 ranks,
    # 52 convolutions of ResNet-50 on each of 1024 simulated ranks made them in 1.4 s a rank).
    @classmethod
    @functools.lru_cache(maxsize=256)
    def stationary_w_filters(cls, P_c, p_f, groups=1):
        """F of Stationary-W: coordinate c = g q + a p_c' + b (``q = P_c/groups``, docs/grouped.md
        for ``groups > 1``) holds F blocks g q + a p_c' .. g q + a p_c' + p_c' - 1."""
        p_cp = _factor(P_c // groups, p_f)
        return cls("channel", P_c, [[(c // p_cp) * p_cp + j for j in range(p_cp)] for c in range(P_c)])

    @classmethod
    @functools.lru_cache(maxsize=256)
    def stationary_w_channels(cls, P_c, p_f, groups=1):
        """C of Stationary-W: coordinate c = g q + a p_c' + b holds C blocks b, p_c'+b, ...,
        (p_f-1)p_c'+b of ``q`` blocks; with ``groups > 1`` those are blocks of the group's
        ``C/groups`` input channels, the columns of a grouped weight."""
        p_cp = _factor(P_c // groups, p_f)
        return cls("channel", P_c // groups, [[k * p_cp + c % p_cp for k in range(p_f)] for c in range(P_c)])

    def table(self, axis_size):
        """blocks_of tabulated for coordinates 0..axis_size-1, and nblocks."""
        nblocks = axis_size if self.nblocks is None else self.nblocks
        if self.blocks_of is None:
            return nblocks, tuple((c,) for c in range(axis_size))
        if callable(self.blocks_of):
            return nblocks, tuple(tuple(int(j) for j in self.blocks_of(c))
                                  for c in range(axis_size))
        return nblocks, self.blocks_of

    def __eq__(self, other):
        return (isinstance(other, Split) and (self.axis, self.nblocks, self.blocks_of)
                == (other.axis, other.nblocks, other.blocks_of))

    def __hash__(self):
        return hash((self.axis, self.nblocks))

    def __repr__(self):
        if self.nblocks is None and self.blocks_of is None:
            return f"Split.block({self.axis!r})"
        return f"Split({self.axis!r}, {self.nblocks!r}, {self.blocks_of!r})"


def _factor(q, p_f):
    if p_f < 1 or q % p_f:
        raise ValueError(f"Split: p_f={p_f} must divide the {q} ranks it factors")
    return q // p_f


class Distribution:
    """Layout of a 4-D (or 5-D) global tensor on a grid of shape ``grid_shape``.

    ``Distribution(grid_or_shape, global_shape, dims, names=("N", "C", "H", "W"))``;
    ``dims[d]`` is None, an axis name, or a Split.  Every rank's block must be
    non-empty in every dim.  A 5-D tensor's names default to ``("N", "C", "D", "H", "W")``.
    """

    def __init__(self, grid_shape, global_shape, dims, names=None):
        grid_shape = tuple(getattr(grid_shape, "shape", grid_shape))
        # Layers rebuild their distributions on every call (a property per layer and step): the arguments
        # are checked and tabulated once per distinct layout, and the results shared.
        try:
            checked = _checked(grid_shape, tuple(global_shape), tuple(dims), names)
        except (TypeError, ValueError):     # an unhashable argument (a list of names), or a bad one: checked as
            # given, and not kept, so that an error shows the arguments as they were passed
            checked = _checked.__wrapped__(grid_shape, global_shape, dims, names)
        self.grid_shape, self.global_shape, self.names, self.dims, layout = checked
        self._axis, self._tables, self._blocks, self._key, self._local_shapes = layout

    # -- convenience constructors ----------------------------------------------------------
    @classmethod
    def activations(cls, grid, shape, *, channel_split=True):
        """NCHW: N over sample, C over channel (or replicated), H over height, W over width;
        NCDHW: D also over depth where the grid has that axis (else whole)."""
        depth = (DEPTH if DEPTH in axes_of(getattr(grid, "shape", grid)) else None,) if len(shape) == 5 else ()
        return cls(grid, shape, ("sample", "channel" if channel_split else None) + depth + ("height", "width"))

    @classmethod
    def replicated(cls, grid, shape, names=None):
        return cls(grid, shape, (None,) * len(shape), names)

    # -- per-rank layout ---------------------------------------------------------------------
    def coords_of(self, rank_or_coords):
        if isinstance(rank_or_coords, (tuple, list)):
            return tuple(rank_or_coords)
        coords, rank = [], int(rank_or_coords)
        for p in reversed(self.grid_shape):
            coords.append(rank % p)
            rank //= p
        return tuple(reversed(coords))

    def pieces(self, rank_or_coords, dim):
        """This rank's (start, stop) ranges of dim ``dim``, in local order (adjacent merged)."""
        a = self._axis[dim]
        if a is None:
            return list(self._tables[dim][0:1])
        return list(self._tables[dim][self.coords_of(rank_or_coords)[a]])

    def axis_of(self, dim):
        """Grid axis index that splits ``dim``, or None when replicated."""
        return self._axis[dim]

    def blocks(self, dim):
        """(nblocks, per coordinate the tuple of block indices held), or None if replicated."""
        return self._blocks[dim]

    def table(self, dim):
        """Per coordinate of the dim's axis, its pieces (one entry when replicated)."""
        return self._tables[dim]

    def local_shape(self, rank_or_coords):
        coords = self.coords_of(rank_or_coords)
        shape = self._local_shapes.get(coords)  # shared by every Distribution of this layout
        if shape is None:
            shape = self._local_shapes[coords] = tuple(sum(e - s for s, e in self.pieces(coords, d))
                                                       for d in range(len(self.global_shape)))
        return shape

    def index(self, rank_or_coords, xp=numpy):
        """Indices of the local block in the global array: 4 (or 5) slices when every dim is
        one piece, else an ``xp.ix_`` tuple of index arrays."""
        pieces = [self.pieces(rank_or_coords, d) for d in range(len(self.global_shape))]
        if all(len(p) == 1 for p in pieces):
            return tuple(slice(p[0][0], p[0][1]) for p in pieces)
        return xp.ix_(*[xp.concatenate([xp.arange(s, e) for s, e in p]) for p in pieces])

    def extract(self, global_array, rank_or_coords):
        """The local block of ``rank_or_coords`` (a contiguous copy)."""
        self._check_global(global_array)
        xp = array_module(global_array)
        return xp.array(global_array[self.index(rank_or_coords, xp)], copy=True, order="C")

    def insert(self, global_array, local, rank_or_coords):
        """Write ``local`` into its place in ``global_array``."""
        self._check_global(global_array)
        if tuple(local.shape) != self.local_shape(rank_or_coords):
            raise ValueError(f"insert: local has shape {tuple(local.shape)} but rank "
                             f"{rank_or_coords} holds {self.local_shape(rank_or_coords)}")
        global_array[self.index(rank_or_coords, array_module(global_array))] = local

    def _check_global(self, a):
        if tuple(a.shape) != self.global_shape:
            raise ValueError(f"global array has shape {tuple(a.shape)}; "
                             f"this distribution is of {self.global_shape}")

    def __eq__(self, other):
        return isinstance(other, Distribution) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        dims = ", ".join(f"{n}:{d!r}" for n, d in zip(self.names, self.dims))
        return (f"Distribution(grid_shape={self.grid_shape}, "
                f"global_shape={self.global_shape}, dims=({dims}))")


@functools.lru_cache(maxsize=1024)
def _checked(grid_shape, global_shape, dims, names):
    """:class:`Distribution`'s arguments checked and normalised: ``(grid_shape, global_shape, names, dims,
    layout)`` with :func:`_layout`'s tables; a bad argument raises, naming it."""
    global_shape = tuple(int(n) for n in global_shape)
    if len(grid_shape) not in (4, 5) or any(int(p) < 1 for p in grid_shape):
        raise ValueError(f"Distribution: grid_shape must be 4 sizes >= 1 (5 with depth), got {grid_shape}")
    ndim = 5 if len(global_shape) == 5 else 4
    if names is None:
        names = ("N", "C", "D", "H", "W") if ndim == 5 else ("N", "C", "H", "W")
    if len(global_shape) != ndim or len(dims) != ndim or len(names) != ndim:
        raise ValueError(f"Distribution: need {ndim} sizes, {ndim} dims and {ndim} names; got "
                         f"{global_shape}, {dims}, {names}")
    grid_shape = tuple(int(p) for p in grid_shape)
    names = tuple(names)
    dims = tuple(Split.block(d) if isinstance(d, str) else d for d in dims)
    for d, spec in enumerate(dims):
        if spec is not None and not isinstance(spec, Split):
            raise ValueError(f"Distribution: dims[{d}] must be None, an axis name "
                             f"{axes_of(grid_shape)} or a Split, got {spec!r}")
    return grid_shape, global_shape, names, dims, _layout(grid_shape, global_shape, dims, names)


@functools.lru_cache(maxsize=1024)
def _layout(grid_shape, global_shape, dims, names):
    """Validate a layout and tabulate it: ``(axis, tables, blocks, key, local shapes)`` per dim
    (see :class:`Distribution`); cached, so each distinct layout is computed once."""
    # Per dim: its grid axis (None: replicated), per coordinate its (start, stop) pieces,
    # and (nblocks, per coordinate its block indices) (None: replicated).
    axes, tables, blocks = [], [], []
    for d, (spec, length, name) in enumerate(zip(dims, global_shape, names)):
        if spec is None:
            if length < 1:
                raise ValueError(f"Distribution: dim {name} has length {length}; need >= 1")
            axes.append(None)
            blocks.append(None)
            tables.append(((0, length),))
            continue
        if spec.axis not in axes_of(grid_shape):
            raise ValueError(f"Distribution: dim {name} is split over axis {spec.axis!r}, which a grid of shape "
                             f"{grid_shape} does not have; axes are {axes_of(grid_shape)}")
        a = axes_of(grid_shape).index(spec.axis)
        nblocks, table = spec.table(grid_shape[a])
        if len(table) != grid_shape[a]:
            raise ValueError(f"Distribution: dim {name}: blocks_of has {len(table)} "
                             f"entries but axis {spec.axis} has {grid_shape[a]}")
        if nblocks > length:
            raise ValueError(f"dim {name} of length {length} cannot be split {nblocks} "
                             f"ways: rank block would be empty")
        for c, held in enumerate(table):
            if (not held or len(set(held)) != len(held)
                    or any(not 0 <= j < nblocks for j in held)):
                raise ValueError(f"Distribution: dim {name}: coordinate {c} holds blocks "
                                 f"{held}; need a non-empty list of distinct block "
                                 f"indices within [0, {nblocks})")
        missing = set(range(nblocks)) - {j for b in table for j in b}
        if missing:
            raise ValueError(f"Distribution: dim {name}: blocks {sorted(missing)} "
                             f"are held by no coordinate")
        axes.append(a)
        blocks.append((nblocks, table))
        tables.append(tuple(_merge([block_range(length, nblocks, j) for j in b]) for b in table))
    _check_shared_axes(grid_shape, axes, blocks, names)
    key = (grid_shape, global_shape, tuple(zip(axes, tables)))
    return tuple(axes), tuple(tables), tuple(blocks), key, {}


def _check_shared_axes(grid_shape, axes, blocks, names):
    """Dims split over one axis (F and C of Stationary-W) must still cover every
    combination of their blocks."""
    for a in range(len(grid_shape)):
        dims = [d for d in range(len(axes)) if axes[d] == a]
        if len(dims) < 2:
            continue
        held = {cell for c in range(grid_shape[a])
                for cell in itertools.product(*[blocks[d][1][c] for d in dims])}
        for cell in itertools.product(*[range(blocks[d][0]) for d in dims]):
            if cell not in held:
                joined = " and ".join(names[d] for d in dims)
                raise ValueError(f"Distribution: dims {joined} are both split over axis "
                                 f"{axes_of(grid_shape)[a]} and no rank holds their blocks {cell}")


def _merge(pieces):
    out = []
    for s, e in pieces:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return tuple(out)


def block_size(length, parts, index):
    """The length of block ``index`` of ``length`` split ``parts`` ways."""
    start, stop = block_range(length, parts, index)
    return stop - start


def block_sizes(length, parts):
    """The lengths of all ``parts`` blocks of ``length`` (``numpy.array_split``)."""
    return [block_size(length, parts, i) for i in range(parts)]
