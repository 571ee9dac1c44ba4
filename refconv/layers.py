"""The other layers of a distributed CNN, each on its own process grid.

Every layer follows the protocol of :class:`refconv.conv.DistConv2d`::

    layer.bind(input_shape)            # global input shape (N, C, H, W); returns the layer
    layer.input_distribution           # how the input is laid out (a Distribution)
    layer.output_distribution
    y_loc = layer.forward(x_loc)       # this rank's blocks
    dx_loc = layer.backward(dy_loc)
    layer.parameters(), layer.gradients(), layer.parameter_distributions()

===================  ==============================  ====================================
layer                forward                         backward
===================  ==============================  ====================================
``ReLU``             local                           local
``GlobalAvgPool``    allreduce of the local spatial  local (each spatial peer holds the
                     sums over the spatial peers     whole gradient of the mean)
``Linear``           allgather of the features over  local; allreduce of dW, db over the
                     the channel group               sample axis
``Redistribute``     all-to-all (the "shuffle")      the reverse all-to-all
===================  ==============================  ====================================

Batch normalization and pooling are in :mod:`refconv.norm_pool`; the loss,
:class:`SoftmaxCrossEntropy`, is here.

Two layouts of a tensor flow between layers (``layout(grid, shape, kind)``):

- ``"activations"``: NCHW, N over sample, C over channel, H over height, W over width;
- ``"features"``: the output of global average pooling, ``(N, C, 1, 1)``, N over
  sample, C over channel and **replicated** over height and width.  Local
  arrays stay 4-D ``(n, C_i, 1, 1)``.

The logits of :class:`Linear` are ``(n, K)``: N over sample, replicated over
channel and space.
"""

import math

import numpy

from refconv import collectives
from refconv.backend import get_backend
from refconv.distribution import Distribution, block_range
from refconv.reference import _checks
from refconv.sharding import redistribute

KINDS = ("activations", "features", "logits")


def layout(grid, shape, kind="activations"):
    """The Distribution of a tensor of global ``shape`` and ``kind`` on ``grid``."""
    if kind == "activations":
        return Distribution.activations(grid, shape)
    if kind == "features":
        return Distribution(grid, shape, ("sample", "channel", None, None))
    if kind == "logits":
        return Distribution(grid, shape, ("sample", None, None, None), names=("N", "K", "-", "-"))
    raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


class Layer:
    """Shared plumbing: the grid, the backend, binding and local-shape checks.

    A subclass sets ``kind_in``/``kind_out`` and implements ``_bind(shape) ->
    output_shape`` (validating), ``forward`` and ``backward``.
    """

    kind_in = kind_out = "activations"

    def __init__(self, *, grid, backend="auto", dtype=numpy.float32):
        self.grid = grid
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.dtype = numpy.dtype(dtype)
        if self.dtype not in _checks.FLOAT_DTYPES:
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype}")
        self.training = True
        self._input_shape = self._output_shape = None

    @property
    def xp(self):
        return self.backend.xp

    def bind(self, input_shape):
        """Fix the global input shape; raises ValueError (on every rank alike) if a block would be empty."""
        shape = _checks.shape4(input_shape, "input_shape")
        out = self._bind(shape)
        for name, s, kind in (("input", shape, self.kind_in), ("output", out, self.kind_out)):
            try:
                layout(self.grid, s, kind)
            except ValueError as exc:
                raise ValueError(f"input_shape: {self!r} cannot lay out its {name} {s} on grid "
                                 f"{self.grid.shape}: {exc}") from None
        self._input_shape, self._output_shape = shape, tuple(out)
        return self

    def _bind(self, shape):
        return shape

    def _require_bound(self):
        if self._input_shape is None:
            raise ValueError(f"{self!r} has no input shape yet: call bind(input_shape) first")

    @property
    def input_distribution(self):
        self._require_bound()
        return layout(self.grid, self._input_shape, self.kind_in)

    @property
    def output_distribution(self):
        self._require_bound()
        return layout(self.grid, self._output_shape, self.kind_out)

    @property
    def output_shape(self):
        self._require_bound()
        return self._output_shape

    def _check_local(self, a, dist, name):
        shape = dist.local_shape(self.grid.rank)
        if self.kind_out == "logits" and name == "dy_loc":
            shape = shape[:2]
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name}: {self!r} on rank {self.grid.rank} expected its block of shape "
                             f"{tuple(shape)}, got {tuple(a.shape)}")

    def parameters(self):
        return {}

    def gradients(self):
        return {}

    def parameter_distributions(self):
        return {}

    def buffers(self):
        """Non-trained state saved with the parameters (BatchNorm's running statistics)."""
        return {}

    def buffer_distributions(self):
        return {}

    def __repr__(self):
        return f"{type(self).__name__}(grid={self.grid.shape})"


class ReLU(Layer):
    """``max(x, 0)``: elementwise, so any distribution works and nothing moves."""

    def forward(self, x_loc):
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x = x_loc
        return self.backend.relu_forward(x_loc)

    def backward(self, dy_loc):
        return self.backend.relu_backward(dy_loc, self._x)


