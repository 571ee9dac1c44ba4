"""Exercise 7: Stationary-W, forward and backward.  The problem: 07_stationary_w.md.

Check it with ``python -m tutorials.exercises check 7``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from tutorials.exercises import kit, todo  # noqa: F401


def groups(comm, layer):
    """``(gather_comm, reduce_comm)``: with ``p_c' = comm.size // layer.p_f`` and rank ``i = a p_c' + b``,
    the ``p_f`` ranks ``(., b)`` (ordered by ``a``) and the ``p_c'`` ranks ``(a, .)`` (ordered by ``b``)."""
    todo("groups")


def forward(comm, x_loc, w_loc, b_loc, layer):
    """Rank ``i = (a, b)``: ``x_loc (n, C_i, H, W)``, ``w_loc = w[F_a, C_b]``, ``b_loc = b[F_i]``, where
    ``F_a`` is the F blocks of ranks ``(a, 0..p_c'-1)`` and ``C_b`` the C blocks of ranks
    ``(0..p_f-1, b)``, in that order.  Return ``y_loc = y[:, F_i]``, bias included."""
    todo("forward")


def backward(comm, dy_loc, w_loc, layer):
    """``dy_loc = dy[:, F_i]``.  Return ``(dx_loc, dw_loc, db_loc)``: ``dx[:, C_i]``, ``dw[F_a, C_b]``, ``db[F_i]``."""
    todo("backward")
