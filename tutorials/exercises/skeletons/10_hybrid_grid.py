"""Exercise 10: a hybrid grid, sample x channel x height.  The problem: 10_hybrid_grid.md.

Check it with ``python -m tutorials.exercises check 10``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from tutorials.exercises import kit, todo  # noqa: F401


def communicators(comm, grid):
    """``(channel_comm, spatial_comm, peers)`` of this rank on ``grid = (P_N, P_c, P_H)`` (ranks numbered
    row-major): the ranks that differ from it only in the channel coordinate, only in the height one,
    and in all but the channel one (its weight peers); each ordered by world rank."""
    todo("communicators")


def forward(comms, x_loc, w_loc, b_loc, layer):
    """Stationary-X on the grid: ``x_loc = x[N_n, C_c, H_h, :]``, ``w_loc = w[:, C_c]``, ``b_loc = b[F_c]``;
    return ``y_loc = y[N_n, F_c, H'_h, :]``.  ``comms``: what :func:`communicators` returned;
    ``layer``: a :class:`tutorials.exercises.kit.HybridLayer`."""
    todo("forward")


def backward(comms, dy_loc, w_loc, layer):
    """``dy_loc = dy[N_n, F_c, H'_h, :]``; return ``(dx[N_n, C_c, H_h, :], dw[:, C_c], db[F_c])``, the
    gradients of the weights summed over every sample and row."""
    todo("backward")
