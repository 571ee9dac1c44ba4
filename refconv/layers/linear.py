"""The classifier head."""

import math

import numpy

from refconv import checks, collectives
from refconv.distribution import Distribution, block_range, block_sizes
from refconv.layers.base import GradientsInFlight, Layer
from refconv.pricing.records import linear_records


class Linear(GradientsInFlight, Layer):
    """The classifier head ``y = x W^T + b`` with ``W`` replicated on every rank.

    forward: allgather of the features ``(n, C_i)`` over the channel group ·
    backward: ``dx`` local (slice of ``dy W``); allreduce of ``dW``, ``db`` over the sample axis

    Why only the sample axis: after the allgather every channel peer holds the same
    ``(n, C)`` features, and after global average pooling every spatial peer does
    too, so they all compute the same ``dW = dy^T x`` for the same samples.  Only
    ranks with different samples hold different partial sums.
    """

    kind_in, kind_out = "features", "logits"

    def __init__(self, in_features, out_features, *, grid, bias=True, backend="auto", dtype=numpy.float32, seed=0):
        super().__init__(grid=grid, backend=backend, dtype=dtype)
        self.in_features = checks.positive_int(in_features, "in_features")
        self.out_features = checks.positive_int(out_features, "out_features")
        if self.in_features < grid.P_c:
            raise ValueError(f"in_features={in_features} cannot be split over channel={grid.P_c} ranks")
        self.has_bias = bool(bias)
        if self.backend.values:
            rng = numpy.random.default_rng(seed)  # PyTorch's default init, the same draw on every rank
            bound = 1.0 / math.sqrt(self.in_features)
            w = rng.uniform(-bound, bound, (self.out_features, self.in_features)).astype(self.dtype)
            b = rng.uniform(-bound, bound, self.out_features).astype(self.dtype) if bias else None
            self.set_global_parameters(w, b)
        else:                                 # shapes-only: arrays of the parameters' shapes, no draw
            self.weight = self.backend.zeros((self.out_features, self.in_features), self.dtype)
            self.bias = self.backend.zeros((self.out_features,), self.dtype) if self.has_bias else None
        self.weight_grad = self.bias_grad = None

    def set_global_parameters(self, w, b=None):
        self.weight = self.backend.asarray(numpy.array(w, dtype=self.dtype))
        self.bias = self.backend.asarray(numpy.array(b, dtype=self.dtype)) if self.has_bias else None

    def _bind(self, shape):
        if shape[1:] != (self.in_features, 1, 1):
            raise ValueError(f"input_shape: {self!r} expects features (N, {self.in_features}, 1, 1), got {shape}")
        return (shape[0], self.out_features, 1, 1)

    def forward(self, x_loc):
        # x_loc: (n, C_i, 1, 1)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        n = x_loc.shape[0]
        P_c = self.grid.P_c
        counts = block_sizes(self.in_features, P_c)
        self._x = collectives.allgather(self.grid.channel_comm, x_loc.reshape(n, -1), counts, axis=1)  # (n, C)
        y = self._x @ self.weight.T  # (n, K), the same on every channel and spatial peer
        return y + self.bias if self.has_bias else y

    def backward(self, dy_loc):
        # dy_loc: (n, K)
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        sample_comm = self.grid.axis_comm("sample")
        overlap = self.gradient_overlap  # None: wait at once; else leave them in flight until read
        dw, db = dy_loc.T @ self._x, dy_loc.sum(axis=0) if self.has_bias else None  # (K, C), (K,): partial sums
        start = self.bucketed()  # the model's buckets (they wait, or not, as the overlap says)
        if start is not None:
            self.weight_grad, self.bias_grad = start(0, dw), None if db is None else start(1, db)
        else:
            dw = collectives.iallreduce_(sample_comm, dw, overlap=overlap or "")
            db = None if db is None else collectives.iallreduce_(sample_comm, db, overlap=overlap or "")
            self.weight_grad = dw if overlap else dw.wait()
            self.bias_grad = db if overlap or db is None else db.wait()
        c0, c1 = block_range(self.in_features, self.grid.P_c, self.grid.coords[1])
        dx = dy_loc @ self.weight  # (n, C): the whole dx; keep this rank's channels
        return self.xp.ascontiguousarray(dx[:, c0:c1]).reshape(dx.shape[0], c1 - c0, 1, 1)

    def gradient_comm(self):
        return self.grid.axis_comm("sample")

    def records(self):
        """The calls one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        return linear_records(self._input_shape, self.out_features, self.has_bias, self.grid.shape, self.grid.coords,
                              self.dtype.itemsize)

    def parameters(self):
        return {"weight": self.weight, **({"bias": self.bias} if self.has_bias else {})}

    def gradients(self):
        return {"weight": self.weight_grad, **({"bias": self.bias_grad} if self.has_bias else {})}

    def parameter_distributions(self):
        """Replicated everywhere: ``W`` viewed as ``(K, C, 1, 1)``, ``b`` as ``(K, 1, 1, 1)``."""
        K, C = self.out_features, self.in_features
        out = {"weight": Distribution.replicated(self.grid, (K, C, 1, 1), names=("K", "C", "-", "-"))}
        if self.has_bias:
            out["bias"] = Distribution.replicated(self.grid, (K, 1, 1, 1), names=("K", "-", "-", "-"))
        return out

    def __repr__(self):
        return f"Linear({self.in_features}, {self.out_features}, grid={self.grid.shape})"
