"""The layer protocol and the layouts of tensors between layers.

Every layer of a model, convolution included, is a :class:`Layer`::

    layer.bind(input_shape)            # global input shape (N, C, H, W); returns the layer
    layer.input_distribution           # how the input is laid out (a Distribution)
    layer.output_distribution
    layer.output_shape
    y_loc = layer.forward(x_loc)       # this rank's blocks
    dx_loc = layer.backward(dy_loc)
    layer.parameters(), layer.gradients(), layer.parameter_distributions()
    layer.buffers(), layer.buffer_distributions()

Three layouts of a tensor flow between layers (``layout(grid, shape, kind)``):

- ``"activations"``: NCHW, N over sample, C over channel, H over height, W over width;
- ``"features"``: the output of global average pooling, ``(N, C, 1, 1)``, N over
  sample, C over channel and **replicated** over height and width.  Local
  arrays stay 4-D ``(n, C_i, 1, 1)``;
- ``"logits"``: the output of :class:`refconv.layers.Linear`, ``(n, K)``: N over
  sample, replicated over channel and space.
"""

import numpy

from refconv import checks
from refconv.collectives import Request
from refconv.collectives.buckets import Slot
from refconv.backend import get_backend
from refconv.distribution import Distribution

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


class Layer:
    """Shared plumbing: the grid, the backend, binding and local-shape checks.

    A subclass sets ``kind_in``/``kind_out`` and implements ``_bind(shape) ->
    output_shape`` (validating), ``forward`` and ``backward``.
    """

    kind_in = kind_out = "activations"
    ndim = 4  # of the input: NCHW (5 for a layer of volumes, NCDHW)

    def __init__(self, *, grid, backend="auto", dtype=numpy.float32):
        self.grid = grid
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.dtype = checks.float_dtype(dtype)
        self.training = True
        self._input_shape = self._output_shape = None

    @property
    def xp(self):
        return self.backend.xp

    def bind(self, input_shape):
        """Fix the global input shape; raises ValueError (on every rank alike) if a block would be empty."""
        shape = checks.shape_of(input_shape, "input_shape", self.ndim)
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


class GradientsInFlight:
    """``weight_grad`` and ``bias_grad`` of a layer that may leave their allreduce in flight.

    With ``overlap_gradients`` set (``Model.set_overlap``), the layer's backward starts the
    allreduce of its gradients and returns, so that it runs behind the backward of the
    layers before it; the gradient attributes hold the :class:`refconv.collectives.Request`
    until they are read, and reading one waits for it (the optimizer's step reads them,
    and so does a checkpoint).  Either way the value read is the same sum.
    """

    OVERLAP = "backward of the layers before it"  # what the records of the overlapped calls say
    overlap_gradients = False
    buckets = None  # the model's refconv.collectives.buckets.Buckets for this backward (Model.set_buckets)
    _weight_grad = _bias_grad = None

    @property
    def gradient_overlap(self):
        """What the gradients' allreduce overlaps (a string for the record), or None: waited at once."""
        return self.OVERLAP if self.overlap_gradients else None

    def gradient_comm(self):
        """The communicator of this layer's gradient allreduces."""
        raise NotImplementedError

    def gradient_entries(self):
        """``[(key, comm, Call)]``: this layer's gradient allreduces (``Call.grad``), in the order its
        backward starts them (dw, then db), for :func:`refconv.collectives.buckets.plan`."""
        grads = [c for c in self.records() if c.grad]
        return [((id(self), i), self.gradient_comm(), call) for i, call in enumerate(grads)]

    def bucketed(self):
        """``start(i, x)``, handing gradient ``i`` (0: dw, 1: db) to the model's buckets and returning
        its :class:`refconv.collectives.buckets.Slot`; None where the model has no buckets."""
        if self.buckets is None or (id(self), 0) not in self.buckets:
            return None
        return lambda i, x: self.buckets.add((id(self), i), x)

    def _finished(self, name):
        value = getattr(self, name)
        if isinstance(value, (Request, Slot)):
            value = value.wait()
            setattr(self, name, value)
        return value

    def _replace(self, name, value):
        self._finished(name)  # a call still in flight is finished before its result is dropped
        setattr(self, name, value)

    weight_grad = property(lambda self: self._finished("_weight_grad"),
                           lambda self, value: self._replace("_weight_grad", value),
                           doc="This rank's shard of dw, summed over its peers (waits for it if in flight).")
    bias_grad = property(lambda self: self._finished("_bias_grad"),
                         lambda self, value: self._replace("_bias_grad", value),
                         doc="This rank's block of db, summed over its peers (waits for it if in flight).")

    def finish_gradients(self):
        """Wait for the gradients' allreduce if it is in flight."""
        self._finished("_weight_grad"), self._finished("_bias_grad")
