"""Exercise 2: sample parallelism's backward.  The problem: 02_sample_backward.md.

Check it with ``python -m tutorials.exercises check 2``.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from tutorials.exercises import kit, todo  # noqa: F401


def backward_data(comm, dy_loc, w, x_loc_shape, stride, padding, dilation):
    """``dx_loc`` (``x_loc_shape``, this rank's samples) from ``dy_loc (n_i, F, H', W')`` and the
    replicated ``w (F, C, Kh, Kw)``."""
    todo("backward_data")


def backward_filter(comm, x_loc, dy_loc, w_shape, stride, padding, dilation):
    """``(dw, db)`` of the whole batch, the same on every rank, from this rank's ``x_loc (n_i, C, H, W)``
    and ``dy_loc``."""
    todo("backward_filter")
