"""Exercise 8: the segmented allreduce.  The problem: 08_segmented_allreduce.md.

Check it with ``python -m tutorials.exercises check 8``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (collectives.split, collectives.allreduce)
from tutorials.exercises import todo


def weight_peers(comm, grid_shape):
    """The communicator of this rank's weight peers: the ranks of ``comm`` with its channel coordinate, on
    the grid ``grid_shape = (P_N, P_c, P_H, P_W)`` whose ranks are numbered row-major (the last axis
    fastest), ordered as in ``comm``.  Every rank calls it."""
    todo("weight_peers")


def finish_gradients(peers, dw_loc, db_loc):
    """``(dw, db)``: this rank's partial ``dw`` shard and ``db`` block summed over ``peers``."""
    todo("finish_gradients")
