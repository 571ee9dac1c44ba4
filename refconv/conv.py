"""``DistConv2d``: one convolution layer split over a process grid.

The layer picks its algorithm module and finishes every algorithm the same way:

- ``P_c = 1``: :mod:`refconv.spatial` (sample and spatial parallelism, replicated weights);
- ``P_c > 1``: :mod:`refconv.stationary_x`, :mod:`refconv.stationary_y` or
  :mod:`refconv.stationary_w`, each composing with spatial splits through
  :class:`refconv.spatial.LocalConv`.

Activations always use the standard layout of the grid (N over sample, channels
over channel, H over height, W over width); only the weights' layout depends on
the algorithm.  The bias ``b[F_i]`` is split like the output channels and added
after the algorithm's forward.

The segmented allreduce: every algorithm leaves each rank with the gradient of
its own weight shard, summed over its local samples and rows only.  It is then
allreduced among the **weight peers** (the ranks sharing the channel coordinate),
``P_c`` disjoint allreduces running concurrently, each of one shard.
"""

import dataclasses
import math

import numpy

from refconv import collectives
from refconv.backend import get_backend
from refconv.distribution import Distribution, block_range
from refconv.reference import _checks
from refconv.spatial import SampleSpatial
from refconv.stationary_w import StationaryW
from refconv.stationary_x import StationaryX
from refconv.stationary_y import StationaryY

