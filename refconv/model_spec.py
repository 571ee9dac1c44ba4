"""Model specifications: plain dicts (or JSON/YAML files) -> the layers of a :class:`refconv.model.Model`
(``Model.from_spec`` is the way in).

::

    {"in_channels": 1,
     "defaults": {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x"},
     "layers": [
        {"type": "conv", "out": 32, "kernel": 3, "padding": 1},
        {"type": "batchnorm"}, {"type": "relu"},
        {"type": "residual", "layers": [...], "shortcut": [...]},    # shortcut optional
        {"type": "maxpool", "kernel": 2},
        {"type": "gap"},
        {"type": "linear", "out": 10}]}

Grids: ``conv`` and ``linear`` run on their own ``"grid"`` or on ``defaults.grid``;
every other layer runs on its own ``"grid"`` if given, else on the grid its input
arrives on (so a BatchNorm/ReLU after a conv stays on the conv's grid and nothing
moves).  ``defaults.grid`` defaults to pure sample parallelism over all ranks.
``algorithm`` and ``filter_groups`` (per conv, or in defaults) matter only where
the conv's grid has ``channel > 1``; ``algorithm: auto`` prices each conv with
``defaults.machine`` (a machine file or built-in name, :mod:`refconv.pricing.machine`).
Parameterised layers take seeds ``seed,
seed + 1, ...`` in spec order.  ``"dims": 3`` at the top makes every conv, batchnorm, pooling
and gap layer its volume twin (``DistConv3d``, ``BatchNorm3d``, ``MaxPool3d``...) on inputs
``(N, C, D, H, W)``, and grids may split ``"depth"``; ``"loss": "mse"`` trains the head with
mean squared error (regression) instead of cross-entropy.  See docs/models.md.
"""

import json
import os

import numpy
import yaml
from mpi4py import MPI

from refconv import algorithms, checks, collectives, recipe, spec_tree
from refconv.grid import ProcessGrid, axes_of
from refconv.layers import (AvgPool2d, AvgPool3d, BatchNorm2d, BatchNorm3d, DistConv2d, DistConv3d, GlobalAvgPool,
                            GlobalAvgPool3d, Linear, MaxPool2d, MaxPool3d, ReLU)
from refconv.layers.container import Residual, Sequential
from refconv.spec_tree import DEFAULT_KEYS, GRID_ALIASES

# The layer class of each spec type, by the model's spatial dims ("dims"); the other types are the same for both.
CLASSES = {2: {"conv": DistConv2d, "batchnorm": BatchNorm2d, "maxpool": MaxPool2d, "avgpool": AvgPool2d,
               "gap": GlobalAvgPool},
           3: {"conv": DistConv3d, "batchnorm": BatchNorm3d, "maxpool": MaxPool3d, "avgpool": AvgPool3d,
               "gap": GlobalAvgPool3d}}
GRID_KEYS = axes_of(5)  # the axes a layer's grid dict may name: sample, channel, depth, height, width

# -- presets ---------------------------------------------------------------------------------------
def conv_layer(out, kernel, stride=1, padding=0, bias=True, groups=1):
    """A conv layer's spec, with only the keys that differ from their defaults."""
    d = {"type": "conv", "out": out, "kernel": kernel}
    if stride != 1:
        d["stride"] = stride
    if padding:
        d["padding"] = padding
    if groups != 1:
        d["groups"] = groups
    if not bias:
        d["bias"] = False
    return d


def digits_cnn(num_classes=10, in_channels=1):
    """A small wide CNN for the 16x16 digits (about 29k parameters)."""
    # The first conv has one input channel: it cannot be split over channels, so it
    # (and its BN and ReLU) run with the channel ranks folded into the sample axis.
    layers = [dict(conv_layer(32, 3, padding=1), grid="no-channel"), {"type": "batchnorm"}, {"type": "relu"},
              conv_layer(32, 3, padding=1), {"type": "batchnorm"}, {"type": "relu"}]
    layers += [{"type": "maxpool", "kernel": 2}, conv_layer(64, 3, padding=1), {"type": "batchnorm"}, {"type": "relu"},
               {"type": "gap"}, {"type": "linear", "out": num_classes}]
    return {"name": "digits-cnn", "in_channels": in_channels, "layers": layers}


RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (planes, blocks, stride)
MOBILENET_V1 = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)) + ((512, 1),) * 5 + ((1024, 2), (1024, 1))


def _stem(channels, in_channels):
    """ResNet's stem: 7x7 stride 2, max pooling stride 2.  It has 3 input channels, so it runs
    without a channel split (see digits_cnn)."""
    bn, relu = {"type": "batchnorm"}, {"type": "relu"}
    return [dict(conv_layer(channels, 7, 2, 3, bias=False), grid="no-channel"), bn, relu,
            {"type": "maxpool", "kernel": 3, "stride": 2, "padding": 1}]


def _bottlenecks(stages, inplanes, inner, groups=1):
    """ResNet's bottleneck blocks (torchvision's layout: the stride in the 3x3 conv, which has
    ``groups`` groups in ResNeXt); ``inner(planes)`` is a block's inner width."""
    bn, relu = {"type": "batchnorm"}, {"type": "relu"}
    layers = []
    for planes, blocks, stride in stages:
        for i in range(blocks):
            s = stride if i == 0 else 1
            body = [conv_layer(inner(planes), 1, bias=False), bn, relu,
                    conv_layer(inner(planes), 3, s, 1, bias=False, groups=groups), bn, relu,
                    conv_layer(planes * 4, 1, bias=False), bn]
            block = {"type": "residual", "layers": body}
            if s != 1 or inplanes != planes * 4:
                block["shortcut"] = [conv_layer(planes * 4, 1, s, bias=False), bn]
            layers += [block, relu]
            inplanes = planes * 4
    return layers


def resnet50(width=1, num_classes=1000, in_channels=3):
    """ResNet-50 (torchvision's layout: stride in the 3x3 conv); ``width`` scales the
    bottleneck's inner channels (2 gives Wide ResNet-50-2)."""
    layers = _stem(64, in_channels) + _bottlenecks(RESNET50_STAGES, 64, lambda planes: planes * width)
    layers += [{"type": "gap"}, {"type": "linear", "out": num_classes}]
    name = "resnet50" if width == 1 else f"resnet50-wide{width}"
    return {"name": name, "in_channels": in_channels, "layers": layers}


def resnext(cardinality=32, group_width=4, num_classes=1000, in_channels=3, stages=RESNET50_STAGES, stem=64):
    """ResNeXt (torchvision's ResNeXt-50 32x4d by default): ResNet's bottlenecks with a grouped
    3x3 conv of ``cardinality`` groups of ``group_width * planes / stages[0].planes`` channels.
    On a channel split, ``cardinality`` must be a multiple of ``channel``, or ``channel`` a
    multiple of ``cardinality`` with the inner widths multiples of ``channel`` (each group then
    spans ranks; docs/grouped.md); ``stages`` and ``stem`` make smaller ones."""
    first = stages[0][0]
    inner = lambda planes: cardinality * group_width * planes // first  # noqa: E731
    layers = _stem(stem, in_channels) + _bottlenecks(stages, stem, inner, groups=cardinality)
    layers += [{"type": "gap"}, {"type": "linear", "out": num_classes}]
    return {"name": f"resnext-{cardinality}x{group_width}d", "in_channels": in_channels, "layers": layers}


