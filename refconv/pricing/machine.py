"""A machine file: what one collective and one local kernel cost on a machine.

A machine file is YAML (see docs/planning.md and the files in
``refconv/pricing/machines/``)::

    name: v100-edr
    measured: false                 # or the UTC date of the calibration run
    ranks_per_node: 4
    latency: log                    # optional: ring (default) or log steps, see ring_steps
    collectives:
      intra:                        # every rank of the communicator on one node
        allreduce: {alpha: 5.0e-6, beta: 7.7e-12}      # per ring step, per byte on a link
        ...
      inter:                        # the communicator spans nodes
        allreduce: {table: {2: [alpha, beta], 4: [alpha, beta]}}   # measured per size q
    compute:
      conv_fwd: {1x1: {t0: 1.0e-5, rate: 1.0e13}, kxk: {t0: 1.0e-5, rate: 1.2e13, bw: 5.0e11}}
                                    # optional third class kxkxk: a 3-D KxKxK kernel (else priced by kxk)
      conv_bwd_data: ...
      conv_bwd_filter: ...
      batchnorm: {t0: 1.0e-5, rate: 4.0e11}            # bytes of the local input per second
      pool: ...; elementwise: ...; pack: ...
      layer: {t0: 2.0e-5, rate: 4.0e11}                # per layer, besides its kernels
      conv_table:                   # optional: measured local convolutions (refconv calibrate --model)
        - {shape: [n, C, F, H_win, W_win, Kh, Kw, sh, sw, dh, dw, groups],
           conv_fwd: s, conv_bwd_data: s, conv_bwd_filter: s}
        - {shape: [n, C, F, D_win, H_win, W_win, Kd, Kh, Kw, sd, sh, sw, dd, dh, dw, groups], ...}   # a volume

A collective of kind ``k`` over ``q`` ranks moving the buffer ``m`` (what
:class:`refconv.cost_model.Call` records) costs ``steps_k(q) * alpha + factor_k(q) *
m * beta`` with the ring schedule of docs/algorithms.md section 4:

==================  ==============  ================
kind                steps(q)        factor(q)
==================  ==============  ================
allreduce           2 (q - 1)       2 (q - 1) / q
allgather           q - 1           (q - 1) / q
reduce_scatter      q - 1           (q - 1) / q
alltoallv           messages        1 (m = bytes this rank sends)
halo                messages        1 (m = bytes this rank sends)
==================  ==============  ================

A ``table`` entry (a measured machine) gives the fitted ``alpha(q), beta(q)`` of
``time = alpha(q) + beta(q) * m`` at the sizes measured (for ``halo`` and
``alltoallv``: alpha per message); another size is priced from the nearest
measured one scaled by the ring schedule.  A local kernel costs
``t0 + work / rate`` (work: FLOPs for convolutions, bytes of the local input for
the bandwidth-bound layers), and for a convolution class with ``bw`` also
``columns / bw`` (the bytes of its im2col columns).  A 3-D convolution pass is the same GEMM, ``F x (C/groups
Kd Kh Kw) x (n D' H' W')`` on its im2col columns, priced on its FLOPs and columns by the class
``kxkxk`` where the file has it (optional; ``refconv calibrate`` measures it, as a 3x3x3 pass
measured 1.3-2.9x slower than a 2-D pass of the same FLOPs and columns: docs/planning.md),
else by ``kxk``; a 1x1x1 kernel by ``1x1``.  Its measured shapes key the table as 16 ints.
``layer`` is what every layer costs besides its
kernels (the framework's per-call overhead, argument checks, the window copy and
bias), per byte of its local input and output.

``conv_table`` (optional) holds measured seconds of local convolutions, keyed by
the local problem (:class:`ConvShape`: the halo-extended window a rank convolves
with ``padding=0``, as ``refconv.algorithms.base.Algorithm.conv`` runs it), each
timed with every rank of the calibration running it at once.  A convolution whose
shape is in the table is priced from it, any other from the class fit: the
paper's model timed cuDNN per local shape the same way.
"""

import dataclasses
import math
import os
import warnings

import yaml

from refconv import collectives
from refconv.algorithms.base import Call

KINDS = collectives.KINDS[:5]  # what a machine file prices: the kinds training moves data with
COMPUTE = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "batchnorm", "pool", "elementwise", "pack", "layer")
CONV_CLASSES = ("1x1", "kxk")
VOLUME_CLASS = "kxkxk"  # optional: a KxKxK kernel's 3-D passes; a file without it prices them by "kxk"
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")
MACHINES_DIR = os.path.join(os.path.dirname(__file__), "machines")
DEFAULT_MACHINE = "v100-edr"


class MachineError(ValueError):
    """A missing or malformed machine file (the message names the file and the key)."""


