"""The process grid: P = P_N * P_c * P_H * P_W ranks and their sub-communicators.

Rank layout (row-major, sample outermost, on ``comm``'s ranks)::

    rank = ((n * P_c + c) * P_H + h) * P_W + w          coords = (n, c, h, w)

Sub-communicators (docs/algorithms.md section 2), all built once with ``comm.Split``
and cached:

===================  =====================================  ==========================
name                 members (differ from this rank only in)  used for
===================  =====================================  ==========================
``channel_comm``     channel                                 allgather / reduce-scatter
                                                             of activations
``weight_peers_comm``  sample, height, width                 the segmented allreduce of dw
``sub_comm(axes)``   any set of axes                         ``("height", "width")``: the
                                                             spatial group of the halo
                                                             exchange; the general case
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
"""

import operator

from mpi4py import MPI

from refconv import checks, collectives

AXES = ("sample", "channel", "height", "width")


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


def _normalize_axes(axes):
    """Axis names in AXES order (no duplicates); a bare string means one axis."""
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    for a in axes:
        if a not in AXES:
            raise ValueError(f"grid: unknown axis {a!r}; axes are {AXES}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"grid: axes {axes} name an axis twice")
    return tuple(a for a in AXES if a in axes)


class ProcessGrid:
    """A 4-D grid (sample, channel, height, width) over the ranks of ``comm``.

    ``ProcessGrid(comm, sample=P_N, channel=P_c, height=P_H, width=P_W)``; the
    product must equal ``comm.size``.  Validation is local and identical on every
    rank, so a bad grid raises the same ValueError everywhere before any
    communication.
    """

    def __init__(self, comm=MPI.COMM_WORLD, *, sample=1, channel=1, height=1, width=1):
        shape = tuple(_check_size(n, v) for n, v in
                      zip(AXES, (sample, channel, height, width)))
        total = shape[0] * shape[1] * shape[2] * shape[3]
        if total != comm.Get_size():
            raise ValueError(
                f"grid: sample*channel*height*width = {total} but the communicator "
                f"has {comm.Get_size()} ranks; choose sizes whose product is {comm.Get_size()}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = total
        self.shape = shape
        self.P_N, self.P_c, self.P_H, self.P_W = shape
        self.coords = self.coords_of(self.rank)
        self._cache = {}

    # -- rank <-> coords -------------------------------------------------------
    def coords_of(self, rank):
        """(n, c, h, w) of ``rank``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"grid: rank must be in [0, {self.size}), got {rank}")
        coords = []
        for p in reversed(self.shape):
            coords.append(rank % p)
            rank //= p
        return tuple(reversed(coords))

    def rank_of(self, coords):
        """Rank of (n, c, h, w)."""
        coords = tuple(coords)
        if len(coords) != 4 or not all(0 <= x < p for x, p in zip(coords, self.shape)):
            raise ValueError(f"grid: coords must be 4 indices within {self.shape}, got {coords}")
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

        Ranked in row-major order of their coordinates on ``axes`` (taken in AXES
        order, so sub-rank order follows world-rank order).  Collective.
        """
        axes = _normalize_axes(axes)
        inside = [AXES.index(a) for a in axes]
        outside = [i for i in range(4) if i not in inside]
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
        return self.sub_comm(("sample", "height", "width"))

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
        n, c, h, w = self.coords
        g, (a, b) = c // q, divmod(c % q, p_cp)
        outside = _linear((n, h, w), (self.P_N, self.P_H, self.P_W)) * groups + g
        comm_f = self._split(("w_f", p_f, groups), outside * p_cp + b, a)
        comm_c = self._split(("w_c", p_f, groups), outside * p_f + a, b)
        return comm_f, comm_c

    def free(self):
        """Free every cached sub-communicator (never ``comm``).  Safe to call twice."""
        for sub in self._cache.values():
            if sub != MPI.COMM_NULL:
                sub.Free()
        self._cache.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()
        return False

    def __repr__(self):
        return (f"ProcessGrid(sample={self.P_N}, channel={self.P_c}, "
                f"height={self.P_H}, width={self.P_W}; rank {self.rank} at {self.coords})")


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