def mobilenet(width=1.0, num_classes=1000, in_channels=3, blocks=MOBILENET_V1, stem=32):
    """MobileNet v1: a 3x3 stride-2 stem, then depthwise-separable blocks (a depthwise 3x3 conv,
    ``groups`` = its channels, then a pointwise 1x1 conv), each with BN and ReLU; ``width``
    scales every channel count.  ``blocks`` is ``(out channels, stride)`` per block.  On a
    channel split, every block's input channels must be a multiple of ``channel``."""
    bn, relu = {"type": "batchnorm"}, {"type": "relu"}
    channels = int(stem * width)
    layers = [dict(conv_layer(channels, 3, 2, 1, bias=False), grid="no-channel"), bn, relu]
    for out, stride in blocks:
        out = int(out * width)
        layers += [conv_layer(channels, 3, stride, 1, bias=False, groups=channels), bn, relu,  # depthwise
                   conv_layer(out, 1, bias=False), bn, relu]  # pointwise
        channels = out
    layers += [{"type": "gap"}, {"type": "linear", "out": num_classes}]
    return {"name": "mobilenet" if width == 1 else f"mobilenet-{width:g}", "in_channels": in_channels,
            "layers": layers}


COSMOFLOW_STAGES = (16, 32, 64)  # filters of each conv3d + BN + ReLU stage; a 2x2x2 max pooling between stages


def cosmoflow(num_classes=4, in_channels=4, stages=COSMOFLOW_STAGES):
    """A small CosmoFlow-style 3-D CNN (Mathuriya et al., SC '18): volumes ``(N, 4, D, H, W)``
    through conv3d + batch norm + ReLU stages with 2x2x2 max pooling between them, global
    average pooling and a linear head regressing ``num_classes`` parameters of the volume,
    trained with mean squared error.  32^3 volumes leave 8^3 for the last stage."""
    bn, relu = {"type": "batchnorm"}, {"type": "relu"}
    layers = []
    for i, out in enumerate(stages):
        if i:
            layers.append({"type": "maxpool", "kernel": 2})
        layers += [conv_layer(out, 3, padding=1, bias=False), bn, relu]
    layers += [{"type": "gap"}, {"type": "linear", "out": num_classes}]
    return {"name": "cosmoflow", "dims": 3, "loss": "mse", "in_channels": in_channels, "layers": layers,
            "description": "a small CosmoFlow-style 3-D CNN regressing parameters of a volume (mean squared error)"}


PRESETS = {
    "digits-cnn": digits_cnn,
    "cosmoflow": cosmoflow,
    "resnet50": lambda **kw: resnet50(1, **kw),
    "resnet50-wide2": lambda **kw: resnet50(2, **kw),
    "resnet50-wide4": lambda **kw: resnet50(4, **kw),
    "resnext50-32x4d": resnext,
    "mobilenet": mobilenet,
}


def default_lr(model, batch_size):
    """The peak learning rate of a preset (or of a spec dict with a ``"train"`` recipe) at
    ``batch_size``, when --lr is not given: its recipe's (:mod:`refconv.recipe`), e.g. 0.1 x
    batch_size / 256 for the ImageNet presets; 0.1 for a model without one."""
    name = model if isinstance(model, str) else None
    return recipe.learning_rate(recipe.of(model if isinstance(model, dict) else {}, name), batch_size)


def load_spec(spec, **preset_kwargs):
    """A preset name, a dict, or a path to a ``.json``/``.yaml``/``.yml`` file -> a dict."""
    if isinstance(spec, dict):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ValueError(f"spec: expected a preset name {sorted(PRESETS)}, a dict or a JSON/YAML path, got {spec!r}")
    spec = os.fspath(spec)
    if spec in PRESETS:
        return PRESETS[spec](**preset_kwargs)
    if spec.endswith((".json", ".yaml", ".yml")):
        if not os.path.exists(spec):
            raise ValueError(f"spec: file {spec!r} does not exist")
        if not os.path.isfile(spec):
            raise ValueError(f"spec: {spec!r} is not a regular file (a FIFO or a folder); give a .json/.yaml file")
        with open(spec) as f:
            loaded = json.load(f) if spec.endswith(".json") else yaml.safe_load(f)
        if not isinstance(loaded, dict):
            raise ValueError(f"spec: {spec!r} holds {type(loaded).__name__ if loaded is not None else 'nothing'}, "
                             f"not a model (a mapping with 'layers'); docs/models.md")
        return loaded
    raise ValueError(f"spec: {spec!r} is neither a preset {sorted(PRESETS)} nor a .json/.yaml file")


