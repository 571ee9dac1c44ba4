"""The one reading of a model spec's structure: a spec dict -> a tree of checked layer nodes.

Two parts of refconv walk a model spec: :func:`refconv.model_spec.build` makes the layers on
their grids, and :mod:`refconv.pricing.graph` derives every layer's shape for the planner.
Both walk the tree :func:`parse` returns and never read a spec's structure themselves, so a
spec one refuses the other refuses too, with the same message::

    spec = {"in_channels": 1, "layers": [
        {"type": "conv", "out": 8, "kernel": 3},            # Node("conv", path=("layers", 0))
        {"type": "residual", "layers": [{"type": "relu"}]},  # Node("residual", body=(Node("relu"),))
        {"type": "gap"}, {"type": "linear", "out": 10}]}

What :func:`parse` checks: the top-level keys (``dims``: 2 or 3, ``loss``: one of
:data:`LOSSES`, ``train``: a training recipe, checked by :func:`refconv.recipe.check` where it is used;
``plan``: what ``refconv plan`` predicted, a record), that ``layers`` is a non-empty list of dicts with a known ``type``,
each layer's keys (:data:`LAYER_KEYS`) and required keys (:data:`REQUIRED`), the number
of layers (:data:`MAX_LAYERS`), and the order of the three kinds of values a model passes
along (:data:`STATES`): activations, then ``gap``'s features, then ``linear``'s logits, after which nothing may follow.  What it does not
check: sizes against an input shape (the planner's ``graph.bind``, the layers' own
constructors) and grids (the builder).  The builder's shape is this module's
``layers[4].layers[0]``; errors name it.  Pure Python: no MPI, no arrays.
"""

import dataclasses

LAYER_KEYS = {
    "conv": {"out", "kernel", "stride", "padding", "padding_mode", "dilation", "groups", "bias", "in", "grid",
             "algorithm", "filter_groups"},
    "batchnorm": {"eps", "momentum", "grid"},
    "relu": {"grid"},
    "maxpool": {"kernel", "stride", "padding", "grid"},
    "avgpool": {"kernel", "stride", "padding", "grid"},
    "gap": {"grid"},
    "linear": {"out", "bias", "in", "grid"},
    "residual": {"layers", "shortcut"},
}
REQUIRED = {"conv": ("out", "kernel"), "maxpool": ("kernel",), "avgpool": ("kernel",), "linear": ("out",),
            "residual": ("layers",)}
TOP_KEYS = {"name", "in_channels", "defaults", "layers", "description", "dims", "loss", "train", "plan"}
DIMS = (2, 3)  # "dims": the model's spatial dims: images (N, C, H, W), or volumes (N, C, D, H, W)
LOSSES = ("cross-entropy", "mse")  # "loss": what the head is trained with (refconv.layers.LOSSES)
DEFAULT_KEYS = {"grid", "algorithm", "filter_groups", "machine"}
# A layer's "grid" may also name one relative to defaults.grid: "default", or "no-channel"
# (the channel axis folded into the sample axis: for a first conv with fewer input
# channels than channel ranks).
GRID_ALIASES = ("default", "no-channel")
MAX_LAYERS = 100_000   # a spec with more is a mistake or a YAML alias bomb (aliases nest: 9 levels of
                       # 9 references each expand to 387 million layers in a file of a few lines)
# What flows between layers: "activations" (N, C, H, W); "features" after gap (N, C); "logits"
# after the linear head.  Each layer type's state after it, given the state before it:
STATES = ("activations", "features", "logits")


@dataclasses.dataclass(frozen=True)
class Node:
    """One checked layer of a spec: its ``kind`` (the spec's ``type``), its dict, its ``path`` in
    the spec (``("layers", 4, "layers", 0)``, for writing a plan back), and for a residual
    block the nodes of its ``body`` and ``shortcut`` (empty: no shortcut, the identity)."""

    kind: str
    spec: dict
    path: tuple
    body: tuple = ()
    shortcut: tuple = ()

    @property
    def where(self):
        """The path as errors print it: ``layers[4].layers[0]``."""
        return where(self.path)


def where(path):
    """``("layers", 4, "layers", 0)`` -> ``"layers[4].layers[0]"``."""
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text


