"""Batch normalization on a process grid (docs/algorithms.md section 5).

forward: allreduce of the per-channel sum, then of the centred sum of squares,
over the weight peers (the sample and spatial peers sharing channels) ·
backward: allreduce of (sum dy, sum dy * xhat) over the weight peers.

With channels split, each rank owns the statistics, ``gamma`` and ``beta`` of its
channels ``C_i`` (viewed as ``(C, 1, 1, 1)`` split over the channel axis).

``BatchNorm3d`` is the same layer on volumes ``(N, C, D, H, W)``: the statistics of a
channel run over every non-channel axis, so its weight peers add the depth ranks.
"""

import math

import numpy

from refconv import checks, collectives
from refconv.distribution import Distribution
from refconv.layers.base import Layer
from refconv.pricing.records import batch_norm_records


class BatchNorm2d(Layer):
    """Training-mode batch norm with PyTorch's semantics (``eps=1e-5``, ``momentum=0.1``,
    biased variance to normalise, unbiased for the running variance).

    ``layer.training = False`` normalises with the running statistics instead.
    The batch statistics are computed in two passes (mean, then the centred sum of
    squares), which loses no precision to cancellation, at the cost of a second
    allreduce of ``C_i`` values.
    """

    def __init__(self, num_features, *, grid, eps=1e-5, momentum=0.1, backend="auto", dtype=numpy.float32):
        super().__init__(grid=grid, backend=backend, dtype=dtype)
        self.num_features = C = checks.positive_int(num_features, "num_features")
        if C < grid.P_c:
            raise ValueError(f"num_features={C} cannot be split over channel={grid.P_c} ranks")
        self.eps, self.momentum = float(eps), float(momentum)
        (c0, c1), = self._channel_dist.pieces(grid.rank, 0)
        C_i = c1 - c0
        self.weight = self.backend.asarray(numpy.ones(C_i, self.dtype))  # gamma[C_i]
        self.bias = self.backend.asarray(numpy.zeros(C_i, self.dtype))  # beta[C_i]
        self.running_mean = self.backend.asarray(numpy.zeros(C_i, self.dtype))
        self.running_var = self.backend.asarray(numpy.ones(C_i, self.dtype))
        self.weight_grad = self.bias_grad = None

    @property
    def _channel_dist(self):
        return Distribution(self.grid, (self.num_features, 1, 1, 1), ("channel", None, None, None),
                            names=("C", "-", "-", "-"))

    def _bind(self, shape):
        if shape[1] != self.num_features:
            raise ValueError(f"input_shape: {self!r} expects C = {self.num_features}, got {shape}")
        return shape

    @property
    def _count(self):
        """``M``, the elements of a channel over the global batch: ``N H W`` (``N D H W``)."""
        return self._input_shape[0] * math.prod(self._input_shape[2:])

    def forward(self, x_loc):
        # x_loc: (n, C_i, h, w), or (n, C_i, d, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        M = self._count  # elements per channel over the global batch
        if self.training:
            peers = self.grid.weight_peers_comm
            s = self.backend.batch_norm_sum(x_loc)
            mean = collectives.allreduce(peers, s) / M  # (C_i,)
            sq = self.backend.batch_norm_centered_sum_squares(x_loc, mean)
            var = collectives.allreduce(peers, sq) / M  # (C_i,) biased
            m = self.momentum
            self.running_mean *= 1 - m
            self.running_mean += m * mean
            self.running_var *= 1 - m
            self.running_var += m * var * (M / max(M - 1, 1))
        else:
            mean, var = self.running_mean, self.running_var
        invstd = 1.0 / self.xp.sqrt(var + self.eps)
        self._saved = (x_loc, mean.astype(self.dtype, copy=False), invstd.astype(self.dtype, copy=False))
        return self.backend.batch_norm_apply(x_loc, self._saved[1], self._saved[2], self.weight, self.bias)

    def backward(self, dy_loc):
        # dy_loc: (n, C_i, h, w), or (n, C_i, d, h, w)
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        x_loc, mean, invstd = self._saved
        sdy, sdyx = self.backend.batch_norm_grad_sums(dy_loc, x_loc, mean, invstd)
        C_i = sdy.shape[0]
        sums = collectives.allreduce(self.grid.weight_peers_comm, self.xp.concatenate([sdy, sdyx]))
        self.bias_grad, self.weight_grad = sums[:C_i], sums[C_i:]  # dbeta, dgamma over the global batch
        return self.backend.batch_norm_backward_apply(dy_loc, x_loc, mean, invstd, self.weight,
                                                      self.bias_grad, self.weight_grad, self._count)

    def records(self):
        """The calls one training forward and backward of this bound layer make on this rank."""
        self._require_bound()
        return batch_norm_records(self._input_shape, self.grid.shape, self.grid.coords, self.dtype.itemsize)

    def parameters(self):
        return {"weight": self.weight, "bias": self.bias}

    def gradients(self):
        return {"weight": self.weight_grad, "bias": self.bias_grad}

    def parameter_distributions(self):
        return {"weight": self._channel_dist, "bias": self._channel_dist}

    def buffers(self):
        return {"running_mean": self.running_mean, "running_var": self.running_var}

    def buffer_distributions(self):
        return {"running_mean": self._channel_dist, "running_var": self._channel_dist}

    def __repr__(self):
        return f"{type(self).__name__}({self.num_features}, grid={self.grid.shape})"


class BatchNorm3d(BatchNorm2d):
    """Batch norm of volumes ``(N, C, D, H, W)``, with :class:`BatchNorm2d`'s semantics; the
    statistics of each channel run over ``(N, D, H, W)`` (PyTorch's ``BatchNorm3d``)."""

    ndim = 5
