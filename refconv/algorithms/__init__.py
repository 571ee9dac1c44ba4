"""The parallel algorithms of a convolution layer, one module each.

Every algorithm is a class (a subclass of :class:`base.Algorithm`) with

- ``name``: what ``DistConv2d(algorithm=...)`` and model files call it;
- ``weight_dims(P_c, filter_groups, groups)``: how the weight is laid out on the grid;
- ``resolve_filter_groups(P_c, filter_groups, groups)``: the ``p_f`` it runs with (None but for W);
- ``records(geom, grid_shape, coords, filter_groups)``: every call one forward and
  backward makes on the rank at ``coords``, in order, with the bytes
  :data:`refconv.collectives.stats` records.  :mod:`refconv.cost_model` prices these
  and the volume tests compare them with the measurement;
- bound to a grid, ``forward(x_loc, w_loc, b_loc) -> y_loc`` and
  ``backward(dy_loc, w_loc) -> (dx_loc, dw_loc, db_loc)``, every collective written
  out in the algorithm's own module.

:data:`REGISTRY` is the one list of them.  A new algorithm is one new module and one
line here (or :func:`register` from outside the package, as the worked example in
docs/testing.md does).  ``"sample-spatial"`` runs every layer whose grid has no
channel split (``P_c = 1``), whatever algorithm was asked for, and ``"grouped"``
every grouped layer (``groups > 1``) on a channel split whose ranks hold whole
groups (no channel collective); ``"grouped-x"`` and ``"grouped-y"`` run X and Y
within each group's ranks where a group spans several, and ``"stationary-w"`` runs
W there itself (docs/grouped.md).
"""

from refconv.algorithms.base import ALPHA, BETA, Algorithm, Call, ConvGeometry
from refconv.algorithms.grouped import GroupedChannels, GroupSpanX, GroupSpanY, grouped_class, grouped_classes
from refconv.algorithms.spatial import SampleSpatial
from refconv.algorithms.stationary_w import StationaryW
from refconv.algorithms.stationary_x import StationaryX
from refconv.algorithms.stationary_y import StationaryY

REGISTRY = {cls.name: cls for cls in (SampleSpatial, StationaryX, StationaryY, StationaryW, GroupedChannels,
                                      GroupSpanX, GroupSpanY)}
NO_CHANNEL_SPLIT = SampleSpatial.name
CHOSEN_ONLY = (NO_CHANNEL_SPLIT, GroupedChannels.name, GroupSpanX.name, GroupSpanY.name)  # run, never asked for


def register(cls):
    """Add an :class:`Algorithm` subclass under ``cls.name`` (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)) or not cls.name:
        raise ValueError(f"register: expected an Algorithm subclass with a name, got {cls!r}")
    REGISTRY[cls.name] = cls
    return cls


def asked_as(name):
    """The name a layer or a model file asks for to run algorithm ``name``: ``name`` itself,
    or for a class that only runs when chosen (:data:`CHOSEN_ONLY`), the one that resolves
    to it ("grouped-y" is asked for as "stationary-y")."""
    return REGISTRY[name].asked_as or name


def channel_algorithms():
    """The names a layer with a channel split may ask for."""
    return tuple(name for name in REGISTRY if name not in CHOSEN_ONLY)


def resolve(name, P_c, filter_groups=None, groups=1, channels=None):
    """``(cls, filter_groups)``: the class that runs ``name`` on a channel group of ``P_c``
    ranks for a layer of ``groups`` groups and ``channels = (C, F)``, and the ``p_f`` it
    runs with (validated by the algorithm asked for; None but for Stationary-W, whose ``p_f``
    divides ``P_c/groups`` when a group spans ranks: :mod:`.grouped`)."""
    if name not in channel_algorithms() and not (name == NO_CHANNEL_SPLIT and P_c == 1):
        raise ValueError(f"algorithm: expected one of {channel_algorithms() + ('auto',)}, got {name!r}")
    spanned = groups if 1 < groups < P_c and P_c % groups == 0 else 1  # W then factors a group's ranks
    resolved = REGISTRY[name].resolve_filter_groups(P_c, filter_groups, spanned)
    if P_c == 1:
        return REGISTRY[NO_CHANNEL_SPLIT], resolved
    if groups > 1:
        return grouped_class(name, P_c, groups, channels, filter_groups)
    return REGISTRY[name], resolved


def records(name, geom, grid_shape, coords=(0, 0, 0, 0), filter_groups=None):
    """The calls of one forward and backward of algorithm ``name`` (see the module docstring):
    a name a layer asks for, or one that ``refconv.pricing.choose_for_layer`` returns (``grouped``,
    ``grouped-x``...)."""
    if name in CHOSEN_ONLY and grid_shape[1] > 1:  # already the class that runs: no resolving
        return REGISTRY[name].records(geom, tuple(grid_shape), tuple(coords), filter_groups)
    cls, filter_groups = resolve(name, grid_shape[1], filter_groups, geom.groups, (geom.C, geom.F))
    return cls.records(geom, tuple(grid_shape), tuple(coords), filter_groups)


def layer_records(algorithm, in_shape, out_channels, kernel, *, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                  groups=1, grid_shape=(1, 1, 1, 1), coords=(0, 0, 0, 0), filter_groups=None, bias=True, itemsize=4,
                  padding_mode="zeros"):
    """The calls one forward + backward of ``DistConv2d`` makes on the rank at ``coords``.

    ``algorithm`` as the layer takes it; with ``P_c = 1`` it is sample/spatial whatever
    its name.  Sizes are global; the rank's blocks follow ``numpy.array_split``.
    """
    geom = ConvGeometry.of(in_shape, (out_channels, in_shape[1] // groups) + tuple(kernel), stride=stride,
                           padding=padding, dilation=dilation, groups=groups, bias=bias, itemsize=itemsize,
                           padding_mode=padding_mode)
    return records(algorithm, geom, grid_shape, coords, filter_groups)


def candidates(P_c, groups=1, channels=None):
    """``(algorithm, filter_groups)`` pairs worth pricing on a channel group of ``P_c``.

    For a grouped layer on a channel split (``groups > 1``, ``channels = (C, F)``) these are the classes that
    run it (:func:`.grouped.grouped_classes`: "grouped", or X, Y and W within each group);
    :func:`asked_as` gives the name a layer or model file asks for each by.  Raises the
    ValueError of :func:`.grouped.grouped_class` where no class runs the layer."""
    if groups > 1 and P_c > 1:
        return [(cls.name, p_f) for cls, p_f in grouped_classes(P_c, groups, channels)]
    out = []
    for name in channel_algorithms():
        if name == "stationary-w":  # p_f = 1 is X and p_f = P_c is Y
            out += [(name, p_f) for p_f in range(2, P_c) if P_c % p_f == 0]
        else:
            out.append((name, None))
    return out


__all__ = ["Algorithm", "Call", "ConvGeometry", "REGISTRY", "CHOSEN_ONLY", "register", "channel_algorithms", "resolve",
           "records", "layer_records", "candidates", "asked_as", "grouped_class", "ALPHA", "BETA"]