def parse(spec):
    """The top-level nodes of ``spec`` (a dict), checked as the module docstring says.
    Raises ValueError naming the key, identically on every rank (no communication)."""
    if not isinstance(spec, dict):
        raise ValueError(f"spec: expected a dict at the top level, got {type(spec).__name__}")
    bad = set(spec) - TOP_KEYS
    if bad:
        raise ValueError(f"spec: unknown key {sorted(bad)[0]!r}; allowed: {sorted(TOP_KEYS)}")
    if "layers" not in spec:
        raise ValueError("spec: needs 'layers', a list of layer dicts")
    if spec.get("dims", 2) not in DIMS or isinstance(spec.get("dims"), bool):
        raise ValueError(f"spec.dims: expected 2 (images) or 3 (volumes), got {spec['dims']!r}")
    if spec.get("loss", LOSSES[0]) not in LOSSES:
        raise ValueError(f"spec.loss: expected one of {LOSSES}, got {spec['loss']!r}")
    if count_layers(spec["layers"], MAX_LAYERS) > MAX_LAYERS:
        raise ValueError(f"layers: more than {MAX_LAYERS:,} layers (residual blocks' included); a model this "
                         f"deep is a mistake, e.g. YAML aliases nested into an alias bomb")
    nodes, state = parse_layers(spec["layers"], ("layers",), "activations")
    if state != "logits":
        raise ValueError("layers: the last layer must be 'linear' (the classifier head), after a 'gap'")
    return nodes


def parse_layers(specs, path, state):
    """``(nodes, state after them)`` for a list of layer dicts at ``path``, entered in ``state``."""
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{where(path)}: expected a non-empty list of layers, got {specs!r}")
    nodes = []
    for i, spec in enumerate(specs):
        node, state = _parse_layer(spec, path + (i,), state)
        nodes.append(node)
    return tuple(nodes), state


def _parse_layer(spec, path, state):
    at = where(path)
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"{at}: expected a dict with a 'type' (one of {sorted(LAYER_KEYS)}), got {spec!r}")
    kind = spec["type"]
    if kind not in LAYER_KEYS:
        raise ValueError(f"{at}.type: unknown layer type {kind!r}; expected one of {sorted(LAYER_KEYS)}")
    bad = set(spec) - LAYER_KEYS[kind] - {"type"}
    if bad:
        raise ValueError(f"{at}: unknown key {sorted(bad)[0]!r} for a {kind!r} layer; "
                         f"allowed: {sorted(LAYER_KEYS[kind])}")
    for key in REQUIRED.get(kind, ()):
        if key not in spec:
            raise ValueError(f"{at}: a {kind!r} layer needs {key!r}")
    if state == "logits":
        raise ValueError(f"{at}: nothing may follow the 'linear' classifier head (got {kind!r})")
    if state == "features" and kind not in ("linear", "relu"):
        raise ValueError(f"{at}: a {kind!r} layer cannot follow global average pooling; only 'linear' (or 'relu') can")
    if kind == "linear" and state != "features":
        raise ValueError(f"{at}: 'linear' needs features: put a 'gap' layer before it")
    if kind != "residual":
        return Node(kind, spec, path), {"gap": "features", "linear": "logits"}.get(kind, state)
    body, after = parse_layers(spec["layers"], path + ("layers",), state)
    if after != state:
        raise ValueError(f"{at}: a residual block's layers must pass activations on; put 'gap' and "
                         f"'linear' after the block, not in it")
    shortcut = parse_layers(spec["shortcut"], path + ("shortcut",), state)[0] if spec.get("shortcut") else ()
    return Node(kind, spec, path, body, shortcut), after


def count_layers(specs, limit):
    """The layers in ``specs`` (a list), residual blocks' included, counting no further than
    ``limit`` + 1: the walk is bounded however far YAML aliases would expand."""
    count, stack = 0, [specs]
    while stack and count <= limit:
        items = stack.pop()
        if not isinstance(items, list):
            continue
        for spec in items:
            count += 1
            if count > limit:
                break
            if isinstance(spec, dict):
                stack += [spec.get("layers"), spec.get("shortcut")]
    return count
