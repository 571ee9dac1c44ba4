"""Grouped convolution on a channel split (docs/grouped.md): whole groups per rank, or a group
on several ranks.

=========  =======================================  ====================================
tensor     on channel-group rank i                  moved by
=========  =======================================  ====================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)            forward: halo exchange · backward: halo return
w, dw      ``w[F_i, :]``  (F_i, C/groups, Kh, Kw)   backward: allreduce of dw over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')          none
b, db      ``b[F_i]``                               backward: allreduce of db over the weight peers
=========  =======================================  ====================================

With ``groups`` a multiple of ``P_c``, the standard blocks ``C_i`` of ``C`` and
``F_i`` of ``F`` (``numpy.array_split``, here even: ``C/P_c`` and ``F/P_c``) are
the input and output channels of the same ``groups/P_c`` whole groups, and the
weight rows ``w[F_i]`` are exactly those groups' filters.  A group's output
reads only its own input channels, so every rank convolves its own groups and
**no channel collective is needed**: forward and backward are those of
:mod:`.spatial` (halo exchange, local convolution, halo return, segmented
allreduce), on ``groups/P_c`` groups.  The segmented allreduce moves this rank's
``F/P_c x C/groups x Kh x Kw`` shard.

**A group spanning ranks** (``groups < P_c``, with ``P_c`` a multiple of
``groups`` and ``C``, ``F`` multiples of ``P_c``, so that every group's channels
are ``q = P_c/groups`` whole blocks): each group is a dense ``C/groups ->
F/groups`` convolution on its own ``q`` ranks, the ranks ``(g, .)`` of
Stationary-W's factorisation ``P_c = groups x q`` (rank ``i = g q + j``).
:class:`GroupSpanX` runs Stationary-X there and :class:`GroupSpanY`
Stationary-Y (``"stationary-x"``/``"stationary-y"`` asked for), their collectives
on those ``q`` ranks moving only the group's channels:

=========  ==========================================  ==========================================
tensor     rank (g, j), grouped-x                      grouped-y
=========  ==========================================  ==========================================
x, dx      ``x[:, C_i]``                               ``x[:, C_i]``; allgather over (g, .) ->
                                                       the group's ``C/groups`` channels
w, dw      ``w[F_g, C_i - g C/groups]`` (the group's   ``w[F_i, :]`` (F_i x C/groups)
           filters, this rank's channels of it)
y, dy      reduce-scatter over (g, .) of the partial   ``y[:, F_i]``, local
           ``y[:, F_g]`` -> ``y[:, F_i]``
=========  ==========================================  ==========================================

``"stationary-w"`` asked for runs :class:`.StationaryW` itself, which factors the
group's ``q`` ranks once more (``q = p_f x p_c'``; see its module).

:func:`grouped_class` picks the class for a layer, or raises a ValueError that says
what to do instead (uneven blocks that would have to follow group boundaries are
not done).
"""

from refconv import checks
from refconv.algorithms.base import Call, gradient_records, halo_records, local_blocks
from refconv.algorithms.spatial import SampleSpatial
from refconv.algorithms.stationary_w import StationaryW
from refconv.algorithms.stationary_x import StationaryX
from refconv.algorithms.stationary_y import StationaryY


class GroupedChannels(SampleSpatial):
    """Each rank convolves its own ``groups/P_c`` groups; ``P_c > 1``, ``groups % P_c == 0``."""

    name = "grouped"
    asked_as = "stationary-x"  # any channel algorithm asked for runs it
    weight_layout = ("channel", None, None, None)  # w[F_i, :]: the filters of this rank's groups

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self._local["groups"] = geom.groups // grid.P_c  # the groups in this rank's channel block

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """The calls of one forward and backward, in order, on the rank at ``coords``: no channel
        collective, only the halo of ``C_i`` channels and the segmented allreduce."""
        b = local_blocks(geom, grid_shape, coords)
        exchange, back = halo_records(geom, grid_shape, coords, b.C_i)
        return exchange + back + gradient_records(geom, grid_shape, coords, (b.F_i,) + geom.w_shape[1:])


