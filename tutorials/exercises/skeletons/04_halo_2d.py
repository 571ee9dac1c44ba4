"""Exercise 4: a 2-D halo exchange with corners; the bonus, 3-D with edges and corners.  The problem:
04_halo_2d.md.

Check it with ``python -m tutorials.exercises check 4``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (collectives.exchange moves the pieces)
from tutorials.exercises import todo


def halo_exchange(comm, x_loc, layer):
    """``x_loc (n, c, h, w)``: the block of ``x (n, c, H, W)`` of this rank, at coordinates
    ``(i, j)`` of the ``layer.grid = (P_H, P_W)`` grid, rank ``i * P_W + j`` (row-major); rows and
    columns, in and out, split as ``numpy.array_split`` splits them.  Return ``x_win (n, c,
    h_win, w_win)``: the cells this rank's output block reads, zeros outside the image.
    ``layer`` (a :class:`tutorials.exercises.kit.HaloLayer`): ``layer.size = (H, W)``; ``layer.kernel``,
    ``.stride``, ``.padding``, ``.dilation`` are pairs."""
    todo("halo_exchange")


def halo_return(comm, dx_win, layer):
    """The adjoint: each cell of ``dx_win`` goes back to its owner and is added there; return ``dx_loc
    (n, c, h, w)``."""
    todo("halo_return")


def halo_exchange_3d(comm, x_loc, layer):
    """Bonus: the same for volumes, ``(n, c, d, h, w)`` blocks on a ``(P_D, P_H, P_W)`` grid."""
    todo("halo_exchange_3d")


def halo_return_3d(comm, dx_win, layer):
    """Bonus: the adjoint of :func:`halo_exchange_3d`."""
    todo("halo_return_3d")
