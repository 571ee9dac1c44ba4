"""A CNN as a sequence of distributed layers, each with its own parallel strategy.

A :class:`Model` is a :class:`Sequential` of layers (and :class:`Residual` blocks)
followed by a :class:`refconv.layers.SoftmaxCrossEntropy` head.  Each layer sits on
its own :class:`refconv.grid.ProcessGrid` (all over one communicator); where two
consecutive layers' grids differ, a :class:`refconv.layers.Redistribute` is put
between them (docs/algorithms.md section 5).

Built from Python::

    g = ProcessGrid(comm, sample=2, channel=2)
    model = Model([DistConv2d(1, 8, 3, padding=1, grid=g), ReLU(grid=g),
                   GlobalAvgPool(grid=g), Linear(8, 10, grid=g)])

or from a spec (a dict, or a JSON/YAML file; see docs/models.md and
:mod:`refconv.model_spec`)::

    model = Model.from_spec("digits-cnn", comm=comm)

A model's grids hold sub-communicators: ``model.close()`` frees them (collective, safe twice), and
``with Model.from_spec(...) as model:`` closes it at the end of the block.

``model.named_parameters()`` lists ``(qualified_name, layer, param_name)`` in a
fixed order (what :class:`refconv.optim.SGD` and :mod:`refconv.checkpoint` take).
"""

from refconv import checks, model_spec
from refconv.grid import close_grids
from refconv.collectives import buckets
from refconv.collectives.buckets import Buckets
from refconv.layers import LOSSES
from refconv.layers.base import GradientsInFlight
from refconv.layers.container import Sequential, Wrapper, first_layer


