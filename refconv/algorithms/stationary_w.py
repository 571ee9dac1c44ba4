"""Stationary-W: the weights stay, both activations move (docs/algorithms.md section 4).

The channel group is factored ``P_c = p_f * p_c'``; channel coordinate
``i = a * p_c' + b``.  ``F_a`` is the union of the F blocks of ranks
``(a, 0..p_c'-1)`` (contiguous) and ``C_b`` the union of the C blocks of ranks
``(0..p_f-1, b)`` (blocks ``b, p_c'+b, ...``: not contiguous unless ``p_f = 1``).

=========  =========================================  ===========================================
tensor     on rank (a, b)                             moved by
=========  =========================================  ===========================================
x, dx      ``x[:, C_i]``  (n, C_i, h, w)              forward: allgather over the p_f ranks (., b),
                                                      then halo exchange
                                                      backward: halo return, then reduce-scatter
                                                      over (., b)
w, dw      ``w[F_a, C_b]``  (F_a, C_b, Kh, Kw)        backward: allreduce of dw over the weight peers
y, dy      ``y[:, F_i]``  (n, F_i, h', w')            forward: reduce-scatter over the p_c' ranks (a, .)
                                                      backward: allgather over (a, .)
b, db      ``b[F_i]``                                 backward: allreduce of db over the weight peers
=========  =========================================  ===========================================

``p_f = 1`` is Stationary-X and ``p_c' = 1`` is Stationary-Y.  The order of the
gathered ``x`` pieces (by ``a``) is the order of ``C_b`` in the weight, so the
non-contiguous block needs no reordering.

So the code is Stationary-X with one collective before it and one after: the
class extends :class:`.StationaryX`, whose channel group is here the ``p_c'``
ranks ``(a, .)``.  ``forward`` allgathers ``x`` over ``(., b)`` and hands
``x[:, C_b]`` to X's forward (halo exchange, local conv, reduce-scatter of the
partial ``y``).  ``backward`` is X's (allgather of ``dy``, local backward, halo
return, segmented allreduce of ``dw`` and ``db``) with the reduce-scatter of the
partial ``dx`` over ``(., b)`` after the halo return, as Stationary-Y's: so
backward-filter, which needs neither, runs behind it.

A grouped layer whose groups span ranks (``groups`` dividing ``P_c``: docs/grouped.md)
runs W within each group: ``P_c = groups x p_f x p_c'``, coordinate
``i = g q + a p_c' + b`` with ``q = P_c/groups``, every collective among the ranks
of group ``g``, and ``C_b`` counted within the group's ``C/groups`` weight columns.
For an ungrouped layer ``groups = 1`` and ``g = 0``.
"""

from refconv import checks, collectives
from refconv.algorithms.base import Call, gradient_records, halo_records, local_blocks, segmented_allreduce
from refconv.algorithms.stationary_x import StationaryX
from refconv.distribution import Split, block_sizes


def _groups(geom, P_c, p_f, c):
    """``(c_counts, f_counts)`` of channel coordinate ``c = g q + a p_c' + b``: the |C_i| of
    ranks (g, ., b), gathered into ``C_b``, and the |F_i| of ranks (g, a, .), gathered into ``F_a``."""
    q = P_c // geom.groups
    p_cp, first = q // p_f, c - c % q  # first: the group's first coordinate, g q
    a, b = divmod(c % q, p_cp)
    c_counts, f_counts = block_sizes(geom.C, P_c), block_sizes(geom.F, P_c)
    return ([c_counts[first + k * p_cp + b] for k in range(p_f)],
            [f_counts[first + a * p_cp + j] for j in range(p_cp)])


