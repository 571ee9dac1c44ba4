"""Exercise 5: Stationary-X, forward and backward.  The problem: 05_stationary_x.md.

Check it with ``python -m tutorials.exercises check 5``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from tutorials.exercises import kit, todo  # noqa: F401


def forward(comm, x_loc, w_loc, b_loc, layer):
    """Rank i of the channel group ``comm``: ``x_loc (n, C_i, H, W)``, ``w_loc = w[:, C_i] (F, C_i, Kh, Kw)``,
    ``b_loc = b[F_i]``.  Return ``y_loc = y[:, F_i] (n, F_i, H', W')``, bias included.
    ``layer`` (:class:`tutorials.exercises.kit.Layer`) has the counts, the geometry and ``saved``."""
    todo("forward")


def backward(comm, dy_loc, w_loc, layer):
    """``dy_loc = dy[:, F_i]``.  Return ``(dx_loc, dw_loc, db_loc)``: ``dx[:, C_i]``, ``dw[:, C_i]``, ``db[F_i]``."""
    todo("backward")
