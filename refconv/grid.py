"""The process grid: P = P_N * P_c * P_H * P_W ranks and their sub-communicators.

Rank layout (row-major, sample outermost, on ``comm``'s ranks)::

    rank = ((n * P_c + c) * P_H + h) * P_W + w          coords = (n, c, h, w)

A volume (NCDHW, a 3-D convolution) may also be split over depth:
``ProcessGrid(comm, ..., depth=P_D)`` with ``P_D > 1`` is the 5-D grid
``sample x channel x depth x height x width``, with ``shape``, ``coords`` and ``axes``
of five entries and ::

    rank = (((n * P_c + c) * P_D + d) * P_H + h) * P_W + w    coords = (n, c, d, h, w)

A grid that does not split depth (``depth=1``, the default) is the 4-D grid above,
the same object as before depth existed: every 2-D layer runs on it, and a volume on
it is whole along depth (``P_D = 1``).  :data:`AXES` names the four axes of that grid,
in rank-layout order; a 5-D grid's axes are :func:`axes_of` ``(5)``, AXES with
:data:`DEPTH` after channel; ``grid.axes`` names the axes a grid has.

Sub-communicators (docs/algorithms.md section 2), all built once with ``comm.Split``
and cached:

===================  =====================================  ==========================
name                 members (differ from this rank only in)  used for
===================  =====================================  ==========================
``channel_comm``     channel                                 allgather / reduce-scatter
                                                             of activations
``weight_peers_comm``  every axis but channel               the segmented allreduce of dw
``sub_comm(axes)``   any set of axes                         ``("height", "width")``: the
                                                             spatial group of the halo
                                                             exchange (with ``"depth"`` on
                                                             a 5-D grid); the general case
``axis_comm(name)``  one axis                                ``"sample"``: the classifier
                                                             head's allreduce
===================  =====================================  ==========================

Stationary-W factors the channel coordinate ``c = a * p_c' + b`` with
``P_c = p_f * p_c'``; ``stationary_w_comms(p_f)`` returns ``(comm_f, comm_c)``:
the ``p_f`` ranks ``(., b)`` ordered by ``a``, and the ``p_c'`` ranks ``(a, .)``
ordered by ``b``.  ``stationary_w_comms(p_f, groups)`` does the same within each
group of ``q = P_c / groups`` ranks of a grouped layer whose groups span ranks
(``c = g q + a p_c' + b``, ``q = p_f * p_c'``; docs/grouped.md).

Every method that builds a communicator is collective over ``comm``: all ranks
must call it, with the same arguments, in the same order.

A grid owns the sub-communicators it built: ``grid.close()`` (or ``grid.free()``, or
``with ProcessGrid(...) as grid:``) frees them, collectively, and is safe to call twice.  A grid
left open is a leak that simulated ranks report (:mod:`refconv.simulated.leaks`).
"""

import math
import operator

from mpi4py import MPI

from refconv import checks, collectives

AXES = ("sample", "channel", "height", "width")
DEPTH = "depth"  # the axis a 5-D grid adds, after channel: sample x channel x depth x height x width
SPATIAL = 2  # where the spatial axes start, in AXES and in a 5-D grid's axes


def axes_of(shape_or_ndim):
    """The axes of a grid of this shape (or number of axes): :data:`AXES` for 4, and for 5
    AXES with :data:`DEPTH` before the other spatial axes."""
    ndim = shape_or_ndim if isinstance(shape_or_ndim, int) else len(tuple(shape_or_ndim))
    if ndim not in (4, 5):
        raise ValueError(f"grid: expected a grid shape of 4 sizes {AXES} (5 with {DEPTH!r}), got {shape_or_ndim!r}")
    return AXES if ndim == 4 else AXES[:SPATIAL] + (DEPTH,) + AXES[SPATIAL:]


