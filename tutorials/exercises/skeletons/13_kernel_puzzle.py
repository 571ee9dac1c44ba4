"""Exercise 13: a kernel puzzle, a tiled convolution in Numba CUDA.  The problem: 13_kernel_puzzle.md.

Check it with ``python -m tutorials.exercises check 13`` (under Numba's CUDA simulator: no GPU needed).
Replace each ``todo(...)`` with your code.  Keep ``TILE`` and the names: the checker launches
``cuda.jit(conv_tile_kernel)[launch(Ho, Wo)](x, w, y)``.
"""

from numba import cuda, float32  # noqa: F401

from tutorials.exercises import todo

TILE = 8  # outputs per block along each axis: TILE x TILE threads
KMAX = 3  # the largest kernel: K <= KMAX


def conv_tile_kernel(x, w, y):
    """``y[i, j] = sum over a, b < K of x[i + a, j + b] * w[a, b]`` for ``x (H, W)``, ``w (K, K)``, ``y (H - K + 1,
    W - K + 1)``, all float32.  Thread ``(tx, ty)`` of block ``(bx, by)`` computes ``y[bx TILE + tx, by TILE + ty]``
    (when inside ``y``).  Budget per thread: 3 global loads, 2 K^2 shared loads."""
    todo("conv_tile_kernel")


def launch(Ho, Wo):
    """``(blocks, threads)``: the grid and block shapes that cover a ``Ho x Wo`` output."""
    todo("launch")