# -- building -------------------------------------------------------------------------------------
class _Builder:
    def __init__(self, comm, backend, dtype, seed, serial, defaults, dims=2):
        self.comm, self.backend, self.dtype, self.serial = comm, backend, dtype, serial
        self.classes = CLASSES[dims]
        self.seed = seed
        self.grids = {}
        self.default_grid = self.grid(defaults.get("grid", {"sample": comm.Get_size()}), "defaults.grid")
        self.algorithm = defaults.get("algorithm", "stationary-x")
        checks.one_of(self.algorithm, "defaults.algorithm", algorithms.channel_algorithms() + ("auto",))
        self.filter_groups = defaults.get("filter_groups")
        self.machine = defaults.get("machine")  # what algorithm 'auto' prices with (refconv.pricing)

    def grid(self, spec, where):
        if self.serial:
            spec = {}
        if spec in GRID_ALIASES:
            if not hasattr(self, "default_grid"):
                raise ValueError(f"{where}: {spec!r} is relative to defaults.grid; give a dict here")
            P_N, P_c, P_D, P_H, P_W = self.default_grid.volume_shape
            spec = ({"sample": P_N, "channel": P_c, "depth": P_D, "height": P_H, "width": P_W} if spec == "default"
                    else {"sample": P_N * P_c, "depth": P_D, "height": P_H, "width": P_W})
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: expected a dict like {{'sample': 2, 'channel': 2}} or one of "
                             f"{GRID_ALIASES}, got {spec!r}")
        bad = set(spec) - set(GRID_KEYS)
        if bad:
            raise ValueError(f"{where}: unknown axis {sorted(bad)[0]!r}; axes are {GRID_KEYS}")
        shape = tuple(spec.get(a, 1) for a in GRID_KEYS)
        if shape not in self.grids:
            try:
                self.grids[shape] = ProcessGrid(self.comm, **dict(zip(GRID_KEYS, shape)))
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self.grids[shape]

    def next_seed(self):
        self.seed += 1
        return self.seed - 1

    def sequence(self, nodes, grid, channels):
        """Build parsed nodes (refconv.spec_tree); returns (layers, names, out grid, channels)."""
        layers, names = [], []
        for node in nodes:
            layer, grid, channels = self.layer(node, grid, channels)
            layers.append(layer)
            names.append(str(node.path[-1]))
        return layers, names, grid, channels

    def layer(self, node, grid, channels):
        t, spec, where = node.kind, node.spec, node.where
        common = dict(backend=self.backend, dtype=self.dtype)
        try:
            if t == "residual":
                return self.residual(node, grid, channels)
            if t in ("conv", "linear"):
                own = self.grid(spec["grid"], f"{where}.grid") if "grid" in spec else self.default_grid
            else:
                own = self.grid(spec["grid"], f"{where}.grid") if "grid" in spec else grid or self.default_grid
            if "in" in spec and spec["in"] != channels:
                raise ValueError(f"{where}.in: the input has {channels} channels, got in={spec['in']!r}")
            if t == "conv":
                algorithm = spec.get("algorithm", self.algorithm)
                checks.one_of(algorithm, f"{where}.algorithm", algorithms.channel_algorithms() + ("auto",))
                fg = spec.get("filter_groups", self.filter_groups if algorithm == "stationary-w" else None)
                if own.P_c == 1:  # no channel split: the algorithm does not apply
                    algorithm, fg = algorithms.NO_CHANNEL_SPLIT, None
                layer = self.classes["conv"](channels, spec["out"], spec["kernel"], stride=spec.get("stride", 1),
                                   padding=spec.get("padding", 0), dilation=spec.get("dilation", 1),
                                   groups=spec.get("groups", 1), bias=spec.get("bias", True),
                                   padding_mode=spec.get("padding_mode", "zeros"), grid=own,
                                   algorithm=algorithm, filter_groups=fg, seed=self.next_seed(),
                                   machine=self.machine, **common)
                return layer, own, spec["out"]
            if t == "linear":
                layer = Linear(channels, spec["out"], grid=own, bias=spec.get("bias", True),
                               seed=self.next_seed(), **common)
                return layer, own, spec["out"]
            if t == "batchnorm":
                layer = self.classes["batchnorm"](channels, grid=own, eps=spec.get("eps", 1e-5),
                                    momentum=spec.get("momentum", 0.1), **common)
            elif t == "relu":
                layer = ReLU(grid=own, **common)
            elif t in ("maxpool", "avgpool"):
                layer = self.classes[t](spec["kernel"], spec.get("stride"), spec.get("padding", 0), grid=own, **common)
            else:  # gap
                layer = self.classes["gap"](grid=own, **common)
            return layer, own, channels
        except (ValueError, TypeError) as exc:
            msg = str(exc)
            raise ValueError(msg if msg.startswith(where) else f"{where} ({t}): {msg}") from None

    def residual(self, node, grid, channels):
        grid = grid or self.default_grid
        body, _, out_grid, out_channels = self.sequence(node.body, grid, channels)
        shortcut, s_channels = None, channels
        if node.shortcut:
            shortcut, _, _, s_channels = self.sequence(node.shortcut, grid, channels)
        if s_channels != out_channels:
            raise ValueError(f"{node.where}: the body ends with {out_channels} channels but the shortcut gives "
                             f"{s_channels}; add a 'shortcut' with a 1x1 conv to {out_channels}")
        return Residual(body, shortcut, in_grid=grid), out_grid, out_channels