def ring_steps(kind, q, messages=0, schedule="ring"):
    """Latency steps of one call: the ring's ``q - 1`` (twice for allreduce), or with
    ``schedule="log"`` recursive doubling/halving's ``ceil(log2 q)`` (twice for
    allreduce: Rabenseifner's reduce-scatter + allgather, as MPICH and Open MPI pick
    for large communicators; Thakur, Rabenseifner and Gropp, IJHPCA 2005)."""
    if kind in ("halo", "alltoallv"):
        return messages
    if schedule == "ring":
        return Call(kind, q, 1).steps
    return (2 if kind == "allreduce" else 1) * math.ceil(math.log2(q))


def ring_factor(kind, q):
    """Bytes on the wire per byte of the buffer: ``Call.wire_bytes``'s ring factor (1 point to point)."""
    if kind in ("halo", "alltoallv"):
        return 1.0
    return Call(kind, q, 1).wire_bytes


@dataclasses.dataclass(frozen=True)
class Link:
    """Per-kind pricing: ring constants, or a table ``{q: (alpha(q), beta(q))}`` measured.

    For ``halo`` and ``alltoallv`` (point-to-point messages) alpha is per message and
    beta per byte sent, at any ``q``; ``messages`` is the number of peers.
    """

    alpha: float = 0.0
    beta: float = 0.0
    table: tuple = ()  # ((q, alpha, beta), ...) sorted by q
    schedule: str = "ring"  # or "log": see ring_steps

    def seconds(self, kind, q, nbytes, messages=0):
        if q <= 1:
            return 0.0
        if not self.table:
            return ring_steps(kind, q, messages, self.schedule) * self.alpha + ring_factor(kind, q) * nbytes * self.beta
        q0, a0, b0 = min(self.table, key=lambda row: (abs(math.log(row[0] / q)), row[0]))
        if kind in ("halo", "alltoallv"):
            return messages * a0 + nbytes * b0
        a = a0 / ring_steps(kind, q0, 0, self.schedule) * ring_steps(kind, q, 0, self.schedule)
        b = b0 / ring_factor(kind, q0) * ring_factor(kind, q)
        return a + b * nbytes


@dataclasses.dataclass(frozen=True)
class Rate:
    """``t0 + work / rate``, plus ``columns / bw`` for a convolution that gives ``bw``
    (bytes per second of its im2col columns, ``pixels x C_local x Kh x Kw``: a narrow
    convolution is bound by moving those, not by its FLOPs)."""

    t0: float
    rate: float
    bw: float = math.inf

    def seconds(self, work, columns=0):
        return self.t0 + work / self.rate + columns / self.bw if work > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class ConvShape:
    """One rank's local convolution: ``x_win (n, C, *window)`` with ``w_loc (F, C / groups, *kernel)``,
    ``padding=0`` (the window already holds the halo and the padding).  ``window`` is
    ``(H_win, W_win)`` and ``kernel`` ``(Kh, Kw)`` for an image; ``(D_win, H_win, W_win)`` and
    ``(Kd, Kh, Kw)`` for a volume, whose passes are the backend's ``conv3d_*``.  ``stride`` and
    ``dilation`` default to ones."""

    n: int
    C: int
    F: int
    window: tuple
    kernel: tuple
    stride: tuple = None
    dilation: tuple = None
    groups: int = 1

    def __post_init__(self):
        for name in ("window", "kernel", "stride", "dilation"):
            value = getattr(self, name)
            object.__setattr__(self, name, (1,) * len(self.kernel) if value is None else tuple(value))

    @property
    def dims(self):
        """Spatial dims: 2, or 3 for a volume."""
        return len(self.kernel)

    def as_list(self):
        """The ``shape`` of a ``conv_table`` entry: ``[n, C, F, *window, *kernel, *stride, *dilation, groups]``,
        12 ints for an image (``[n, C, F, H_win, W_win, Kh, Kw, sh, sw, dh, dw, groups]``), 16 for a volume."""
        return [self.n, self.C, self.F, *self.window, *self.kernel, *self.stride, *self.dilation, self.groups]

    @classmethod
    def of_list(cls, v):
        d = (len(v) - 4) // 4  # spatial dims: 12 ints for 2, 16 for 3
        window, kernel, stride, dilation = (tuple(v[3 + i * d:3 + (i + 1) * d]) for i in range(4))
        return cls(v[0], v[1], v[2], window, kernel, stride, dilation, v[-1])


