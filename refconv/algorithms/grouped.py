"""Grouped convolution on a channel split whose blocks hold whole groups (docs/grouped.md).

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

A layer whose groups are not a multiple of ``P_c`` (a group spanning ranks, or
blocks that would have to follow group boundaries unevenly) is refused by
:meth:`GroupedChannels.check` with a ValueError that says what to do instead.
"""

from refconv.algorithms.base import gradient_records, halo_records, local_blocks
from refconv.algorithms.spatial import SampleSpatial


class GroupedChannels(SampleSpatial):
    """Each rank convolves its own ``groups/P_c`` groups; ``P_c > 1``, ``groups % P_c == 0``."""

    name = "grouped"
    weight_layout = ("channel", None, None, None)  # w[F_i, :]: the filters of this rank's groups

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self._local["groups"] = geom.groups // grid.P_c  # the groups in this rank's channel block

    @staticmethod
    def check(P_c, groups):
        """Raise ValueError unless ``groups`` (> 1) splits into whole groups per rank of ``P_c``."""
        if groups % P_c:
            divisors = [d for d in range(1, groups + 1) if groups % d == 0]
            raise ValueError(
                f"groups: a grouped convolution on a channel split needs groups a multiple of channel, so that "
                f"every rank holds whole groups (got groups={groups}, channel={P_c}); use a grid with "
                f"channel in {divisors}, or channel=1 for this layer (a model file's per-layer "
                f"\"grid\": \"no-channel\")")

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """The calls of one forward and backward, in order, on the rank at ``coords``: no channel
        collective, only the halo of ``C_i`` channels and the segmented allreduce."""
        b = local_blocks(geom, grid_shape, coords)
        exchange, back = halo_records(geom, grid_shape, coords, b.C_i)
        return exchange + back + gradient_records(geom, grid_shape, coords, (b.F_i,) + geom.w_shape[1:])
