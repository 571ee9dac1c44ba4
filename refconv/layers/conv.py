"""``DistConv2d``: one convolution layer split over a process grid.

The layer holds the parameters and their layouts; its algorithm (one module of
:mod:`refconv.algorithms` each) does all of the computing and all of the
communication: halo exchange and return, channel collectives, and the segmented
allreduce of ``dw`` and ``db``.

- ``P_c = 1``: :mod:`refconv.algorithms.spatial` (sample and spatial parallelism);
- ``P_c > 1``: the algorithm asked for, e.g. :mod:`refconv.algorithms.stationary_x`.

Activations always use the standard layout of the grid (N over sample, channels
over channel, H over height, W over width); only the weights' layout depends on
the algorithm.  The bias ``b[F_i]`` is split like the output channels.
"""

import math

import numpy

from refconv import algorithms, checks, collectives
from refconv.algorithms.base import POLL_CHUNKS, ConvGeometry, grid_view
from refconv.distribution import Distribution
from refconv.layers.base import GradientsInFlight, Layer
from refconv.pricing.chooser import choose_for_layer
from refconv.sharding import allgather, scatter


class DistConv2d(GradientsInFlight, Layer):
    """A 2-D convolution whose activations and weights are split over ``grid``.

    ``algorithm`` (a name in :data:`refconv.algorithms.REGISTRY`: "stationary-x",
    "stationary-y", "stationary-w", or "auto") matters only when ``grid.P_c > 1``.
    For "stationary-w", ``filter_groups`` is ``p_f``, a divisor of ``P_c`` (of ``P_c/groups``
    when a grouped layer's groups span ranks; default: the largest divisor not above its
    square root).  ``"auto"`` picks the algorithm and
    ``p_f`` with the least predicted step time when the layer is bound to an input shape:
    the planner's whole-step model (compute and every call of ``records()``,
    :func:`refconv.pricing.choose_for_layer`), priced with ``machine`` (a machine file, a
    built-in name, or None for the built-in defaults, with a warning), grouped layers
    among the classes that run them (:func:`refconv.algorithms.candidates`).  The
    estimates are kept in ``layer.cost_estimates``.  A grouped layer (``groups > 1``) on a channel split runs
    "grouped" when ``groups`` is a multiple of ``P_c`` (each rank convolves its own groups,
    no channel collective), or X, Y or W within each group's ranks when a group spans
    several (docs/grouped.md).
    ``padding`` is an int, an ``(h, w)`` pair, ``'valid'`` or ``'same'`` (torch's: with an
    even dilated kernel the odd pad goes on the high side); ``padding_mode`` zeros, reflect,
    replicate or circular, as in torch (the halo exchange fills the padding from the ranks
    that own the copied cells, docs/spatial.md).  ``input_shape`` (global
    ``N, C, H, W``) may be given now, or later by :meth:`bind`, :meth:`scatter_input`, or
    from the local shapes at the first :meth:`forward`.  Parameters start as PyTorch's default (uniform in
    ``+-1/sqrt(fan_in)``), drawn from ``seed`` identically on every rank.
    """

    overlap_halo = False  # the interior behind the halo exchange, dx's own cells behind its return (Model.set_overlap)
    poll_chunks = POLL_CHUNKS  # bands of that work, with MPI_Test (collectives.progress) between them
    dims = 2  # spatial dims: (h, w) here, (d, h, w) in DistConv3d
    ndim = 4  # of the input, NCHW

    def __init__(self, in_channels, out_channels, kernel_size, *, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", grid, algorithm="stationary-x", filter_groups=None, backend="auto",
                 dtype=numpy.float32, input_shape=None, seed=0, machine=None):
        if grid is None or not hasattr(grid, "P_c"):
            raise ValueError(f"grid: expected a refconv.ProcessGrid, got {grid!r}")
        if self.dims == 2 and grid.P_D > 1:
            raise ValueError(f"grid: DistConv2d splits images, not depth; got a grid with depth={grid.P_D} "
                             f"(DistConv3d splits volumes over depth)")
        super().__init__(grid=grid, backend=backend, dtype=dtype)
        self.in_channels = checks.positive_int(in_channels, "in_channels")
        self.out_channels = checks.positive_int(out_channels, "out_channels")
        per_dim = lambda value, name, least: checks.spatial(value, name, minimum=least, dims=self.dims)  # noqa: E731
        kernel = per_dim(kernel_size, "kernel_size", 1)
        self.stride = per_dim(stride, "stride", 1)
        self.dilation = per_dim(dilation, "dilation", 1)
        checks.conv_padding(padding, kernel, self.stride, self.dilation)  # validates 'same' (stride 1) now
        self.padding = padding if isinstance(padding, str) else per_dim(padding, "padding", 0)
        self.padding_mode = checks.one_of(padding_mode, "padding_mode", checks.PADDING_MODES)
        self.groups = checks.positive_int(groups, "groups")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups: {groups} must divide in_channels={in_channels} and out_channels={out_channels}")
        P_c = grid.P_c
        for name, length in (("in_channels", in_channels), ("out_channels", out_channels)):
            if length < P_c:
                raise ValueError(f"{name}={length} cannot be split over channel={P_c} ranks: a rank's block would be empty")
        self.requested_algorithm = algorithm
        self.machine = machine  # what 'auto' prices with: a machine file, a built-in name, or None
        self.cost_estimates = None
        if algorithm == "auto":
            if filter_groups is not None:
                raise ValueError("filter_groups: algorithm='auto' chooses filter_groups itself; pass None")
            if P_c > 1 and groups > 1:
                algorithms.grouped_classes(P_c, groups, (in_channels, out_channels))  # raises now, not when bound
            self.algorithm = self.filter_groups = None  # chosen when the layer is bound
        else:
            cls, self.filter_groups = algorithms.resolve(algorithm, P_c, filter_groups, groups,
                                                         (in_channels, out_channels))
            self.algorithm = cls.name  # sample-spatial where P_c = 1, grouped(-x, -y) where groups > 1
        self.w_shape = (self.out_channels, self.in_channels // self.groups) + kernel
        self.has_bias = bool(bias)
        self._bound = {}  # (H, W) (or (D, H, W)) -> algorithm object bound to that geometry
        self._geom = self._algo = None

        # Parameters: the same global draw on every rank, then this rank's shard (shapes-only: no draw).
        self.weight = self.bias = self.weight_grad = self.bias_grad = None
        self._global_init = None
        if self.backend.values:
            fan_in = math.prod(self.w_shape[1:])
            rng = numpy.random.default_rng(seed)
            limit = 1.0 / math.sqrt(fan_in)
            w = rng.uniform(-limit, limit, self.w_shape).astype(self.dtype)
            b = rng.uniform(-limit, limit, self.out_channels).astype(self.dtype) if bias else None
            self._global_init = (w, b)
        if self.algorithm is not None:
            self._init_parameters()
        if input_shape is not None:
            self.bind(input_shape)

    # -- layouts ------------------------------------------------------------------------
    @property
    def weight_distribution(self):
        """How ``F x C/groups x Kh x Kw`` is laid out (see each algorithm's table); a 3-D kernel's
        ``Kd`` is whole, as ``Kh`` and ``Kw`` are."""
        self._require_algorithm()
        dims = algorithms.REGISTRY[self.algorithm].weight_dims(self.grid.P_c, self.filter_groups, self.groups)
        names = ("F", "C", "Kd", "Kh", "Kw")[5 - len(self.w_shape):]
        return Distribution(self.grid, self.w_shape, tuple(dims) + (None,) * (len(self.w_shape) - 4), names=names)

    @property
    def bias_distribution(self):
        """The bias as an ``F x 1 x 1 x 1`` tensor: split like the output channels."""
        return Distribution(self.grid, (self.out_channels, 1, 1, 1),
                            ("channel" if self.grid.P_c > 1 else None, None, None, None), names=("F", "-", "-", "-"))

    def _require_algorithm(self):
        if self.algorithm is None:
            raise ValueError(f"{self!r}: algorithm='auto' is chosen when the layer is bound; call "
                             f"bind((N, C, H, W)) or pass input_shape= first")

    # -- binding to an input shape ---------------------------------------------------------
    def _bind(self, shape):
        N, C = shape[:2]
        if C != self.in_channels:
            raise ValueError(f"input_shape: expected C = in_channels = {self.in_channels}, got {shape}")
        geom = ConvGeometry.of(shape, self.w_shape, stride=self.stride, padding=self.padding, dilation=self.dilation,
                               groups=self.groups, bias=self.has_bias, itemsize=self.dtype.itemsize,
                               padding_mode=self.padding_mode, dims=self.dims)
        grid_shape, _ = grid_view(self.grid, geom)
        letters, splits = checks.DIM_NAMES[self.dims], grid_shape[2:]  # "HW", (P_H, P_W); or "DHW", (P_D, P_H, P_W)
        for name, length, parts in ([("N", N, grid_shape[0])] + list(zip(letters, shape[2:], splits))
                                    + [(d + "'", n, p) for d, n, p in zip(letters, geom.out_shape[2:], splits)]):
            if length < parts:
                raise ValueError(f"input_shape: {name} = {length} cannot be split over {parts} ranks: "
                                 f"a rank's block would be empty")
        if self.algorithm is None:
            self._choose_algorithm(geom)
        if shape[2:] not in self._bound:
            cls = algorithms.REGISTRY[self.algorithm]
            self._bound[shape[2:]] = cls(self.grid, geom, self.backend, self.filter_groups)
        self._algo, self._geom = self._bound[shape[2:]], geom
        return geom.out_shape

    def _choose_algorithm(self, geom):
        P_c = self.grid.P_c
        if P_c == 1:
            algorithm, filter_groups = algorithms.NO_CHANNEL_SPLIT, None
        else:  # the planner's whole-step model: compute and every call, priced by the machine file
            algorithm, filter_groups, self.cost_estimates = choose_for_layer(
                geom.in_shape, geom.F, geom.kernel, grid_shape=grid_view(self.grid, geom)[0], stride=geom.stride,
                padding=self.padding, dilation=geom.dilation, groups=geom.groups, bias=geom.bias,
                padding_mode=geom.padding_mode, machine=self.machine)
        self.algorithm, self.filter_groups = algorithm, filter_groups
        self._init_parameters()

    def scatter_input(self, x, root=0):
        """Bind the layer to the global ``x`` (given on ``root``; ignored elsewhere) and return
        this rank's block of it."""
        shape = collectives.bcast_object(self.grid.comm, tuple(x.shape) if self.grid.rank == root else None, root)
        return scatter(x, self.bind(shape).input_distribution, self.grid, root=root)

    def _bind_from_local(self, x_loc):
        """Global N, H, W (and D) from the local extents: sums over the sample, height and width axes
        (and depth), each of the extents of the ranks first along every other axis."""
        coords = self.grid.volume_coords if self.dims == 3 else self.grid.coords  # (n, c, h, w), or (n, c, d, h, w)
        axes = [0] + list(range(2, len(coords)))  # the sample axis, then the spatial ones
        sizes = numpy.array([x_loc.shape[a] if all(coords[b] == 0 for b in range(len(coords)) if b != a) else 0
                             for a in axes], dtype=numpy.int64)
        N, *spatial = (int(v) for v in collectives.allreduce(self.grid.comm, sizes))
        self.bind((N, self.in_channels, *spatial))

    # -- parameters ---------------------------------------------------------------------------
    def _init_parameters(self):
        """This rank's shard of the initial draw; on a backend without values, arrays of its shape."""
        if self._global_init is not None:
            self.set_global_parameters(*self._global_init)
            return
        rank = self.grid.rank
        self.weight = self.backend.zeros(self.weight_distribution.local_shape(rank), self.dtype)
        self.bias = self.backend.zeros(self.bias_distribution.local_shape(rank)[:1], self.dtype) \
            if self.has_bias else None

    def set_global_parameters(self, w, b=None):
        """Give this rank its shard of the global ``w (F, C/groups, Kh, Kw)`` and ``b (F,)``."""
        w = numpy.asarray(self.backend.to_host(w))
        if tuple(w.shape) != self.w_shape:
            raise ValueError(f"w: expected shape {self.w_shape}, got {tuple(w.shape)}")
        self.weight = self.backend.asarray(self.weight_distribution.extract(w.astype(self.dtype), self.grid.rank))
        self.bias = None
        if self.has_bias:
            if b is None:
                raise ValueError("b: this layer has a bias; pass b of shape (F,)")
            b = numpy.asarray(self.backend.to_host(b))
            if tuple(b.shape) != (self.out_channels,):
                raise ValueError(f"b: expected shape ({self.out_channels},), got {tuple(b.shape)}")
            local = self.bias_distribution.extract(b.astype(self.dtype).reshape(-1, 1, 1, 1), self.grid.rank)
            self.bias = self.backend.asarray(local.reshape(-1))

    def global_parameter_grads(self):
        """``(dw, db)``: the full gradients, gathered on every rank (``db`` None without bias)."""
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
    def _check_local(self, a, dist, name):
        super()._check_local(a, dist, name)
        if a.dtype != self.dtype:
            raise ValueError(f"{name}: expected dtype {self.dtype}, got {a.dtype}")

    def forward(self, x_loc):
        """``x_loc`` (this rank's block of x) -> ``y_loc`` (its block of y)."""
        if self._input_shape is None:
            self._bind_from_local(x_loc)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._algo.overlap_halo, self._algo.poll_chunks = self.overlap_halo, self.poll_chunks
        return self._algo.forward(x_loc, self.weight, self.bias)  # (n, F_i, h', w')

    def backward(self, dy_loc):
        """``dy_loc`` -> ``dx_loc``; also leaves ``weight_grad`` and ``bias_grad`` (this rank's
        shards, summed over every sample and row by the segmented allreduce; with
        ``overlap_gradients``, the allreduce is left in flight until they are read)."""
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        self._algo.overlap, self._algo.overlap_halo = self.gradient_overlap, self.overlap_halo
        self._algo.poll_chunks, self._algo.bucketed = self.poll_chunks, self.bucketed()
        dx_loc, self.weight_grad, self.bias_grad = self._algo.backward(dy_loc, self.weight)
        return dx_loc

    def gradient_comm(self):
        return self._algo.peers

    def records(self):
        """The calls one forward and backward of this bound layer make on this rank (a layer that
        binds itself in its first forward also makes, that once, one allreduce of its local extents)."""
        self._require_bound()
        cls = algorithms.REGISTRY[self.algorithm]
        return cls.records(self._geom, *grid_view(self.grid, self._geom), self.filter_groups)

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, {self.w_shape[2:]}, "
                f"stride={self.stride}, "
                f"padding={self.padding!r}, padding_mode={self.padding_mode!r}, dilation={self.dilation}, groups={self.groups}, "
                f"algorithm={self.algorithm or self.requested_algorithm!r}, grid={self.grid.shape})")