@dataclasses.dataclass(frozen=True)
class Machine:
    name: str
    measured: object  # False, or the date of the calibration run
    ranks_per_node: int
    links: dict  # {"intra"|"inter": {kind: Link}}
    compute: dict  # {"conv_fwd": {"1x1": Rate, "kxk": Rate[, "kxkxk": Rate]}, "batchnorm": Rate, ...}
    path: str = None
    conv_table: dict = dataclasses.field(default_factory=dict)  # {(op, ConvShape): seconds}, measured
    overlap: float = 1.0  # the share of a gradient allreduce this machine hides behind compute (calibrate)

    def comm_seconds(self, kind, q, nbytes, messages=0, *, intra=True):
        return self.links["intra" if intra else "inter"][kind].seconds(kind, q, nbytes, messages)

    def call_seconds(self, kind, q, nbytes, messages=0, *, intra=True):
        """Seconds of one recorded call (a :class:`refconv.collectives.Record`'s figures): the link's
        time, and for a halo exchange the packing and unpacking of its strided pieces."""
        t = self.comm_seconds(kind, q, nbytes, messages, intra=intra)
        if kind == "halo" and nbytes:
            t += 2 * self.local_seconds("pack", nbytes)
        return t

    def conv_seconds(self, op, kernel_area, flops, columns=0, shape=None, dims=2):
        """Seconds of one local convolution pass: the table's where it has ``shape`` (a
        :class:`ConvShape`), else the class fit on its FLOPs and im2col ``columns``: ``1x1``
        for a kernel of one tap (1x1x1 too), ``kxkxk`` for a larger one in ``dims=3`` where the
        file has that class, else ``kxk``."""
        measured = self.conv_table.get((op, shape)) if shape is not None else None
        if measured is not None:
            return measured
        classes = self.compute[op]
        cls = "1x1" if kernel_area == 1 else VOLUME_CLASS if dims == 3 and VOLUME_CLASS in classes else "kxk"
        return classes[cls].seconds(flops, columns)

    def local_seconds(self, op, nbytes):
        return self.compute[op].seconds(nbytes)


def _number(value, where, path):
    if isinstance(value, str):  # PyYAML reads 1.0e12 (no exponent sign) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise MachineError(f"machine file {path}: {where}: expected a non-negative number, got {value!r}")
    return float(value)


def _rate(spec, where, path, allow_bw=False):
    keys = {"t0", "rate"}
    if not isinstance(spec, dict) or not (set(spec) == keys or (allow_bw and set(spec) == keys | {"bw"})):
        raise MachineError(f"machine file {path}: {where}: expected {{t0: seconds, rate: per second"
                           f"{', bw: bytes per second (optional)' if allow_bw else ''}}}, got {spec!r}")
    rates = {k: _number(spec[k], f"{where}.{k}", path) for k in ("rate", "bw") if k in spec}
    for k, v in rates.items():
        if v == 0:
            raise MachineError(f"machine file {path}: {where}.{k}: must be > 0")
    return Rate(_number(spec["t0"], f"{where}.t0", path), rates["rate"], rates.get("bw", math.inf))


def _link(spec, where, path, schedule):
    if isinstance(spec, dict) and set(spec) == {"alpha", "beta"}:
        return Link(_number(spec["alpha"], f"{where}.alpha", path), _number(spec["beta"], f"{where}.beta", path),
                    schedule=schedule)
    if isinstance(spec, dict) and set(spec) == {"table"} and isinstance(spec["table"], dict) and spec["table"]:
        rows = []
        for q, ab in spec["table"].items():
            if isinstance(q, bool) or not isinstance(q, int) or q < 2 or not isinstance(ab, list) or len(ab) != 2:
                raise MachineError(f"machine file {path}: {where}.table: expected {{q >= 2: [alpha, beta]}}, "
                                   f"got {q!r}: {ab!r}")
            rows.append((q, _number(ab[0], f"{where}.table[{q}]", path), _number(ab[1], f"{where}.table[{q}]", path)))
        return Link(table=tuple(sorted(rows)), schedule=schedule)
    raise MachineError(f"machine file {path}: {where}: expected {{alpha: s, beta: s/byte}} or "
                       f"{{table: {{q: [alpha, beta]}}}}, got {spec!r}")