def build(spec, *, comm=None, backend="auto", dtype=None, seed=0, serial=False, defaults=None, **preset_kwargs):
    """``(layers, spec, in_channels)``: the :class:`Sequential` of ``spec`` (see the module
    docstring), the spec as a dict, and its input channels.

    ``defaults`` (a dict with ``grid``/``algorithm``/``filter_groups``) overrides the
    spec's; ``serial=True`` builds every layer on a 1-rank grid of ``MPI.COMM_SELF`` (on a simulated rank,
    its own one-rank communicator: ``collectives.comm_self()``).
    Raises ValueError naming the bad key or value, identically on every rank.
    """
    spec = load_spec(spec, **preset_kwargs)
    nodes = spec_tree.parse(spec)
    if "train" in spec:
        recipe.check(spec["train"], "spec.train", loss=spec.get("loss", spec_tree.LOSSES[0]))
    merged = dict(spec.get("defaults") or {})
    if not isinstance(merged, dict) or set(merged) - DEFAULT_KEYS:
        raise ValueError(f"spec.defaults: expected a dict with keys among {sorted(DEFAULT_KEYS)}, got {merged!r}")
    merged.update({k: v for k, v in (defaults or {}).items() if v is not None})
    in_channels = spec.get("in_channels", 3)
    in_channels = checks.positive_int(in_channels, "spec.in_channels")
    dtype = numpy.dtype(dtype or numpy.float32)
    comm = collectives.comm_self() if serial else (comm or MPI.COMM_WORLD)
    b = _Builder(comm, backend, dtype, seed, serial, merged, dims=spec.get("dims", 2))
    try:
        layers, names, _, _ = b.sequence(nodes, None, in_channels)
    except ValueError:          # a bad layer, alike on every rank: the grids made so far are freed alike
        for grid in b.grids.values():
            grid.close()
        raise
    return Sequential(layers, names=names), spec, in_channels
