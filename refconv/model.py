"""A CNN as a sequence of distributed layers, each with its own parallel strategy.

A :class:`Model` is a :class:`Sequential` of layers (and :class:`Residual` blocks)
followed by a :class:`refconv.layers.SoftmaxCrossEntropy` head.  Each layer sits on
its own :class:`refconv.grid.ProcessGrid` (all over one communicator); where two
consecutive layers' grids differ, a :class:`refconv.layers.Redistribute` is put
between them (ALGORITHMS.md section 5).

Built from Python::

    g = ProcessGrid(comm, sample=2, channel=2)
    model = Model([DistConv2d(1, 8, 3, padding=1, grid=g), ReLU(grid=g),
                   GlobalAvgPool(grid=g), Linear(8, 10, grid=g)])

or from a spec (a dict, or a JSON/YAML file; see docs/models.md and
:mod:`refconv.model_spec`)::

    model = Model.from_spec("digits-cnn", comm=comm)

``model.named_parameters()`` lists ``(qualified_name, layer, param_name)`` in a
fixed order (what :class:`refconv.optim.SGD` and :mod:`refconv.checkpoint` take).
"""

from refconv.layers import Redistribute, SoftmaxCrossEntropy
from refconv.reference import _checks


def _in_grid(node):
    return node.in_grid if isinstance(node, (Sequential, Residual)) else node.grid


def _out_grid(node):
    return node.out_grid if isinstance(node, (Sequential, Residual)) else node.grid


def _kind_out(node, kind_in):
    if isinstance(node, Sequential):
        for layer in node.layers:
            kind_in = _kind_out(layer, kind_in)
        return kind_in
    if isinstance(node, Residual):
        return kind_in
    return getattr(node, "kind_out", "activations")


def _output_shape(layer):
    """Global output shape (DistConv2d has only its output distribution)."""
    if hasattr(layer, "output_shape"):
        return layer.output_shape
    return layer.output_distribution.global_shape


def _buffers(layer):
    return layer.buffers() if hasattr(layer, "buffers") else {}