def from_dict(doc, path="<dict>"):
    """A :class:`Machine` from the parsed YAML; raises MachineError naming the bad key."""
    if not isinstance(doc, dict):
        raise MachineError(f"machine file {path}: expected a mapping at the top level, got {type(doc).__name__}")
    for key in ("name", "ranks_per_node", "collectives", "compute"):
        if key not in doc:
            raise MachineError(f"machine file {path}: missing key {key!r}")
    rpn = doc["ranks_per_node"]
    if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 1:
        raise MachineError(f"machine file {path}: ranks_per_node: expected a positive int, got {rpn!r}")
    schedule = doc.get("latency", "ring")
    if schedule not in ("ring", "log"):
        raise MachineError(f"machine file {path}: latency: expected 'ring' or 'log', got {schedule!r}")
    links = {}
    for scope in ("intra", "inter"):
        section = doc["collectives"].get(scope) if isinstance(doc["collectives"], dict) else None
        if not isinstance(section, dict):
            raise MachineError(f"machine file {path}: collectives.{scope}: expected a mapping of {KINDS}")
        missing = [k for k in KINDS if k not in section]
        if missing:
            raise MachineError(f"machine file {path}: collectives.{scope}: missing {missing[0]!r}")
        links[scope] = {k: _link(section[k], f"collectives.{scope}.{k}", path, schedule) for k in KINDS}
    compute = {}
    if not isinstance(doc["compute"], dict):
        raise MachineError(f"machine file {path}: compute: expected a mapping of {COMPUTE}")
    for op in COMPUTE:
        if op not in doc["compute"]:
            raise MachineError(f"machine file {path}: compute: missing {op!r}")
        spec = doc["compute"][op]
        if op.startswith("conv"):
            if not isinstance(spec, dict) or set(spec) - {VOLUME_CLASS} != set(CONV_CLASSES):
                raise MachineError(f"machine file {path}: compute.{op}: expected classes {CONV_CLASSES} "
                                   f"(and optionally {VOLUME_CLASS!r}), got {spec!r}")
            compute[op] = {c: _rate(spec[c], f"compute.{op}.{c}", path, allow_bw=True) for c in spec}
        else:
            compute[op] = _rate(spec, f"compute.{op}", path)
    table = _conv_table(doc["compute"].get("conv_table", []), path)
    overlap = _number(doc.get("overlap", 1.0), "overlap", path)
    if overlap > 1:
        raise MachineError(f"machine file {path}: overlap: expected the share of an allreduce hidden behind "
                           f"compute, from 0 to 1, got {overlap!r}")
    return Machine(str(doc["name"]), doc.get("measured", False), rpn, links, compute, path, table, overlap)


def _conv_table(entries, path):
    """``{(op, ConvShape): seconds}`` of ``compute.conv_table``, a list of
    ``{shape: [12 positive ints], conv_fwd: s, conv_bwd_data: s, conv_bwd_filter: s}``."""
    where = f"machine file {path}: compute.conv_table"
    if not isinstance(entries, list):
        raise MachineError(f"{where}: expected a list of {{shape: [...], {', '.join(CONV_OPS)}}}, got "
                           f"{type(entries).__name__}")
    table = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"shape", *CONV_OPS}:
            raise MachineError(f"{where}[{i}]: expected the keys shape, {', '.join(CONV_OPS)}, got {entry!r}")
        v = entry["shape"]
        if (not isinstance(v, list) or len(v) not in (12, 16)
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in v)):
            raise MachineError(f"{where}[{i}].shape: expected 12 positive ints [n, C, F, H_win, W_win, Kh, Kw, "
                               f"stride_h, stride_w, dilation_h, dilation_w, groups] (16 for a volume, with "
                               f"D_win, Kd, stride_d and dilation_d before each pair), got {v!r}")
        shape = ConvShape.of_list(v)
        if shape.C % shape.groups or shape.F % shape.groups:
            raise MachineError(f"{where}[{i}].shape: groups={shape.groups} must divide C={shape.C} and "
                               f"F={shape.F}")
        if ("conv_fwd", shape) in table:
            raise MachineError(f"{where}[{i}].shape: {v} is listed twice")
        for op in CONV_OPS:
            t = _number(entry[op], f"compute.conv_table[{i}].{op}", path)
            if t == 0:
                raise MachineError(f"{where}[{i}].{op}: must be > 0 seconds")
            table[op, shape] = t
    return table


def builtin(name):
    """Path of a machine file shipped in ``refconv/pricing/machines/`` (``name`` without .yaml)."""
    return os.path.join(MACHINES_DIR, f"{name}.yaml")


def builtin_names():
    return sorted(f[:-5] for f in os.listdir(MACHINES_DIR) if f.endswith(".yaml"))


def load(path=None):
    """A machine from a YAML file, a built-in name (:func:`builtin_names`), or None.

    None gives the built-in default (the paper-class V100 system, datasheet
    figures) with a warning saying so.
    """

    if path is None:
        warnings.warn(f"no machine file given: using the built-in {DEFAULT_MACHINE!r} figures "
                      f"(datasheet, not measured here); run `refconv calibrate --out machine.yaml`",
                      stacklevel=2)
        path = builtin(DEFAULT_MACHINE)
    elif not os.path.exists(path) and os.path.exists(builtin(str(path))):
        path = builtin(str(path))
    if not os.path.exists(path):
        raise MachineError(f"--machine: file {path!r} does not exist; give a YAML machine file or one of "
                           f"{builtin_names()}")
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED:  # every 'auto' conv of a model loads the same file: parse it once
        try:
            with open(path) as f:
                doc = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise MachineError(f"machine file {path}: not valid YAML ({first})") from None
        _LOADED[key] = from_dict(doc, path)
    return _LOADED[key]


_LOADED = {}  # (real path, modification time, size) -> Machine (frozen): a changed file is parsed again