ALGORITHMS = ("stationary-x", "stationary-y", "stationary-w", "auto")
_CLASSES = {"sample-spatial": SampleSpatial, "stationary-x": StationaryX, "stationary-y": StationaryY,
            "stationary-w": StationaryW}


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Global sizes of one convolution: ``in_shape (N, C, H, W)``, ``w_shape``, ``out_shape``."""

    in_shape: tuple
    w_shape: tuple
    out_shape: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def C(self):
        return self.in_shape[1]

    @property
    def F(self):
        return self.w_shape[0]

    @staticmethod
    def channel_counts(length, parts):
        """Block lengths of ``length`` split ``parts`` ways (``numpy.array_split``)."""
        return [e - s for s, e in (block_range(length, parts, i) for i in range(parts))]


class DistConv2d:
    """A 2-D convolution whose activations and weights are split over ``grid``.

    ``algorithm`` ("stationary-x", "stationary-y", "stationary-w") matters only when
    ``grid.P_c > 1``; for "stationary-w", ``filter_groups`` is ``p_f`` and must divide
    ``P_c`` (default: the largest divisor not above ``sqrt(P_c)``).  ``"auto"`` (which needs ``input_shape``) picks the algorithm and ``p_f``
    with the least predicted communication (:mod:`refconv.cost_model`); the estimates
    are kept in ``layer.cost_estimates``.  ``input_shape`` (global ``N, C, H, W``) may be given now, or is bound by
    :meth:`bind`, by ``refconv.scatter(x, layer.input_distribution, grid)``, or from the
    local shapes at the first :meth:`forward`.  Parameters start as PyTorch's default
    (uniform in ``+-1/sqrt(fan_in)``), drawn from ``seed`` identically on every rank.
    """

    def __init__(self, in_channels, out_channels, kernel_size, *, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, grid, algorithm="stationary-x", filter_groups=None, backend="auto",
                 dtype=numpy.float32, input_shape=None, seed=0):
        for name, v in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(v, bool) or not isinstance(v, (int, numpy.integer)) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {ALGORITHMS}, got {algorithm!r}")
        self.dtype = numpy.dtype(dtype)
        if self.dtype not in _checks.FLOAT_DTYPES:
            raise ValueError(f"dtype: expected float32 or float64, got {self.dtype}")
        kernel = _checks.pair(kernel_size, "kernel_size", minimum=1)
        self.stride = _checks.pair(stride, "stride", minimum=1)
        self.padding = _checks.pair(padding, "padding", minimum=0)
        self.dilation = _checks.pair(dilation, "dilation", minimum=1)
        if isinstance(groups, bool) or not isinstance(groups, (int, numpy.integer)) or groups < 1:
            raise ValueError(f"groups: expected a positive int, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups: {groups} must divide in_channels={in_channels} and out_channels={out_channels}")
        self.groups = int(groups)
        self.grid = grid
        P_c = grid.P_c
        if P_c > 1 and groups > 1:
            raise ValueError(
                f"groups: grouped convolution (groups={groups}) is supported with sample and spatial "
                f"splits only; use a grid with channel=1 (got channel={P_c})")
        for name, length in (("in_channels", in_channels), ("out_channels", out_channels)):
            if length < P_c:
                raise ValueError(f"{name}={length} cannot be split over channel={P_c} ranks: a rank's block would be empty")
        self.requested_algorithm = algorithm
        self.cost_estimates = None
        if algorithm == "auto":
            if filter_groups is not None:
                raise ValueError("filter_groups: algorithm='auto' chooses filter_groups itself; pass None")
            if input_shape is None:
                raise ValueError("algorithm: 'auto' needs input_shape=(N, C, H, W) to price the algorithms")
            if P_c > 1:
                from refconv.cost_model import choose_algorithm

                shape = _checks.shape4(input_shape, "input_shape")
                algorithm, filter_groups, self.cost_estimates = choose_algorithm(
                    shape, out_channels, kernel, grid_shape=grid.shape, stride=self.stride, padding=self.padding,
                    dilation=self.dilation, bias=bias, itemsize=self.dtype.itemsize)
            else:
                algorithm = "stationary-x"  # no channel split: sample/spatial whatever the name
        if algorithm == "stationary-w":
            if filter_groups is None:  # the divisor nearest sqrt(P_c) from below: both collectives ~1/sqrt(P_c)
                filter_groups = max(d for d in range(1, P_c + 1) if P_c % d == 0 and d * d <= P_c)
            if isinstance(filter_groups, bool) or not isinstance(filter_groups, (int, numpy.integer)) \
                    or filter_groups < 1 or P_c % filter_groups:
                divisors = [d for d in range(1, P_c + 1) if P_c % d == 0]
                raise ValueError(f"filter_groups: expected a divisor of grid.P_c={P_c} (one of {divisors}), got {filter_groups!r}")
        elif filter_groups is not None:
            raise ValueError(f"filter_groups: only 'stationary-w' takes filter_groups, got algorithm={algorithm!r}")
        self.algorithm = algorithm if P_c > 1 else "sample-spatial"
        self._algorithm_class = _CLASSES[self.algorithm]
        self.filter_groups = filter_groups
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.w_shape = (self.out_channels, self.in_channels // self.groups) + kernel
        self.backend = get_backend(backend)
        self.has_bias = bool(bias)
        self._bound = {}  # (H, W) -> (geometry, algorithm object)
        self._geom = self._algo = None
        self._input_shape = None

        # Parameters: the same global draw on every rank, then this rank's shard.
        fan_in = self.w_shape[1] * kernel[0] * kernel[1]
        rng = numpy.random.default_rng(seed)
        bound = 1.0 / math.sqrt(fan_in)
        w = rng.uniform(-bound, bound, self.w_shape).astype(self.dtype)
        b = rng.uniform(-bound, bound, self.out_channels).astype(self.dtype) if bias else None
        self.weight_grad = self.bias_grad = None
        self.set_global_parameters(w, b)
        if input_shape is not None:
            self.bind(input_shape)

    # -- layouts ------------------------------------------------------------------------
    @property
    def weight_distribution(self):
        """How ``F x C/groups x Kh x Kw`` is laid out (see each algorithm's table)."""
        dims = self._algorithm_class.weight_dims(self.grid.P_c, self.filter_groups)
        return Distribution(self.grid, self.w_shape, dims, names=("F", "C", "Kh", "Kw"))

    @property
    def bias_distribution(self):
        """The bias as an ``F x 1 x 1 x 1`` tensor: split like the output channels."""
        return Distribution(self.grid, (self.out_channels, 1, 1, 1), ("channel" if self.grid.P_c > 1 else None, None, None, None),
                            names=("F", "-", "-", "-"))

    @property
    def input_distribution(self):
        """N over sample, C over channel, H over height, W over width (bound to the input shape)."""
        if self._input_shape is None:
            return UnboundInput(self)
        return Distribution.activations(self.grid, self._input_shape)

    @property
    def output_distribution(self):
        if self._input_shape is None:
            raise ValueError("output_distribution: the layer has no input shape yet; pass input_shape=, "
                             "call bind(shape), or run forward first")
        return Distribution.activations(self.grid, self._geom.out_shape[:1] + self._geom.out_shape[1:])

    # -- binding to an input shape ---------------------------------------------------------
    def bind(self, input_shape):
        """Fix the global input shape ``(N, C, H, W)``; validates that no block is empty."""
        input_shape = _checks.shape4(input_shape, "input_shape")
        N, C, H, W = input_shape
        if C != self.in_channels:
            raise ValueError(f"input_shape: expected C = in_channels = {self.in_channels}, got {input_shape}")
        if (H, W) not in self._bound:
            stride, padding, dilation, groups, out_hw = _checks.conv_geometry(
                input_shape, self.w_shape, self.stride, self.padding, self.dilation, self.groups)
            g = self.grid
            for name, length, parts in (("H", H, g.P_H), ("W", W, g.P_W), ("H'", out_hw[0], g.P_H), ("W'", out_hw[1], g.P_W)):
                if length < parts:
                    raise ValueError(f"input_shape: {name} = {length} cannot be split over {parts} ranks: a rank's block would be empty")
            geom = ConvGeometry(input_shape, self.w_shape, (N, self.out_channels) + out_hw, stride, padding, dilation, groups)
            self._bound[(H, W)] = (geom, self._make_algorithm(geom))
        if N < self.grid.P_N:
            raise ValueError(f"input_shape: N = {N} cannot be split over sample={self.grid.P_N} ranks: a rank's block would be empty")
        geom, self._algo = self._bound[(H, W)]
        self._geom = dataclasses.replace(geom, in_shape=input_shape, out_shape=(N,) + geom.out_shape[1:])
        self._input_shape = input_shape
        return self

    def _make_algorithm(self, geom):
        if self.algorithm == "stationary-w":
            return StationaryW(self.grid, geom, self.backend, self.filter_groups)
        return self._algorithm_class(self.grid, geom, self.backend)

    def _bind_from_local(self, x_loc):
        """Global N, H, W from the local extents: sums over the sample, height and width axes."""
        g = self.grid
        n, c, h, w = x_loc.shape
        sizes = numpy.array([n if g.coords[1] == 0 and g.coords[2] == 0 and g.coords[3] == 0 else 0,
                             h if g.coords[0] == 0 and g.coords[1] == 0 and g.coords[3] == 0 else 0,
                             w if g.coords[0] == 0 and g.coords[1] == 0 and g.coords[2] == 0 else 0], dtype=numpy.int64)
        N, H, W = (int(v) for v in collectives.allreduce(g.comm, sizes))
        self.bind((N, self.in_channels, H, W))

    # -- parameters ---------------------------------------------------------------------------
    def set_global_parameters(self, w, b=None):
        """Give this rank its shard of the global ``w (F, C/groups, Kh, Kw)`` and ``b (F,)``."""
        w = numpy.asarray(self.backend.to_host(w))
        if tuple(w.shape) != self.w_shape:
            raise ValueError(f"w: expected shape {self.w_shape}, got {tuple(w.shape)}")
        self.weight = self.backend.asarray(self.weight_distribution.extract(w.astype(self.dtype), self.grid.rank))
        if self.has_bias:
            if b is None:
                raise ValueError("b: this layer has a bias; pass b of shape (F,)")
            b = numpy.asarray(self.backend.to_host(b))
            if tuple(b.shape) != (self.out_channels,):
                raise ValueError(f"b: expected shape ({self.out_channels},), got {tuple(b.shape)}")
            local = self.bias_distribution.extract(b.astype(self.dtype).reshape(-1, 1, 1, 1), self.grid.rank)
            self.bias = self.backend.asarray(local.reshape(-1))
        else:
            self.bias = None

    def global_parameter_grads(self):
        """``(dw, db)``: the full gradients, gathered on every rank (``db`` None without bias)."""
        from refconv.sharding import allgather

        if self.weight_grad is None:
            raise ValueError("global_parameter_grads: run backward first")
        dw = allgather(self.weight_grad, self.weight_distribution, self.grid)
        db = None
        if self.has_bias:
            db = allgather(self.bias_grad.reshape(-1, 1, 1, 1), self.bias_distribution, self.grid).reshape(-1)
        return dw, db

    def parameters(self):
        """Local shards by name (``weight``, and ``bias`` if any)."""
        return {"weight": self.weight, **({"bias": self.bias} if self.has_bias else {})}

    def gradients(self):
        return {"weight": self.weight_grad, **({"bias": self.bias_grad} if self.has_bias else {})}

    def parameter_distributions(self):
        """Layout of each parameter viewed as a 4-D tensor (the bias as ``F x 1 x 1 x 1``)."""
        return {"weight": self.weight_distribution, **({"bias": self.bias_distribution} if self.has_bias else {})}

    # -- forward and backward ----------------------------------------------------------------
    def _check_local(self, a, shape, name):
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name}: rank {self.grid.rank} expected its local block of shape {tuple(shape)}, got {tuple(a.shape)}")
        if a.dtype != self.dtype:
            raise ValueError(f"{name}: expected dtype {self.dtype}, got {a.dtype}")

    def forward(self, x_loc):
        """``x_loc`` (this rank's block of x) -> ``y_loc`` (its block of y)."""
        if self._input_shape is None:
            self._bind_from_local(x_loc)
        self._check_local(x_loc, self.input_distribution.local_shape(self.grid.rank), "x_loc")
        y_loc = self._algo.forward(x_loc, self.weight)  # (n, F_i, h', w')
        if self.has_bias:
            y_loc = self.backend.bias_add(y_loc, self.bias)
        return y_loc

    def backward(self, dy_loc):
        """``dy_loc`` -> ``dx_loc``; also leaves ``weight_grad`` and ``bias_grad`` (this rank's
        shards, summed over every sample and row by the segmented allreduce)."""
        self._check_local(dy_loc, self.output_distribution.local_shape(self.grid.rank), "dy_loc")
        dx_loc, dw_loc = self._algo.backward(dy_loc, self.weight)
        peers = self.grid.weight_peers_comm
        self.weight_grad = collectives.allreduce_(peers, dw_loc)  # segmented: one shard per peer set
        if self.has_bias:
            self.bias_grad = collectives.allreduce_(peers, self.backend.bias_grad(dy_loc))
        return dx_loc

    def __repr__(self):
        return (f"DistConv2d({self.in_channels}, {self.out_channels}, {self.w_shape[2:]}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"algorithm={self.algorithm!r}, grid={self.grid.shape})")


class UnboundInput:
    """The input layout of a layer that has no input shape yet.

    ``refconv.scatter(x, layer.input_distribution, grid)`` accepts it: the root's
    ``x.shape`` binds the layer, then the scatter proceeds as usual.
    """

    def __init__(self, layer):
        self.layer = layer

    def resolve(self, global_shape):
        return self.layer.bind(global_shape).input_distribution

    def __getattr__(self, name):
        if name.startswith("__"):  # copy, pickle and hasattr probes: the ordinary answer
            raise AttributeError(name)
        raise ValueError(f"input_distribution.{name}: the layer has no input shape yet; pass input_shape=, call "
                         f"bind((N, C, H, W)), or scatter the global input with refconv.scatter first")
