"""Exercise 6: Stationary-Y, forward and backward.  The problem: 06_stationary_y.md.

Check it with ``python -m tutorials.exercises check 6``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from tutorials.exercises import kit, todo  # noqa: F401


def forward(comm, x_loc, w_loc, b_loc, layer):
    """Rank i of the channel group ``comm``: ``x_loc (n, C_i, H, W)``, ``w_loc = w[F_i, :] (F_i, C, Kh, Kw)``,
    ``b_loc = b[F_i]``.  Return ``y_loc = y[:, F_i] (n, F_i, H', W')``, bias included."""
    todo("forward")


def backward(comm, dy_loc, w_loc, layer):
    """``dy_loc = dy[:, F_i]``.  Return ``(dx_loc, dw_loc, db_loc)``: ``dx[:, C_i]``, ``dw[F_i, :]``, ``db[F_i]``."""
    todo("backward")
