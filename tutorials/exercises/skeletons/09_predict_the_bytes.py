"""Exercise 9: predict the bytes.  The problem: 09_predict_the_bytes.md.

Check it with ``python -m tutorials.exercises check 9``.  Replace each ``todo(...)`` with your code.
"""

from tutorials.exercises import todo


def predict(algorithm, problem, grid_shape, coords, p_f=None):
    """Every call one forward and backward of ``DistConv2d(..., algorithm=algorithm)`` makes on the rank at
    ``coords = (n, c, 0, 0)`` of the grid ``grid_shape = (P_N, P_c, 1, 1)``, in order: a list of
    ``(kind, communicator size, bytes)`` as ``refconv.collectives.stats`` records them.  ``problem`` has
    ``N, C, F, H, W, Kh, Kw``, ``out_hw = (H', W')`` and float64 arrays (8 bytes an element); the layer
    has a bias.  ``p_f``: Stationary-W's factor of the channel group."""
    todo("predict")