class Sequential:
    """Layers run one after the other; a Redistribute is inserted wherever the grid changes.

    ``start_grid``/``end_grid`` (optional) add a Redistribute before the first layer or
    after the last when the tensor arrives on, or must leave on, another grid.
    """

    def __init__(self, layers, *, start_grid=None, end_grid=None, names=None, kind="activations"):
        layers = list(layers)
        names = list(names) if names is not None else [str(i) for i in range(len(layers))]
        self.layers, self.names = [], []
        grid = start_grid
        for name, layer in zip(names, layers):
            if grid is not None and grid.shape != _in_grid(layer).shape:
                self.layers.append(Redistribute(grid, _in_grid(layer), kind))
                self.names.append(None)  # a Redistribute has no parameters and no name
            self.layers.append(layer)
            self.names.append(name)
            grid, kind = _out_grid(layer), _kind_out(layer, kind)
        if end_grid is not None and grid is not None and grid.shape != end_grid.shape:
            self.layers.append(Redistribute(grid, end_grid, kind))
            self.names.append(None)
            grid = end_grid
        self.in_grid = start_grid if start_grid is not None else (_in_grid(layers[0]) if layers else None)
        self.out_grid = grid

    def bind(self, input_shape):
        shape = _checks.shape4(input_shape, "input_shape")
        self._input_shape = shape
        for name, layer in zip(self.names, self.layers):
            try:
                layer.bind(shape)
            except ValueError as exc:
                raise ValueError(f"layer {name}: {exc}") from None
            shape = _output_shape(layer)
        self._output_shape = shape
        return self

    @property
    def output_shape(self):
        return self._output_shape

    @property
    def input_distribution(self):
        return self.layers[0].input_distribution

    @property
    def output_distribution(self):
        return self.layers[-1].output_distribution

    def forward(self, x_loc):
        for layer in self.layers:
            x_loc = layer.forward(x_loc)
        return x_loc

    def backward(self, dy_loc):
        for layer in reversed(self.layers):
            dy_loc = layer.backward(dy_loc)
        return dy_loc

    def set_training(self, training):
        for layer in self.layers:
            if isinstance(layer, (Sequential, Residual)):
                layer.set_training(training)
            else:
                layer.training = training

    def named_layers(self, prefix=""):
        """``(qualified_name, layer)`` of every leaf layer (Redistributes excluded), in order."""
        for name, layer in zip(self.names, self.layers):
            if name is None:
                continue
            if isinstance(layer, (Sequential, Residual)):
                yield from layer.named_layers(f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", layer

    def __len__(self):
        return len(self.layers)


class Residual:
    """``y = body(x) + shortcut(x)``; ``shortcut`` is the identity unless given (a projection).

    forward: both paths, then a local add · backward: ``dx = body'(dy) + shortcut'(dy)``

    The sum is laid out on the body's last grid; the shortcut gets Redistributes at
    either end if it starts or ends on another grid.
    """

    def __init__(self, body, shortcut=None, *, in_grid=None, kind="activations"):
        body_layers = list(body)
        self.in_grid = in_grid if in_grid is not None else _in_grid(body_layers[0])
        self.body = Sequential(body_layers, start_grid=self.in_grid, names=[str(i) for i in range(len(body_layers))],
                               kind=kind)
        self.out_grid = self.body.out_grid
        shortcut = list(shortcut or [])
        self.shortcut = Sequential(shortcut, start_grid=self.in_grid, end_grid=self.out_grid, kind=kind)
        self.grid = self.out_grid

    def bind(self, input_shape):
        self.body.bind(input_shape)
        try:
            self.shortcut.bind(input_shape)
        except ValueError as exc:
            raise ValueError(f"shortcut: {exc}") from None
        out_b = self.body.output_shape
        out_s = self.shortcut.output_shape
        if out_b != out_s:
            raise ValueError(f"residual: the body gives {out_b} but the shortcut gives {out_s}; "
                             f"add a projection shortcut (a 1x1 conv with the body's stride and channels)")
        self._output_shape = out_b
        return self

    @property
    def output_shape(self):
        return self._output_shape

    @property
    def input_distribution(self):
        return self.body.input_distribution

    @property
    def output_distribution(self):
        return self.body.output_distribution

    def forward(self, x_loc):
        y = self.body.forward(x_loc)
        return y + self.shortcut.forward(x_loc)

    def backward(self, dy_loc):
        return self.body.backward(dy_loc) + self.shortcut.backward(dy_loc)

    def set_training(self, training):
        self.body.set_training(training)
        self.shortcut.set_training(training)

    def named_layers(self, prefix=""):
        yield from self.body.named_layers(f"{prefix}body.")
        yield from self.shortcut.named_layers(f"{prefix}shortcut.")


class Model:
    """Layers (a list, or a :class:`Sequential`) and a softmax cross-entropy head.

    ``bind((N, C, H, W))``, ``forward(x_loc) -> logits_loc (n, K)``,
    ``loss(logits_loc, labels_loc) -> float`` (the global mean), ``backward()`` (from
    the last loss), ``named_parameters()``, ``named_buffers()``, ``train()``, ``eval()``.
    """

    def __init__(self, layers, *, names=None):
        self.body = layers if isinstance(layers, Sequential) else Sequential(layers, names=names)
        if not self.body.layers:
            raise ValueError("layers: a model needs at least one layer")
        self.in_grid, self.out_grid = self.body.in_grid, self.body.out_grid
        last = self.body.layers[-1]
        self.head = SoftmaxCrossEntropy(grid=self.out_grid, backend=getattr(last, "backend", "numpy"))
        self.spec = None
        self._input_shape = None

    @classmethod
    def from_spec(cls, spec, *, comm=None, backend="auto", dtype=None, seed=0, serial=False, defaults=None,
                  **preset_kwargs):
        """Build from a preset name, a dict, or a ``.json``/``.yaml`` path (see :mod:`refconv.model_spec`).

        ``serial=True`` builds the same model on one rank (``MPI.COMM_SELF``, every
        grid 1x1x1x1): the serial run the distributed one must reproduce.  ``defaults``
        (``grid``, ``algorithm``, ``filter_groups``) override the spec's defaults;
        ``preset_kwargs`` (``num_classes``, ``in_channels``) go to a preset.
        """
        from refconv.model_spec import build

        return build(spec, comm=comm, backend=backend, dtype=dtype, seed=seed, serial=serial, defaults=defaults,
                     **preset_kwargs)

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
        return [(f"{q}.{b}", layer, b) for q, layer in self.body.named_layers() for b in _buffers(layer)]

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
        shape = _checks.shape4(input_shape, "input_shape")
        if shape != self._input_shape:
            self.body.bind(shape)
            self._input_shape = shape
        return self

    @property
    def input_shape(self):
        return self._input_shape

    @property
    def input_distribution(self):
        """How ``x`` must be given: the first layer's input distribution."""
        return self.body.input_distribution

    @property
    def output_distribution(self):
        return self.body.output_distribution

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
        return self.body.backward(self.head.backward())

    def describe(self):
        """One line per layer: name, layer (with its grid and algorithm) and output shape."""
        lines = []
        for name, layer in zip(self.body.names, self.body.layers):
            out = getattr(layer, "output_shape", None) if self._input_shape else None
            lines.append(f"{name if name is not None else '-':>4}  {layer!r}" + (f"  -> {out}" if out else ""))
        return "\n".join(lines)