class Model(Wrapper):
    """Layers (a list, or a :class:`Sequential`) and a softmax cross-entropy head.

    ``bind((N, C, H, W))``, ``forward(x_loc) -> logits_loc (n, K)``,
    ``loss(logits_loc, labels_loc) -> float`` (the global mean), ``backward()`` (from
    the last loss), ``named_parameters()``, ``named_buffers()``, ``train()``, ``eval()``.
    """

    def __init__(self, layers, *, names=None, loss="cross-entropy"):
        self.body = layers if isinstance(layers, Sequential) else Sequential(layers, names=names)
        if not self.body.layers:
            raise ValueError("layers: a model needs at least one layer")
        self.in_grid, self.out_grid = self.body.in_grid, self.body.out_grid
        last = self.body.layers[-1]
        checks.one_of(loss, "loss", tuple(LOSSES))
        self.head = LOSSES[loss](grid=self.out_grid, backend=getattr(last, "backend", "numpy"))
        self.spec = None
        self._input_shape = None
        self.overlap = False  # set_overlap
        self.bucket_bytes, self._buckets = None, None  # set_buckets; the plan, made at the first backward

    @classmethod
    def from_spec(cls, spec, *, comm=None, backend="auto", dtype=None, seed=0, serial=False, defaults=None,
                  **preset_kwargs):
        """Build from a preset name, a dict, or a ``.json``/``.yaml`` path (see :mod:`refconv.model_spec`).

        ``serial=True`` builds the same model on one rank (``MPI.COMM_SELF``, every
        grid 1x1x1x1): the serial run the distributed one must reproduce.  ``defaults``
        (``grid``, ``algorithm``, ``filter_groups``) override the spec's defaults;
        ``preset_kwargs`` (``num_classes``, ``in_channels``) go to a preset.
        """
        body, spec, in_channels = model_spec.build(spec, comm=comm, backend=backend, dtype=dtype, seed=seed,
                                                   serial=serial, defaults=defaults, **preset_kwargs)
        model = cls(body, loss=spec.get("loss", "cross-entropy"))
        model.spec, model.in_channels = spec, in_channels
        return model

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self):
        """Free the sub-communicators of every grid the model's layers sit on (collective: every rank
        calls it).  Safe to call twice.  A closed model is not for use again: its bound layers keep the
        communicators they took (a call on a freed one is an error: ``FreedComm`` on simulated ranks, an MPI
        error under mpiexec); build a new model."""
        close_grids(self.body, self.head)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- structure ------------------------------------------------------------------------------
    @property
    def layers(self):
        return self.body.layers

    def named_layers(self):
        return list(self.body.named_layers())

    def named_parameters(self):
        """``[(qualified_name, layer, param_name)]``: names like ``"4.body.0.weight"``, spec order."""
        return [(f"{q}.{p}", layer, p) for q, layer in self.body.named_layers() for p in layer.parameters()]

    def named_buffers(self):
        """Like :meth:`named_parameters` for non-trained state (BatchNorm running statistics)."""
        return [(f"{q}.{b}", layer, b) for q, layer in self.body.named_layers() for b in layer.buffers()]

    def num_parameters(self):
        """Global number of trained values."""
        total = 0
        for _, layer, p in self.named_parameters():
            n = 1
            for s in layer.parameter_distributions()[p].global_shape:
                n *= s
            total += n
        return total

    # -- running ------------------------------------------------------------------------------------
    def bind(self, input_shape):
        """Bind every layer through the chain (call again when the batch size changes)."""
        shape = checks.activation_shape(input_shape, "input_shape")  # its layers check their dims in bind
        if shape != self._input_shape:
            self.body.bind(shape)
            self._input_shape = shape
            self._buckets = None
        return self

    @property
    def input_shape(self):
        return self._input_shape

    @property
    def backend(self):
        """The backend of the layer the input goes to first (where ``x_loc`` must be): of the
        first layer, or of the first layer in its body if it is a residual block."""
        return first_layer(self.body).backend

    def label_block(self, labels):
        """This rank's labels: its samples under the logits' distribution."""
        (s, e), = self.output_distribution.pieces(self.out_grid.rank, 0)
        return labels[s:e]

    def train(self):
        self.body.set_training(True)
        return self

    def eval(self):
        self.body.set_training(False)
        return self

    def forward(self, x_loc):
        return self.body.forward(x_loc)

    def loss(self, logits_loc, labels_loc):
        """The mean cross-entropy over the global batch (the same float on every rank)."""
        return self.head.forward(logits_loc, labels_loc, self._input_shape[0])

    def backward(self):
        """Backpropagate the last :meth:`loss`; leaves every layer's gradients."""
        if self.bucket_bytes is not None:  # a fresh run of the plan: each bucket starts when it is full
            run = Buckets(self.bucket_plan()[0], GradientsInFlight.OVERLAP if self.overlap else None)
            for layer in self._gradient_layers():
                layer.buckets = run
        return self.body.backward(self.head.backward())

    def set_buckets(self, nbytes):
        """Pack the gradients' allreduces into buckets of ``nbytes`` or more
        (:mod:`refconv.collectives.buckets`; 0: each gradient its own, as without buckets; None:
        no buckets, each layer allreduces its own).  The blocking path (``set_overlap(False)``)
        uses the same buckets and waits for each as it starts: the same calls, the same bits."""
        if nbytes is not None:
            nbytes = checks.integer(nbytes, "nbytes", minimum=0)
        self.bucket_bytes, self._buckets = nbytes, None
        for layer in self._gradient_layers():
            layer.buckets = None
        return self

    def _gradient_layers(self):
        return [layer for _, layer in self.named_layers() if isinstance(layer, GradientsInFlight)]

    def bucket_plan(self):
        """``(buckets, calls)``: the :func:`refconv.collectives.buckets.plan` of this bound model's
        gradients, taken in backward order (the layers last to first), and the Call of each
        gradient's own allreduce by key."""
        if self._buckets is None:
            entries = [(key, comm, call, layer.dtype) for layer in reversed(self._gradient_layers())
                       for key, comm, call in layer.gradient_entries()]
            calls = {key: call for key, _, call, _ in entries}
            self._buckets = (buckets.plan([(key, comm, call.bytes, dtype) for key, comm, call, dtype in entries],
                                          self.bucket_bytes), calls)
        return self._buckets

    def set_overlap(self, on=True):
        """With ``on``, every layer's gradient allreduce is started in its backward and waited for
        when the gradient is read (the optimizer's step), so it runs behind the backward of the
        layers before it (:class:`refconv.layers.base.GradientsInFlight`); off, each is waited
        for at once.  The same MPI calls either way: the same gradients, bit for bit.  A
        convolution's halo exchange also runs behind the interior of its output, its halo
        return behind the own cells of backward-data and backward-filter, and Stationary-Y's
        reduce-scatter of dx behind backward-filter (``DistConv2d.overlap_halo``,
        docs/parallel.md "Overlap")."""
        self.overlap = bool(on)
        for _, layer in self.named_layers():
            if isinstance(layer, GradientsInFlight):
                layer.overlap_gradients = bool(on)
            if hasattr(layer, "overlap_halo"):
                layer.overlap_halo = bool(on)
        return self

    def finish_gradients(self):
        """Wait for every gradient allreduce still in flight."""
        for _, layer in self.named_layers():
            if isinstance(layer, GradientsInFlight):
                layer.finish_gradients()

    def records(self):
        """The calls one training step (forward, loss, backward) makes on this rank: the sum
        of every layer's ``records()`` and the loss's, as a multiset (the planner prices them;
        ``refconv.testing.check.check_records(..., ordered=False)`` checks them)."""
        calls = self.body.records() + self.head.records(self.body.layers[-1].dtype.itemsize)
        if self.bucket_bytes is None:
            return calls
        plan, own = self.bucket_plan()  # the gradients' calls are the buckets'
        return [c for c in calls if not c.grad] + buckets.bucket_calls(plan, own)

    def describe(self):
        """One line per layer: name, layer (with its grid and algorithm) and output shape."""
        lines = []
        for name, layer in zip(self.body.names, self.body.layers):
            out = layer.output_shape if self._input_shape else None
            lines.append(f"{name if name is not None else '-':>4}  {layer!r}" + (f"  -> {out}" if out else ""))
        return "\n".join(lines)
