"""Exercise 3: a 1-D halo exchange with uneven shards.  The problem: 03_halo_1d.md.

Check it with ``python -m tutorials.exercises check 3``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (collectives.exchange moves the pieces)
from tutorials.exercises import todo


def halo_exchange(comm, x_loc, layer):
    """``x_loc (n, c, h_r)``: rank r's block of the rows of ``x (n, c, H)``, ``H = layer.size[0]``
    split over ``comm.size`` ranks as ``numpy.array_split`` splits it; the output rows likewise.
    Return ``x_win (n, c, hi - lo)``: the rows ``[lo, hi)`` that rank r's output rows read, with
    zeros where they fall outside ``[0, H)``.  ``layer`` (a :class:`tutorials.exercises.kit.HaloLayer`):
    ``layer.kernel``, ``.stride``, ``.padding``, ``.dilation`` are 1-tuples."""
    todo("halo_exchange")


def halo_return(comm, dx_win, layer):
    """The adjoint: ``dx_win (n, c, hi - lo)`` is a gradient over rank r's window.  Return
    ``dx_loc (n, c, h_r)``: for each of rank r's rows, the sum of every rank's ``dx_win`` there."""
    todo("halo_return")