def _group_of(grid, geom, filter_groups=None):
    """``(comm, c_counts, f_counts)`` of this rank's group: its ``q = P_c/groups`` ranks
    ``(g, .)`` ordered by ``j``, each holding ``C/P_c`` of its channels and ``F/P_c`` of its
    filters.  The channel collectives of X and Y run there."""
    q = grid.P_c // geom.groups
    group_ranks = grid.stationary_w_comms(1, geom.groups)[1]  # W's (g, a, .) with p_f = 1: all q ranks of g
    return group_ranks, [geom.C // grid.P_c] * q, [geom.F // grid.P_c] * q


class GroupSpanX(StationaryX):
    """Stationary-X within each group's ``q`` ranks."""

    name = "grouped-x"
    asked_as = "stationary-x"

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self._local["groups"] = 1  # this rank's channels all belong to one group

    channel_group = staticmethod(_group_of)  # the channel collectives run over the group's q ranks

    @staticmethod
    def weight_dims(P_c, filter_groups=None, groups=1):
        """``w[F_g, block j of C/groups]``: Stationary-W's layout within the group with ``p_f = 1``."""
        return StationaryW.weight_dims(P_c, 1, groups)

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        b, q, Fg = local_blocks(geom, grid_shape, coords), grid_shape[1] // geom.groups, geom.F // geom.groups
        exchange, back = halo_records(geom, grid_shape, coords, b.C_i)
        y_group = b.n * Fg * b.out_cells * geom.itemsize  # the partial y of the group, and the gathered dy
        return (exchange + [Call("reduce_scatter", q, y_group), Call("allgather", q, y_group)] + back
                + gradient_records(geom, grid_shape, coords, (Fg, b.C_i) + geom.kernel))


class GroupSpanY(StationaryY):
    """Stationary-Y within each group's ``q`` ranks."""

    name = "grouped-y"
    asked_as = "stationary-y"
    weight_layout = ("channel", None, None, None)  # w[F_i, :], all of the group's C/groups channels

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self._local["groups"] = 1

    channel_group = staticmethod(_group_of)  # the channel collectives run over the group's q ranks

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        b, q, Cg = local_blocks(geom, grid_shape, coords), grid_shape[1] // geom.groups, geom.C // geom.groups
        exchange, back = halo_records(geom, grid_shape, coords, Cg)
        x_group = b.n * Cg * b.cells * geom.itemsize  # the gathered x of the group, and the partial dx
        return ([Call("allgather", q, x_group)] + exchange + back + [Call("reduce_scatter", q, x_group)]
                + gradient_records(geom, grid_shape, coords, (b.F_i, Cg) + geom.kernel))


SPANNING = {"stationary-x": GroupSpanX, "stationary-y": GroupSpanY, "stationary-w": StationaryW}  # asked for -> runs


def grouped_class(name, P_c, groups, channels, filter_groups=None):
    """``(cls, filter_groups)`` that runs a grouped layer (``groups > 1``, ``channels = (C, F)``)
    on a channel group of ``P_c > 1`` ranks when algorithm ``name`` was asked for (with
    ``filter_groups``, Stationary-W's ``p_f`` within a group); a ValueError that says what
    would work where nothing does."""
    if groups % P_c == 0:
        return GroupedChannels, None
    C, F = channels
    if P_c % groups or C % P_c or F % P_c:
        whole = checks.divisors(groups)
        raise ValueError(
            f"groups: a grouped convolution on a channel split needs every rank to hold whole groups "
            f"(groups a multiple of channel) or every group to hold whole ranks (channel a multiple of groups, "
            f"in_channels and out_channels multiples of channel); got groups={groups}, channel={P_c}, "
            f"in_channels={C}, out_channels={F}; use a grid with channel in {whole}, or channel=1 for this "
            f"layer (a model file's per-layer \"grid\": \"no-channel\")")
    if name not in SPANNING:
        raise ValueError(f"algorithm: each group spans {P_c // groups} ranks here (groups={groups}, channel={P_c}) "
                         f"and {name!r} does not run within a group; use one of {tuple(SPANNING)} or 'auto'")
    cls = SPANNING[name]
    return cls, cls.resolve_filter_groups(P_c, filter_groups, groups)  # W's p_f divides P_c/groups; X, Y: None


def grouped_classes(P_c, groups, channels):
    """The ``(cls, filter_groups)`` pairs that can run the layer (what ``"auto"`` prices): X and Y
    within each group, and W for every ``p_f`` strictly between 1 and ``q = P_c/groups``."""
    if groups % P_c == 0:
        return [(GroupedChannels, None)]
    grouped_class("stationary-x", P_c, groups, channels)  # raises where no group holds whole ranks
    q = P_c // groups
    return ([(GroupSpanX, None), (GroupSpanY, None)]
            + [(StationaryW, p_f) for p_f in range(2, q) if q % p_f == 0])
