"""Exercise 1: output and halo arithmetic.  The problem: 01_halo_arithmetic.md.

Check it with ``python -m tutorials.exercises check 1``.  Replace each ``todo(...)`` with your code.
"""

from tutorials.exercises import todo


def output_length(H, K, s, p, d):
    """The number of output rows of a convolution of ``H`` input rows with a kernel of ``K`` rows,
    stride ``s``, padding ``p`` on both sides and dilation ``d``."""
    todo("output_length")


def output_block(Ho, P, r):
    """``(o0, o1)``: the output rows rank ``r`` of ``P`` owns when ``Ho`` rows are split as
    ``numpy.array_split`` splits them (the first ``Ho % P`` blocks one row longer)."""
    todo("output_block")


def rows_needed(H, P, r, K, s, p, d):
    """``{q: (lo, hi)}``: for every other rank ``q`` whose input rows rank ``r``'s output rows read,
    the global rows ``[lo, hi)`` of q's block that rank ``r`` needs from it.  Both the input rows
    ``H`` and the output rows are split over the ``P`` ranks as in :func:`output_block`.
    Padding rows are nobody's; leave out the ranks ``r`` needs nothing from."""
    todo("rows_needed")
