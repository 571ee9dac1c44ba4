"""Containers of layers: a :class:`Sequential` chain and a :class:`Residual` block.

Each layer sits on its own :class:`refconv.grid.ProcessGrid` (all over one
communicator); where two consecutive layers' grids differ, a
:class:`refconv.layers.Redistribute` is put between them (docs/algorithms.md
section 5).
"""

import numpy

from refconv import checks, collectives
from refconv.grid import close_grids
from refconv.shapes import memory
from refconv.layers.shuffle import Redistribute


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


def first_layer(node):
    """The layer that ``node`` (a layer, or a :class:`Sequential` or :class:`Residual` of them)
    hands its input to first: itself, or its first leaf (a Redistribute ahead of it skipped).  Its
    backend, dtype and dims are those of what ``node`` takes in, wherever ``node`` stands (first in
    a model too: a residual block's body's first layer)."""
    if isinstance(node, (Sequential, Residual)):
        return next(layer for _, layer in node.named_layers())
    return node


def _dtype(node):
    """The dtype of what a layer (or the first leaf of a container) takes in."""
    return first_layer(node).dtype


def entry_name(names, at):
    """How an error names entry ``at`` of a chain whose layers are called ``names``: ``layer <name>``,
    or for a Redistribute (named ``None``) the layer it leads to."""
    if names[at] is not None:
        return f"layer {names[at]}"
    following = next((n for n in names[at + 1:] if n is not None), None)
    return (f"the redistribution before layer {following}" if following is not None
            else "the redistribution at the end of the block")


class Sequential:
    """Layers run one after the other; a Redistribute is inserted wherever the grid changes.

    ``start_grid``/``end_grid`` (optional) add a Redistribute before the first layer or
    after the last when the tensor arrives on, or must leave on, another grid; ``dtype``
    is what such a Redistribute moves when there is no layer (an identity shortcut).
    ``close()`` (or ``with``) frees the sub-communicators of the grids its layers sit on.
    """

    def __init__(self, layers, *, start_grid=None, end_grid=None, names=None, kind="activations",
                 dtype=numpy.float32):
        layers = list(layers)
        names = list(names) if names is not None else [str(i) for i in range(len(layers))]
        self.layers, self.names = [], []
        grid = start_grid
        for name, layer in zip(names, layers):
            if grid is not None and grid.shape != _in_grid(layer).shape:
                self.layers.append(Redistribute(grid, _in_grid(layer), kind, _dtype(layer)))
                self.names.append(None)  # a Redistribute has no parameters and no name
            self.layers.append(layer)
            self.names.append(name)
            grid, kind = _out_grid(layer), _kind_out(layer, kind)
        if end_grid is not None and grid is not None and grid.shape != end_grid.shape:  # dtype: of an empty chain
            self.layers.append(Redistribute(grid, end_grid, kind, _dtype(self.layers[-1]) if self.layers else dtype))
            self.names.append(None)
            grid = end_grid
        self.in_grid = start_grid if start_grid is not None else (_in_grid(layers[0]) if layers else None)
        self.out_grid = grid

    def bind(self, input_shape):
        shape = checks.activation_shape(input_shape, "input_shape")
        self._input_shape = shape
        for at, (name, layer) in enumerate(zip(self.names, self.layers)):
            try:
                layer.bind(shape)
            except ValueError as exc:
                raise ValueError(f"{entry_name(self.names, at)}: {exc}") from None
            shape = layer.output_shape
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
            y_loc = layer.forward(x_loc)
            collectives.priced("layer", layer, x_loc.size, y_loc.size, "forward")  # a priced simulated run's clock
            memory.swept(layer, "forward")     # what it keeps for backward counts as its activations
            x_loc = y_loc
        return x_loc

    def backward(self, dy_loc):
        for layer in reversed(self.layers):
            dx_loc = layer.backward(dy_loc)
            collectives.priced("layer", layer, dx_loc.size, dy_loc.size, "backward")
            memory.swept(layer, "backward")
            dy_loc = dx_loc
            collectives.progress()  # test the calls in flight (a layer's gradient allreduce), so MPI moves them on
        return dy_loc

    def records(self):
        """Every layer's records (Redistributes included), in order: what one forward and
        backward of the chain make on this rank, as a multiset (backward runs in reverse)."""
        return [call for layer in self.layers for call in layer.records()]

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

    def close(self):
        """Free the sub-communicators of every grid the layers sit on (collective; safe twice)."""
        close_grids(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Wrapper:
    """Something built around a :class:`Sequential` ``body``: it is laid out, and shaped at
    its output, as its body."""

    @property
    def output_shape(self):
        return self.body.output_shape

    @property
    def input_distribution(self):
        return self.body.input_distribution

    @property
    def output_distribution(self):
        return self.body.output_distribution


class Residual(Wrapper):
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
        self.shortcut = Sequential(shortcut, start_grid=self.in_grid, end_grid=self.out_grid, kind=kind,
                                   dtype=_dtype(self.body))
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
        return self

    def forward(self, x_loc):
        y = self.body.forward(x_loc)
        return y + self.shortcut.forward(x_loc)

    def backward(self, dy_loc):
        return self.body.backward(dy_loc) + self.shortcut.backward(dy_loc)

    def records(self):
        return self.body.records() + self.shortcut.records()

    def set_training(self, training):
        self.body.set_training(training)
        self.shortcut.set_training(training)

    def named_layers(self, prefix=""):
        yield from self.body.named_layers(f"{prefix}body.")
        yield from self.shortcut.named_layers(f"{prefix}shortcut.")
