"""A model spec as the planner sees it: a chain of stages and residual blocks, with shapes.

A **stage** is a layer that picks its grid (a ``conv``, a pooling layer, ``gap``,
or a ``batchnorm``/``relu`` that does not follow one) together with the
``batchnorm``/``relu`` layers right after it, which stay on its grid as the spec
format's default rule puts them (docs/models.md: "a BatchNorm and ReLU after a
conv stay on the conv's grid").  ``linear`` follows ``gap`` on its grid.  A
**block** is a ``residual`` with its body and shortcut chains; the ``relu`` after
a block runs on the block's exit grid (the body's last grid).

Each stage keeps its path in the spec (``("layers", 4, "layers", 0)``) so the
plan can be written back into a copy of the spec.  The spec's structure is read once, by
:func:`refconv.spec_tree.parse` (as the model builder reads it); this module adds shapes.

A model of images (``dims: 2``) has activations ``(N, C, H, W)``; a model of volumes
(``dims: 3``) ``(N, C, D, H, W)``, its kernels, strides and paddings a ``(d, h, w)`` triple.
Global average pooling gives features ``(N, C, 1, 1)`` either way, as the layers do.
"""

import dataclasses

from refconv import spec_tree
from refconv.checks import conv_output_size, conv_padding
from refconv.reference.layers import pool_geometry
from refconv.reference.layers3d import pool3d_geometry

_FOLLOWERS = ("batchnorm", "relu")


class BindError(ValueError):
    """The planner cannot bind the model to the input shape (the message names the layer)."""


@dataclasses.dataclass
class Layer:
    kind: str
    spec: dict
    path: tuple
    in_shape: tuple
    out_shape: tuple

    @classmethod
    def of(cls, spec, in_shape, path=("layer",)):
        """The layer of ``spec`` (a model file's layer dict) on global ``in_shape``, its output
        shape derived (BindError, naming ``path``, where the input does not fit)."""
        out = _out_shape(spec["type"], spec, in_shape, spec_tree.where(path))
        return cls(spec["type"], spec, tuple(path), tuple(in_shape), out)


@dataclasses.dataclass
class Stage:
    main: Layer
    followers: list  # Layers on the same grid (batchnorm, relu; linear after gap)

    @property
    def in_shape(self):
        return self.main.in_shape

    @property
    def out_shape(self):
        return (self.followers[-1] if self.followers else self.main).out_shape

    @property
    def layers(self):
        return [self.main] + self.followers

    @property
    def name(self):
        return ".".join(str(p) for p in self.main.path if p not in ("layers",))


@dataclasses.dataclass
class Block:
    body: list  # of Stage | Block
    shortcut: list
    followers: list  # relu after the block, on its exit grid
    in_shape: tuple
    out_shape: tuple
    path: tuple

    @property
    def name(self):
        """The plan's row of the block's sum (``"4.sum"``): its path as a stage's name, then ``.sum``."""
        return ".".join(str(p) for p in self.path if p != "layers") + ".sum"


def spatial_tuple(v, dims):
    """A spec's kernel, stride or dilation (an int or one int per spatial dim) as ``dims`` ints."""
    return (v,) * dims if isinstance(v, int) else tuple(v)


POOL_GEOMETRY = {2: pool_geometry, 3: pool3d_geometry}  # spatial dims -> the serial pooling's geometry


def _out_shape(kind, spec, shape, where):
    (N, C), spatial = shape[:2], shape[2:]
    dims = len(spatial)
    try:
        if kind == "conv":
            kernel, stride = spatial_tuple(spec["kernel"], dims), spatial_tuple(spec.get("stride", 1), dims)
            dilation = spatial_tuple(spec.get("dilation", 1), dims)
            padding = conv_padding(spec.get("padding", 0), kernel, stride, dilation)  # ((low, high),) per dim
            out = tuple(conv_output_size(L, k, s, p, d, "DHW"[-dims:][a])
                        for a, (L, k, s, p, d) in enumerate(zip(spatial, kernel, stride, padding, dilation)))
            if C % spec.get("groups", 1) or ("in" in spec and spec["in"] != C):
                raise ValueError(f"the input has {C} channels, which the conv's 'in'/'groups' do not fit")
            return (N, spec["out"]) + out
        if kind in ("maxpool", "avgpool"):
            geometry = POOL_GEOMETRY[dims]
            return (N, C) + geometry(shape, spec["kernel"], spec.get("stride"), spec.get("padding", 0))[3]
        if kind == "gap":
            return (N, C, 1, 1)
        if kind == "linear":
            return (N, spec["out"], 1, 1)
        return shape
    except (ValueError, TypeError, KeyError) as exc:
        raise BindError(f"{where} ({kind}): cannot bind to input {shape}: {exc}") from None


def chain(nodes, shape):
    """``(elements, out_shape)``: the Stages and Blocks of parsed nodes (refconv.spec_tree) on
    global input ``shape``."""
    out = []
    for node in nodes:
        if node.kind == "residual":
            body, body_out = chain(node.body, shape)
            shortcut, short_out = chain(node.shortcut, shape) if node.shortcut else ([], shape)
            if body_out != short_out:
                raise BindError(f"{node.where} (residual): the body gives {body_out} but the shortcut {short_out}")
            out.append(Block(body, shortcut, [], shape, body_out, node.path))
            shape = body_out
            continue
        layer = Layer.of(node.spec, shape, node.path)
        shape = layer.out_shape
        joins = out and ((node.kind in _FOLLOWERS and (isinstance(out[-1], Block) or out[-1].main.kind != "gap"))
                         or (node.kind == "linear" and isinstance(out[-1], Stage) and out[-1].main.kind == "gap"))
        if joins:
            out[-1].followers.append(layer)
        elif node.kind == "linear":
            raise BindError(f"{node.where} (linear): the planner expects 'linear' right after 'gap'")
        else:
            out.append(Stage(layer, []))
    return out, shape


def dims_of(spec):
    """The spatial dims of a model spec's activations: 2 (images), or 3 (``dims: 3``, volumes)."""
    return spec.get("dims", 2)


def bind(spec, input_shape):
    """The top-level chain of ``spec`` (a dict) for a global ``input_shape``: ``(N, C, H, W)``, or
    ``(N, C, D, H, W)`` for a model of volumes."""
    try:
        nodes = spec_tree.parse(spec)
    except ValueError as exc:
        raise BindError(str(exc)) from None
    if len(input_shape) != dims_of(spec) + 2:
        raise BindError(f"input shape: {spec.get('name', 'the model')!r} has dims {dims_of(spec)}, so it takes "
                        f"{dims_of(spec) + 2} sizes (N, C, {', '.join('DHW'[-dims_of(spec):])}), got {input_shape}")
    if input_shape[1] != spec.get("in_channels", 3):
        raise BindError(f"spec.in_channels: the model takes {spec.get('in_channels', 3)} channels, "
                        f"the input has {input_shape[1]}")
    elements, _ = chain(nodes, tuple(input_shape))
    return elements


def stages(elements):
    """Every Stage of a chain, in spec order (bodies before shortcuts)."""
    for e in elements:
        if isinstance(e, Stage):
            yield e
        else:
            yield from stages(e.body)
            yield from stages(e.shortcut)
