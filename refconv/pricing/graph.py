"""A model spec as the planner sees it: a chain of stages and residual blocks, with shapes.

A **stage** is a layer that picks its grid (a ``conv``, a pooling layer, ``gap``,
or a ``batchnorm``/``relu`` that does not follow one) together with the
``batchnorm``/``relu`` layers right after it, which stay on its grid as the spec
format's default rule puts them (docs/models.md: "a BatchNorm and ReLU after a
conv stay on the conv's grid").  ``linear`` follows ``gap`` on its grid.  A
**block** is a ``residual`` with its body and shortcut chains; the ``relu`` after
a block runs on the block's exit grid (the body's last grid).

Each stage keeps its path in the spec (``("layers", 4, "layers", 0)``) so the
plan can be written back into a copy of the spec.
"""

import dataclasses

from refconv.checks import conv_output_size, conv_padding
from refconv.reference.layers import pool_geometry

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
        name = ".".join(map(str, path))
        return cls(spec["type"], spec, tuple(path), tuple(in_shape), _out_shape(spec["type"], spec, in_shape, name))


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


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _out_shape(kind, spec, shape, where):
    N, C, H, W = shape
    try:
        if kind == "conv":
            kernel, stride = _pair(spec["kernel"]), _pair(spec.get("stride", 1))
            dilation = _pair(spec.get("dilation", 1))
            padding = conv_padding(spec.get("padding", 0), kernel, stride, dilation)  # ((top, bottom), (left, right))
            hw = tuple(conv_output_size(L, k, s, p, d, "HW"[a])
                       for a, (L, k, s, p, d) in enumerate(zip((H, W), kernel, stride, padding, dilation)))
            if C % spec.get("groups", 1) or ("in" in spec and spec["in"] != C):
                raise ValueError(f"the input has {C} channels, which the conv's 'in'/'groups' do not fit")
            return (N, spec["out"]) + hw
        if kind in ("maxpool", "avgpool"):
            return (N, C) + pool_geometry(shape, spec["kernel"], spec.get("stride"), spec.get("padding", 0))[3]
        if kind == "gap":
            return (N, C, 1, 1)
        if kind == "linear":
            return (N, spec["out"], 1, 1)
        return shape
    except (ValueError, TypeError, KeyError) as exc:
        raise BindError(f"{where} ({kind}): cannot bind to input {shape}: {exc}") from None


def chain(specs, path, shape):
    """``(elements, out_shape)``: the Stages and Blocks of a list of layer specs."""
    if not isinstance(specs, list) or not specs:
        raise BindError(f"{'.'.join(map(str, path)) or 'layers'}: expected a non-empty list of layer dicts")
    out = []
    for i, spec in enumerate(specs):
        where = path + (i,)
        name = ".".join(map(str, where))
        if not isinstance(spec, dict) or "type" not in spec:
            raise BindError(f"{name}: expected a dict with a 'type', got {spec!r}")
        kind = spec["type"]
        if kind == "residual":
            body, body_out = chain(spec.get("layers"), where + ("layers",), shape)
            shortcut, short_out = (chain(spec["shortcut"], where + ("shortcut",), shape) if spec.get("shortcut")
                                   else ([], shape))
            if body_out != short_out:
                raise BindError(f"{name} (residual): the body gives {body_out} but the shortcut {short_out}")
            out.append(Block(body, shortcut, [], shape, body_out, where))
            shape = body_out
            continue
        if kind not in ("conv", "maxpool", "avgpool", "gap", "linear") + _FOLLOWERS:
            raise BindError(f"{name}: the planner does not know layer type {kind!r}")
        layer = Layer.of(spec, shape, where)
        shape = layer.out_shape
        joins = out and ((kind in _FOLLOWERS and (isinstance(out[-1], Block) or out[-1].main.kind != "gap"))
                         or (kind == "linear" and isinstance(out[-1], Stage) and out[-1].main.kind == "gap"))
        if joins:
            out[-1].followers.append(layer)
        elif kind == "linear":
            raise BindError(f"{name} (linear): the planner expects 'linear' right after 'gap'")
        else:
            out.append(Stage(layer, []))
    return out, shape


def bind(spec, input_shape):
    """The top-level chain of ``spec`` (a dict) for a global ``input_shape`` (N, C, H, W)."""
    if not isinstance(spec, dict) or "layers" not in spec:
        raise BindError("spec: expected a dict with 'layers'")
    if input_shape[1] != spec.get("in_channels", 3):
        raise BindError(f"spec.in_channels: the model takes {spec.get('in_channels', 3)} channels, "
                        f"the input has {input_shape[1]}")
    elements, _ = chain(spec["layers"], ("layers",), tuple(input_shape))
    return elements


def stages(elements):
    """Every Stage of a chain, in spec order (bodies before shortcuts)."""
    for e in elements:
        if isinstance(e, Stage):
            yield e
        else:
            yield from stages(e.body)
            yield from stages(e.shortcut)