def _check_size(name, value):
    """An int >= 1, else a ValueError naming the argument (same on every rank)."""
    if isinstance(value, bool):
        raise ValueError(f"grid: {name} must be an int >= 1, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"grid: {name} must be an int >= 1, got {value!r}") from None
    if value < 1:
        raise ValueError(f"grid: {name} must be an int >= 1, got {value}")
    return value


def _normalize_axes(axes, grid_axes):
    """Axis names in ``grid_axes`` order (no duplicates); a bare string means one axis.  Depth
    on a grid that does not split it is an axis of one rank, so it adds no member: left out."""
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    for a in axes:
        if a not in grid_axes and a != DEPTH:
            raise ValueError(f"grid: unknown axis {a!r}; axes are {grid_axes}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"grid: axes {axes} name an axis twice")
    return tuple(a for a in grid_axes if a in axes)


class ProcessGrid:
    """A 4-D grid (sample, channel, height, width) over the ranks of ``comm``, or the 5-D
    grid (sample, channel, depth, height, width) when ``depth > 1``.

    ``ProcessGrid(comm, sample=P_N, channel=P_c, height=P_H, width=P_W)``, and
    ``depth=P_D`` for a volume split over depth; the product must equal ``comm.size``.
    ``P_D`` is 1 on a 4-D grid.  Validation is local and identical on every rank, so a bad
    grid raises the same ValueError everywhere before any communication.
    """

    def __init__(self, comm=None, *, sample=1, channel=1, depth=1, height=1, width=1):
        comm = MPI.COMM_WORLD if comm is None else comm   # read now: on a simulated rank, its world
        sizes = dict(zip(axes_of(5), (_check_size(n, v) for n, v in
                                      zip(axes_of(5), (sample, channel, depth, height, width)))))
        self.axes = axes_of(5 if sizes[DEPTH] > 1 else 4)
        shape = tuple(sizes[a] for a in self.axes)
        total = math.prod(shape)
        collectives.check_comm(comm, "grid")   # an MPI communicator bound before a simulated run is the process's
        if total != comm.Get_size():
            raise ValueError(
                f"grid: {'*'.join(self.axes)} = {total} but the communicator "
                f"has {comm.Get_size()} ranks; choose sizes whose product is {comm.Get_size()}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = total
        self.shape = shape
        self.P_N, self.P_c, self.P_D, self.P_H, self.P_W = (sizes[a] for a in axes_of(5))
        self.coords = self.coords_of(self.rank)
        self._cache = {}

    @property
    def volume_shape(self):
        """``(P_N, P_c, P_D, P_H, P_W)``, with ``P_D = 1`` on a 4-D grid: the grid as a volume sees it."""
        return (self.P_N, self.P_c, self.P_D, self.P_H, self.P_W)

    @property
    def volume_coords(self):
        """``(n, c, d, h, w)``, with ``d = 0`` on a 4-D grid."""
        return self.coords if len(self.coords) == 5 else self.coords[:2] + (0,) + self.coords[2:]

    @property
    def spatial_axes(self):
        """The spatial axes this grid has: ``("height", "width")``, with ``"depth"`` first on a 5-D grid."""
        return self.axes[SPATIAL:]

    # -- rank <-> coords -------------------------------------------------------
    def coords_of(self, rank):
        """(n, c, h, w) of ``rank``; (n, c, d, h, w) on a 5-D grid."""
        if not 0 <= rank < self.size:
            raise ValueError(f"grid: rank must be in [0, {self.size}), got {rank}")
        coords = []
        for p in reversed(self.shape):
            coords.append(rank % p)
            rank //= p
        return tuple(reversed(coords))

    def rank_of(self, coords):
        """Rank of (n, c, h, w), or (n, c, d, h, w) on a 5-D grid."""
        coords = tuple(coords)
        if len(coords) != len(self.shape) or not all(0 <= x < p for x, p in zip(coords, self.shape)):
            raise ValueError(f"grid: coords must be {len(self.shape)} indices within {self.shape}, got {coords}")
        rank = 0
        for x, p in zip(coords, self.shape):
            rank = rank * p + x
        return rank

    # -- sub-communicators ---------------------------------------------------------
    def _split(self, key, color, order):
        if key not in self._cache:
            sub = collectives.split(self.comm, color, order)
            sub.Set_name(_comm_name(key))
            self._cache[key] = sub
        return self._cache[key]

    def sub_comm(self, axes):
        """Ranks that differ from this one only along ``axes``.

        Ranked in row-major order of their coordinates on ``axes`` (taken in the grid's
        axes order, so sub-rank order follows world-rank order).  Collective.
        """
        axes = _normalize_axes(axes, self.axes)
        inside = [self.axes.index(a) for a in axes]
        outside = [i for i in range(len(self.axes)) if i not in inside]
        color = _linear([self.coords[i] for i in outside], [self.shape[i] for i in outside])
        order = _linear([self.coords[i] for i in inside], [self.shape[i] for i in inside])
        return self._split(("sub", axes), color, order)

    def axis_comm(self, name):
        """The ranks that differ from this one only along axis ``name``."""
        return self.sub_comm((name,))

    @property
    def channel_comm(self):
        """The channel group: P_c ranks, ordered by channel coordinate."""
        return self.sub_comm(("channel",))

    @property
    def weight_peers_comm(self):
        """The P / P_c ranks sharing this rank's channel coordinate (same weight shard)."""
        return self.sub_comm(tuple(a for a in self.axes if a != "channel"))

    def stationary_w_comms(self, filter_groups, groups=1):
        """(comm_f, comm_c) of Stationary-W, with p_f = filter_groups.

        The channel group is factored ``P_c = groups x p_f x p_c'``: coordinate
        ``c = g q + a p_c' + b`` with ``q = P_c / groups`` (``groups = 1``, ``g = 0``
        but for a grouped layer whose groups span ranks: docs/grouped.md).
        comm_f: the p_f ranks (g, ., b) of this channel group, ordered by a.
        comm_c: the p_c' ranks (g, a, .) of this channel group, ordered by b.
        """
        p_f, groups = _check_size("filter_groups", filter_groups), _check_size("groups", groups)
        if self.P_c % (groups * p_f):
            q = self.P_c // groups
            divisors = checks.divisors(q)
            within = f"P_c={self.P_c}" if groups == 1 else f"P_c/groups={q} (P_c={self.P_c}, groups={groups})"
            raise ValueError(f"grid: filter_groups={p_f} must divide {within}; choose one of {divisors}")
        q = self.P_c // groups
        p_cp = q // p_f
        c = self.coords[1]
        g, (a, b) = c // q, divmod(c % q, p_cp)
        outside = _linear(self.coords[:1] + self.coords[2:], self.shape[:1] + self.shape[2:]) * groups + g
        comm_f = self._split(("w_f", p_f, groups), outside * p_cp + b, a)
        comm_c = self._split(("w_c", p_f, groups), outside * p_f + a, b)
        return comm_f, comm_c

    def free(self):
        """Free every cached sub-communicator (never ``comm``).  Safe to call twice; a grid used again
        after it builds its sub-communicators anew (collectively, as the first time)."""
        for sub in self._cache.values():
            if sub != MPI.COMM_NULL:
                sub.Free()
        self._cache.clear()

    def close(self):
        """:meth:`free`, under the name every refconv object that frees what it made has
        (:meth:`refconv.model.Model.close`, ``Sequential.close``): collective, safe twice."""
        self.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def __repr__(self):
        sizes = ", ".join(f"{a}={p}" for a, p in zip(self.axes, self.shape))
        return f"ProcessGrid({sizes}; rank {self.rank} at {self.coords})"


def grids_in(*objects):
    """Every :class:`ProcessGrid` that ``objects`` (models, containers, layers) hold, each once, in the order
    found: through their attributes, lists, tuples and dicts, into refconv's layers and models only."""
    found, seen, stack = {}, set(), list(reversed(objects))
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, ProcessGrid):
            found[id(obj)] = obj
        elif isinstance(obj, (list, tuple)):
            stack.extend(reversed(obj))
        elif isinstance(obj, dict):
            stack.extend(reversed(list(obj.values())))
        elif type(obj).__module__.startswith(("refconv.layers", "refconv.model")) and hasattr(obj, "__dict__"):
            stack.extend(reversed(list(vars(obj).values())))
    return list(found.values())


def close_grids(*objects):
    """Close (:meth:`ProcessGrid.close`) every grid ``objects`` hold: collective, safe to call twice."""
    for grid in grids_in(*objects):
        grid.close()


def _comm_name(key):
    """A sub-communicator's name, for the collective watchdog's timeout line: "channel",
    "sample+height+width", "stationary-w comm_f (p_f=2)"..."""
    if key[0] == "sub":
        return "+".join(key[1])
    kind, p_f, groups = key
    return f"stationary-w comm_{kind[2:]} (p_f={p_f}" + (f", groups={groups})" if groups > 1 else ")")


def _linear(coords, sizes):
    index = 0
    for x, p in zip(coords, sizes):
        index = index * p + x
    return index
