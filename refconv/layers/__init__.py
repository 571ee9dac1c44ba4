"""The layers of a distributed CNN, grouped by kind; each runs on its own process grid.

==================  ======================================  =====================================
layer               forward                                 backward
==================  ======================================  =====================================
``DistConv2d``,     its algorithm's (refconv.algorithms)    its algorithm's, ending in the
``DistConv3d``                                              segmented allreduce of dw, db
``ReLU``            local                                   local
``BatchNorm2d``,    allreduce of statistics over the        allreduce of (sum dy, sum dy xhat)
``BatchNorm3d``     weight peers
``MaxPool2d``,      halo exchange, local pooling            local, then halo return
``AvgPool2d``,
``MaxPool3d``,
``AvgPool3d``
``GlobalAvgPool``,  allreduce of the spatial sums over      local
``GlobalAvgPool3d`` the spatial peers
``Linear``          allgather of the features over the      local; allreduce of dW, db over the
                    channel group                           sample axis
``Redistribute``    all-to-all (the "shuffle")              the reverse all-to-all
==================  ======================================  =====================================

Every one is a :class:`Layer` (the protocol is in :mod:`refconv.layers.base`);
:class:`SoftmaxCrossEntropy` and :class:`MeanSquaredError` are the losses.
"""

from refconv.layers.base import KINDS, Layer, layout
from refconv.layers.activation import ReLU
from refconv.layers.container import Residual, Sequential
from refconv.layers.conv import DistConv2d
from refconv.layers.conv3d import DistConv3d
from refconv.layers.linear import Linear
from refconv.layers.loss import LOSSES, MeanSquaredError, SoftmaxCrossEntropy
from refconv.layers.norm import BatchNorm2d, BatchNorm3d
from refconv.layers.pool import AvgPool2d, AvgPool3d, GlobalAvgPool, GlobalAvgPool3d, MaxPool2d, MaxPool3d
from refconv.layers.shuffle import Redistribute

__all__ = ["KINDS", "Layer", "layout", "ReLU", "DistConv2d", "DistConv3d", "Linear", "SoftmaxCrossEntropy",
           "MeanSquaredError", "LOSSES", "BatchNorm2d", "BatchNorm3d", "AvgPool2d", "AvgPool3d", "GlobalAvgPool",
           "GlobalAvgPool3d", "MaxPool2d", "MaxPool3d", "Redistribute", "Residual", "Sequential"]
