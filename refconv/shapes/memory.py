"""Each simulated rank's live bytes of shapes-only arrays, by kind and by layer, and their peaks.

A root :class:`~refconv.shapes.array.ShapeArray` counts its bytes into the tracker of the rank that made
it (``current()``), under the kind on top of that tracker's tag stack (``with kind("comm")``); its
``__del__`` takes them off again.  Arrays that a layer keeps are re-tagged after the layer's pass
(:func:`swept`): ``activations`` after forward, ``gradients`` after backward, owned by the layer.

Kinds: ``activations`` (kept for backward), ``weights``, ``gradients``, ``optimizer``, ``comm``
(collective buffers and halo windows), ``workspace`` (the rest).  The report joins weights, gradients and
optimizer state as ``parameters``.
"""

import contextlib
import functools

from refconv.collectives import local

KINDS = ("activations", "weights", "gradients", "optimizer", "comm", "workspace")
GROUP = {"activations": "activations", "weights": "parameters", "gradients": "parameters",
         "optimizer": "parameters", "comm": "communication", "workspace": "workspace"}
GROUPS = ("activations", "parameters", "communication", "workspace")


class Tracker:
    """One rank's live bytes (see the module docstring)."""

    def __init__(self):
        self.live = dict.fromkeys(KINDS, 0)
        self.group_live = dict.fromkeys(GROUPS, 0)
        self.group_peak = dict.fromkeys(GROUPS, 0)
        self.total = 0
        self._peak = 0
        self.at_peak = dict(self.group_live)      # the split of the total at its peak
        self.tags = ["workspace"]
        self.layer_live, self.layer_peak = {}, {}
        self.names = {}                           # owner id -> layer name

    def _add(self, kind, n):
        self.live[kind] += n
        group = GROUP[kind]
        g = self.group_live[group] = self.group_live[group] + n
        if g > self.group_peak[group]:
            self.group_peak[group] = g

    def alloc(self, root):
        root.kind = kind = self.tags[-1]
        n = root.nbytes_owned
        self._add(kind, n)
        self.total += n
        if self.total > self._peak:
            self._peak = self.total
            self.at_peak = dict(self.group_live)

    def free(self, root):
        n = root.nbytes_owned
        self._add(root.kind, -n)
        self.total -= n
        if root.owner is not None:
            self.layer_live[root.owner] -= n

    def retag(self, root, kind, owner):
        """``root`` now counts as ``kind``, kept by layer ``owner`` (an id)."""
        n = root.nbytes_owned
        self._add(root.kind, -n)
        self._add(kind, n)
        root.kind = kind
        if root.owner is None and owner is not None:
            root.owner = owner
            live = self.layer_live[owner] = self.layer_live.get(owner, 0) + n
            if live > self.layer_peak.get(owner, 0):
                self.layer_peak[owner] = live

    def name_layers(self, model):
        """Name the owners by ``model.named_layers()`` ("4.body.0"); unnamed owners show as type@id."""
        self.names.update((id(layer), name) for name, layer in model.named_layers())

    # -- the report
    def peak(self):
        """The highest total of live bytes."""
        return self._peak

    def peak_by_kind(self):
        """Each of the four kinds' own highest live bytes: activations, parameters (weights, gradients and
        optimizer state), communication, workspace."""
        return dict(self.group_peak)

    def peak_by_layer(self):
        """``{layer name: the highest bytes live that the layer kept}``."""
        return {self.names.get(owner, f"layer@{owner:x}"): n for owner, n in self.layer_peak.items()}


def current():
    """The calling rank's Tracker, or None when it is not tracking."""
    return getattr(local.current(), "memory", None)


@contextlib.contextmanager
def tracking(tracker=None):
    """Install a Tracker (a new one by default) on the calling rank for the duration; yields it."""
    state = local.current()
    tracker = tracker if tracker is not None else Tracker()
    before = getattr(state, "memory", None)
    state.memory = tracker
    try:
        yield tracker
    finally:
        state.memory = before


class kind:
    """``with kind("comm"):`` or ``@kind("comm")``: arrays made meanwhile count as that kind (on a tracking rank)."""

    def __init__(self, name):
        if name not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {name!r}")
        self.name = name

    def __enter__(self):
        tracker = current()
        if tracker is not None:
            tracker.tags.append(self.name)
        self._tracker = tracker
        return tracker

    def __exit__(self, *exc):
        if self._tracker is not None:
            self._tracker.tags.pop()

    def __call__(self, func):
        name = self.name

        @functools.wraps(func)
        def tagged(*args, **kwargs):
            tracker = current()
            if tracker is None:
                return func(*args, **kwargs)
            tracker.tags.append(name)
            try:
                return func(*args, **kwargs)
            finally:
                tracker.tags.pop()
        return tagged


def claim(array, kind_name, layer):
    """Count ``array``'s root as ``kind_name``, kept by ``layer`` (on a tracking rank; else nothing)."""
    tracker = current()
    root = getattr(array, "root", None)
    if tracker is not None and getattr(array, "shapes_only", False) and root.tracker is tracker:
        tracker.retag(root, kind_name, id(layer))


KEPT = {"forward": "activations", "backward": "gradients"}
_LOOSE = ("workspace", "comm")


def swept(layer, phase):
    """After ``layer``'s ``phase`` ("forward"/"backward"): the roots it keeps (its attributes and its
    algorithm's, one level, tuples and lists too) that still count as workspace or comm become its
    activations (forward) or gradients (backward)."""
    tracker = current()
    if tracker is None:
        return
    kept, owner = KEPT[phase], id(layer)
    if phase == "forward" and hasattr(layer, "parameters"):    # the weights and running statistics first
        state = list(layer.parameters().values()) + list(layer.buffers().values())
        for v in state:
            root = getattr(v, "root", None)
            if getattr(v, "shapes_only", False) and root.tracker is tracker and \
                    (root.kind in _LOOSE or root.owner is None):       # made as weights: now owned by the layer
                tracker.retag(root, "weights", owner)
    for holder in (layer, getattr(layer, "_algo", None)):
        if holder is None or not hasattr(holder, "__dict__"):
            continue
        for value in vars(holder).values():
            for v in (value if isinstance(value, (tuple, list)) else (value,)):
                root = getattr(v, "root", None)
                if getattr(v, "shapes_only", False) and root.tracker is tracker and root.kind in _LOOSE:
                    tracker.retag(root, kept, owner)


def sweep_parameters(layers, kind_name="gradients"):
    """Re-tag the gradients (and any other root still loose) the layers hold as ``kind_name``."""
    tracker = current()
    if tracker is None:
        return
    for layer in layers:
        for holder in (layer, getattr(layer, "_algo", None)):
            for value in (vars(holder).values() if hasattr(holder, "__dict__") else ()):
                root = getattr(value, "root", None)
                if getattr(value, "shapes_only", False) and root.tracker is tracker and root.kind in _LOOSE \
                        and value is not None:
                    tracker.retag(root, kind_name, id(layer))