class StationaryW(StationaryX):
    name = "stationary-w"
    filter_behind_next = True  # behind the reduce-scatter of dx

    def __init__(self, grid, geom, backend, filter_groups):
        super().__init__(grid, geom, backend, filter_groups)  # X's state, over the p_c' ranks (g, a, .)
        self.gather_comm = grid.stationary_w_comms(filter_groups, geom.groups)[0]  # the p_f ranks (g, ., b)
        self._local["groups"] = 1  # within a group: this rank's channels all belong to group g

    @staticmethod
    def channel_group(grid, geom, filter_groups):
        """X's channel group here: the ``p_c'`` ranks ``(g, a, .)``, which sum the partial ``y``,
        with ``f_counts`` their ``|F_i|`` (the blocks of ``F_a``).  ``c_counts`` are the ``|C_i|``
        of the ``p_f`` ranks ``(g, ., b)`` of ``gather_comm``, whose allgather makes ``C_b``."""
        comm_c = grid.stationary_w_comms(filter_groups, geom.groups)[1]
        c_counts, f_counts = _groups(geom, grid.P_c, filter_groups, grid.coords[1])
        return comm_c, c_counts, f_counts

    @staticmethod
    def resolve_filter_groups(P_c, filter_groups, groups=1):
        """``p_f``: a divisor of ``q = P_c/groups``; by default the divisor nearest ``sqrt(q)``
        from below, which makes both collectives about ``1/sqrt(q)`` of the activations."""
        q = P_c // groups
        divisors = checks.divisors(q)
        if filter_groups is None:
            return max(d for d in divisors if d * d <= q)
        if isinstance(filter_groups, bool) or filter_groups not in divisors:
            within = f"grid.P_c={P_c}" if groups == 1 else f"grid.P_c/groups={q} (groups={groups} span the ranks)"
            raise ValueError(f"filter_groups: expected a divisor of {within} (one of {divisors}), "
                             f"got {filter_groups!r}")
        return int(filter_groups)

    @staticmethod
    def weight_dims(P_c, filter_groups=None, groups=1):
        """``w[F_a, C_b]``: F in blocks ``g q + a p_c' ..`` (p_c' of them), C in blocks ``b, p_c'+b, ...``
        of ``q`` (of the group's ``C/groups`` columns when ``groups > 1``)."""
        return (Split.stationary_w_filters(P_c, filter_groups, groups),
                Split.stationary_w_channels(P_c, filter_groups, groups), None, None)

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups):
        """This rank's calls, in order: the allgather of x over (., b), the halo exchange, the
        reduce-scatter of y over (a, .); the allgather of dy over (a, .), the halo return, the
        reduce-scatter of dx over (., b), then the segmented allreduce."""
        b, P_c = local_blocks(geom, grid_shape, coords), grid_shape[1]
        c_counts, f_counts = _groups(geom, P_c, filter_groups, coords[1])
        C_b, F_a = sum(c_counts), sum(f_counts)
        exchange, back = halo_records(geom, grid_shape, coords, C_b)
        x_b = b.n * C_b * b.cells * geom.itemsize  # the gathered x, and the partial dx
        y_a = b.n * F_a * b.out_cells * geom.itemsize  # the partial y, and the gathered dy
        return ([Call("allgather", len(c_counts), x_b)] + exchange + [Call("reduce_scatter", len(f_counts), y_a)]
                + [Call("allgather", len(f_counts), y_a)] + back + [Call("reduce_scatter", len(c_counts), x_b)]
                + gradient_records(geom, grid_shape, coords, (F_a, C_b) + geom.kernel))

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_a, C_b, Kh, Kw); b_loc: (F_i,) or None
        x_b = collectives.allgather(self.gather_comm, x_loc, self.c_counts, axis=1)  # (n, C_b, h, w)
        # Stationary-X over (a, .) on x_b: halo exchange, local conv -> (n, F_a, h', w') partial
        # over C_b, reduce-scatter -> y_loc (n, F_i, h', w'), plus the bias
        return super().forward(x_b, w_loc, b_loc)

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        dy_a = collectives.allgather(self.channel_comm, dy_loc, self.f_counts, axis=1)  # over (a, .): (n, F_a, h', w')
        # dx_win: (n, C_b, h_win, w_win), partial over F_a; dw_loc: (F_a, C_b, Kh, Kw) partial over n, h', w'
        # halo return of dx_win -> dx_part (n, C_b, h, w), then its reduce-scatter over (., b) -> dx_loc
        # (n, C_i, h, w), with backward-filter behind the reduce-scatter
        def reduce_scatter(dx_part, overlap):
            return collectives.ireduce_scatter(self.gather_comm, dx_part, self.c_counts, axis=1, overlap=overlap)
        dx_loc, dw_loc = self.backward_behind_halo(dy_a, w_loc, then=reduce_scatter)
        # over the weight peers: summed, or with self.overlap, started (DistConv2d waits for them)
        dw_loc, db_loc = segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc), self.overlap,
                                             self.bucketed)
        return dx_loc, dw_loc, db_loc
