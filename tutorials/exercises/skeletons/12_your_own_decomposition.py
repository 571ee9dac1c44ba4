"""Exercise 12: your own decomposition, a SUMMA-style broadcast variant of Stationary-Y.  The problem:
12_your_own_decomposition.md.

Check it with ``python -m tutorials.exercises check 12``: it registers ``SummaY`` as the algorithm
"summa-y" and runs ``DistConv2d(..., algorithm="summa-y")`` through ``check_layer`` and
``check_records`` on 2 to 5 simulated ranks.  Replace each ``todo(...)`` with your code.
"""

from refconv import collectives  # noqa: F401  (what your answer may call)
from refconv.algorithms.base import (Call, ChannelAlgorithm, gradient_records, halo_records,  # noqa: F401
                                    local_blocks, segmented_allreduce)
from tutorials.exercises import todo


class SummaY(ChannelAlgorithm):
    name = "summa-y"
    weight_layout = ("channel", None, None, None)  # w[F_i, :], as Stationary-Y

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        """Every call one forward and backward make on the rank at ``coords``, in order."""
        todo("records")

    def forward(self, x_loc, w_loc, b_loc):
        """``x_loc (n, C_i, h, w)``, ``w_loc (F_i, C, Kh, Kw)``, ``b_loc (F_i,)`` -> ``y_loc (n, F_i, h', w')``."""
        todo("forward")

    def backward(self, dy_loc, w_loc):
        """``dy_loc (n, F_i, h', w')`` -> ``(dx_loc, dw_loc, db_loc)``, the weights' gradients summed over
        the weight peers."""
        todo("backward")
