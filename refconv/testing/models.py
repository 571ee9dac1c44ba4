"""The smallest model a checkpoint or optimizer test needs.

:class:`TwoConvs` is two :class:`refconv.DistConv2d` layers with the model protocol
that :class:`refconv.optim.SGD` and :mod:`refconv.checkpoint` take
(``named_parameters()``, ``named_buffers()``); it does not compute a loss.
"""

import numpy

from refconv.layers import DistConv2d


class TwoConvs:
    """``conv1`` (4 -> 6 channels, 3x3) and ``conv2`` (6 -> ``out2``, 1x1), float64, numpy backend."""

    def __init__(self, grid, *, algorithm="stationary-x", filter_groups=None, seed=0, out2=4):
        kw = dict(grid=grid, algorithm=algorithm, filter_groups=filter_groups, dtype=numpy.float64,
                  backend="numpy")
        self.layers = {"conv1": DistConv2d(4, 6, 3, seed=seed, **kw),
                       "conv2": DistConv2d(6, out2, 1, seed=seed + 1, **kw)}

    def named_parameters(self):
        for lname, layer in self.layers.items():
            for pname in layer.parameters():
                yield f"{lname}.{pname}", layer, pname

    def named_buffers(self):
        return []  # convolutions have no buffers