class GlobalAvgPool(Layer):
    """``(N, C, H, W)`` -> features ``(N, C, 1, 1)``, the mean of each feature map.

    forward: allreduce of the local spatial sums over the spatial peers ·
    backward: local (every spatial peer already holds the whole ``dy``)
    """

    kind_out = "features"

    def _bind(self, shape):
        return shape[:2] + (1, 1)

    def forward(self, x_loc):
        # x_loc: (n, C_i, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x_shape = x_loc.shape
        partial = x_loc.sum(axis=(2, 3), keepdims=True)  # (n, C_i, 1, 1), this rank's rows and columns
        H, W = self._input_shape[2:]
        total = collectives.allreduce(self.grid.sub_comm(("height", "width")), partial)
        return total / (H * W)  # (n, C_i, 1, 1), replicated over the spatial peers

    def backward(self, dy_loc):
        # The mean is replicated over the spatial peers and each copy receives the same
        # dy, so the adjoint of the allreduce is the identity here: spread dy locally.
        H, W = self._input_shape[2:]
        return self.xp.broadcast_to(dy_loc / (H * W), self._x_shape).copy()  # (n, C_i, h, w)


class Linear(Layer):
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
        self.in_features = _positive_int(in_features, "in_features")
        self.out_features = _positive_int(out_features, "out_features")
        if self.in_features < grid.P_c:
            raise ValueError(f"in_features={in_features} cannot be split over channel={grid.P_c} ranks")
        self.has_bias = bool(bias)
        rng = numpy.random.default_rng(seed)  # PyTorch's default init, the same draw on every rank
        bound = 1.0 / math.sqrt(self.in_features)
        w = rng.uniform(-bound, bound, (self.out_features, self.in_features)).astype(self.dtype)
        b = rng.uniform(-bound, bound, self.out_features).astype(self.dtype) if bias else None
        self.set_global_parameters(w, b)
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
        counts = [e - s for s, e in (block_range(self.in_features, P_c, i) for i in range(P_c))]
        self._x = collectives.allgather(self.grid.channel_comm, x_loc.reshape(n, -1), counts, axis=1)  # (n, C)
        y = self._x @ self.weight.T  # (n, K), the same on every channel and spatial peer
        return y + self.bias if self.has_bias else y

    def backward(self, dy_loc):
        # dy_loc: (n, K)
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        sample_comm = self.grid.axis_comm("sample")
        self.weight_grad = collectives.allreduce(sample_comm, dy_loc.T @ self._x)  # (K, C)
        if self.has_bias:
            self.bias_grad = collectives.allreduce(sample_comm, dy_loc.sum(axis=0))  # (K,)
        c0, c1 = block_range(self.in_features, self.grid.P_c, self.grid.coords[1])
        dx = dy_loc @ self.weight  # (n, C): the whole dx; keep this rank's channels
        return self.xp.ascontiguousarray(dx[:, c0:c1]).reshape(dx.shape[0], c1 - c0, 1, 1)

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


class SoftmaxCrossEntropy:
    """Mean cross-entropy over the **global** batch, on the grid of the logits.

    ``loss = allreduce_sample(sum of local losses) / N``; ``dlogits = (p - onehot) / N``.
    Every channel and spatial peer holds the same logits and computes the same values.
    """

    def __init__(self, *, grid, backend="auto"):
        self.grid = grid
        self.backend = get_backend(backend) if isinstance(backend, str) else backend

    def forward(self, logits_loc, labels_loc, global_batch):
        """``logits_loc (n, K)``, ``labels_loc (n,)`` ints -> the global mean loss (a float)."""
        xp = self.backend.xp
        n, K = logits_loc.shape
        if tuple(labels_loc.shape) != (n,):
            raise ValueError(f"labels_loc: expected {n} labels (this rank's samples), got shape {tuple(labels_loc.shape)}")
        shifted = logits_loc - logits_loc.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        labels = xp.asarray(labels_loc)
        local_sum = -log_probs[xp.arange(n), labels].sum(keepdims=True)  # (1,)
        total = collectives.allreduce(self.grid.axis_comm("sample"), local_sum)
        self._probs, self._labels, self._N = xp.exp(log_probs), labels, global_batch
        return float(self.backend.to_host(total)[0]) / global_batch

    def backward(self):
        """``dlogits (n, K) = (softmax - onehot(labels)) / N`` with N the global batch."""
        xp = self.backend.xp
        d = self._probs.copy()
        d[xp.arange(d.shape[0]), self._labels] -= 1
        return d / self._N


class Redistribute(Layer):
    """Move a tensor from the layout of one grid to another's (between layers on different grids).

    forward: all-to-all with uneven counts (src -> dst) · backward: the reverse all-to-all
    """

    def __init__(self, src_grid, dst_grid, kind="activations"):
        if src_grid.size != dst_grid.size:
            raise ValueError(f"Redistribute: grids {src_grid.shape} and {dst_grid.shape} have different numbers of ranks")
        if kind not in KINDS[:2]:
            raise ValueError(f"kind: expected 'activations' or 'features', got {kind!r}")
        super().__init__(grid=dst_grid, backend="numpy")
        self.src_grid, self.kind_in, self.kind_out = src_grid, kind, kind

    def bind(self, input_shape):
        shape = _checks.shape4(input_shape, "input_shape")
        self.src = layout(self.src_grid, shape, self.kind_in)
        self.dst = layout(self.grid, shape, self.kind_out)
        self._input_shape = self._output_shape = shape
        return self

    @property
    def input_distribution(self):
        self._require_bound()
        return self.src

    def forward(self, x_loc):
        return redistribute(x_loc, self.src, self.dst, self.grid)

    def backward(self, dy_loc):
        return redistribute(dy_loc, self.dst, self.src, self.grid)

    def __repr__(self):
        return f"Redistribute({self.src_grid.shape} -> {self.grid.shape}, {self.kind_in})"
