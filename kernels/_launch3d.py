"""Index helpers of the 3-D convolution kernels: a flat index into five coordinates.

The rest of the launch geometry and index arithmetic (tile constants, ``gemm_grid``,
``input_pixel``, ``output_pixel``, ``multiply_stage``) is ``_launch.py``'s,
shared with the 2-D kernels; the 3-D kernels apply ``input_pixel`` and ``output_pixel``
once per spatial dim.
"""

from numba import cuda


@cuda.jit(device=True)
def split5(index, d1, d2, d3, d4):
    """``index`` -> ``(a, b, c, d, e)`` in a ``(*, d1, d2, d3, d4)`` C-ordered array."""
    rest, e = index // d4, index % d4
    rest, d = rest // d3, rest % d3
    rest, c = rest // d2, rest % d2
    return rest // d1, rest % d1, c, d, e
