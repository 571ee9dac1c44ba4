"""Predicted time and memory of one training step, per stage and strategy.

For a :class:`refconv.pricing.graph.Stage` on a grid ``(P_N, P_c, P_H, P_W)`` (for a model
of volumes ``(P_N, P_c, P_D, P_H, P_W)``: every formula below runs over the spatial dims
there are) this module predicts, on the rank with the largest blocks (coordinate 0 everywhere):

- compute: forward and backward FLOPs (or bytes, for batch norm, pooling and
  element-wise layers) priced by the machine's fitted rates;
- communication: every call the layer makes, priced by the machine file: the
  ``records`` of the module that makes them.  A convolution's come from
  :func:`refconv.algorithms.records` (:func:`conv_calls`), the other layers' from their modules in
  refconv/layers (:func:`layer_calls`); ``refconv.testing.check.check_records``
  checks both against the calls a training step makes;
- memory: parameters x 3 (weight, gradient, SGD momentum), the activations each
  layer keeps for backward, and the largest buffer a collective gathers;
- the shuffle (``refconv.sharding.redistribute``, an uneven all-to-all, forward and
  reverse) between consecutive stages on different grids:
  :func:`refconv.pricing.shuffle.shuffle_matrix`.

The weight-gradient allreduce (convolution ``dw``/``db``, classifier ``dW``/``db``)
is kept apart in ``grad``.  ``refconv train`` starts it in each layer's backward and
waits before the optimizer's step (``Model.set_overlap``); ``--no-overlap`` waits in
the layer.  With overlap on, a convolution also computes behind its halo exchange
(the interior of its output) and its halo return (its own cells of backward-data and,
but for Stationary-Y and -W, backward-filter): :func:`halo_hidden` prices what that hides, in
``hidden_fwd`` and ``hidden_bwd``.  The planner's objective is the blocking sum;
:func:`overlapped_step` prices the overlapped step (each allreduce as max(compute,
communication) on one stream, each halo call as max(the compute behind it, the call)
plus the compute after it) and ``refconv plan`` prints both.
"""

import dataclasses
import functools
import itertools
import math

from refconv import algorithms, checks
from refconv.algorithms import REGISTRY, ConvGeometry, SampleSpatial, candidates
from refconv.distribution import Split, block_size
from refconv.grid import AXES, SPATIAL, axes_of
from refconv.halo import Halo
from refconv.pricing.graph import spatial_tuple
from refconv.pricing.machine import CONV_OPS, ConvShape
from refconv.pricing.records import (POOL_GEOMETRY, batch_norm_records, gap_records, linear_records, loss_records,
                                     pool_records)

ITEMSIZE = 4  # float32


def _ceil(a, b):
    return -(-a // b)


def _dims(layer):
    return len(layer.in_shape) - 2  # spatial dims: 2, or 3 for a volume


@functools.lru_cache(maxsize=None)
def grids(P, ndim=len(AXES)):
    """Every factorisation of ``P`` into ``(P_N, P_c, P_H, P_W)``, or with ``ndim=5`` into
    ``(P_N, P_c, P_D, P_H, P_W)`` (a model of volumes)."""
    divisors = checks.divisors(P)
    out = []
    for head in itertools.product(divisors, repeat=ndim - 1):
        if P % math.prod(head) == 0:
            out.append(head + (P // math.prod(head),))
    return tuple(sorted(out))


def _axis_span(grid, axes):
    """1 + the largest rank distance in a communicator over ``axes`` (row-major grid)."""
    names = axes_of(grid)
    return 1 + sum((p - 1) * math.prod(grid[i + 1:]) for i, p in enumerate(grid) if names[i] in axes)


def comm_axes(kind, grid):
    """The grid axes a call of ``kind`` usually spans: the halo the spatial ones, the channel
    collectives the channel axis, an allreduce (the segmented one) every axis but channel."""
    names = axes_of(grid)
    return {"halo": names[SPATIAL:], "allreduce": names[:1] + names[SPATIAL:], "allgather": ("channel",),
            "reduce_scatter": ("channel",)}[kind]


@dataclasses.dataclass
class StageCost:
    grid: tuple
    algorithm: str = None
    filter_groups: int = None
    fwd: float = 0.0  # compute seconds
    bwd: float = 0.0
    comm: dict = dataclasses.field(default_factory=dict)  # kind -> seconds (weight-gradient allreduce excluded)
    grad: float = 0.0  # weight-gradient allreduce seconds
    memory: int = 0  # bytes kept for the whole step: parameters x 3 and saved activations
    workspace: int = 0  # bytes held beyond memory at the worst pass: buffers, gradients in and out (conv_transient)
    hidden_fwd: float = 0.0  # seconds of the halo exchange hidden behind compute when overlapped (halo_hidden)
    hidden_bwd: float = 0.0  # seconds of the halo return hidden likewise

    @property
    def seconds(self):
        return self.fwd + self.bwd + sum(self.comm.values()) + self.grad

    def add(self, other):
        self.fwd += other.fwd
        self.bwd += other.bwd
        for k, v in other.comm.items():
            self.comm[k] = self.comm.get(k, 0.0) + v
        self.grad += other.grad
        self.hidden_fwd += other.hidden_fwd
        self.hidden_bwd += other.hidden_bwd
        self.memory += other.memory
        self.workspace = max(self.workspace, other.workspace)


def local_elements(shape, grid):
    """Elements of the largest block of an activation ``shape`` on ``grid``."""
    return math.prod(_ceil(L, p) for L, p in zip(shape, grid))


def feasible(layer, grid):
    """Can ``layer`` (a graph.Layer) run on ``grid``?  Also prunes spatial splits that
    leave a rank fewer input rows than the kernel (or 2 rows), as docs/planning.md says."""
    (P_N, P_c), (N, C), F = grid[:2], layer.in_shape[:2], layer.out_shape[1]
    spec = layer.spec
    if P_N > N or P_c > (C if layer.kind == "linear" else min(C, F)):  # the classifier splits only its input
        return False
    if layer.kind == "conv" and P_c > 1 and spec.get("groups", 1) > 1:
        try:  # whole groups per rank, or whole ranks per group (refconv.algorithms.grouped)
            candidates(P_c, spec["groups"], (C, F))
        except ValueError:
            return False
    if layer.kind == "linear":
        return True
    if layer.kind == "gap":  # every rank needs a block of the input: a 2 x 2 x 2 volume splits at most 2 ways
        return all(p <= L for p, L in zip(grid[SPATIAL:], layer.in_shape[2:]))
    dims = _dims(layer)
    kernel = spatial_tuple(spec.get("kernel", 1) if layer.kind in ("conv", "maxpool", "avgpool") else 1, dims)
    for p, L, Lo, K in zip(grid[SPATIAL:], layer.in_shape[2:], layer.out_shape[2:], kernel):
        if p > 1 and (L // p < max(K, 2) or Lo < p):
            return False
    return True


def local_weight_shape(layer, grid, algorithm, filter_groups):
    """``(F_rows, C_cols)`` of the weight block of rank 0: the algorithm's own layout
    (``weight_dims``) of ``F x C/groups x Kh x Kw`` (``x Kd x Kh x Kw``) on the grid."""
    spec = layer.spec
    groups = spec.get("groups", 1)
    return _weight_block(spec["out"], layer.in_shape[1] // groups, grid[1],
                         algorithm if grid[1] > 1 else "sample-spatial", filter_groups, groups)


@functools.lru_cache(maxsize=None)
def _weight_block(F, C, P_c, name, filter_groups, groups):
    # Only the channel axis splits a weight: a grid (1, P_c, 1, 1) gives the same block.  Rank 0's block in
    # closed form, from coordinate 0's blocks alone: a Distribution would tabulate all P_c coordinates
    # (the planner asks for hundreds of combinations; the layer's own Distribution still validates it).
    dims = algorithms.REGISTRY[name].weight_dims(P_c, filter_groups, groups)
    return tuple(_first_block_length(length, spec, (1, P_c, 1, 1)) for length, spec in zip((F, C), dims[:2]))


def _first_block_length(length, spec, grid_shape):
    """The length of coordinate 0's part of a dim of ``length`` laid out by ``spec`` (None, an axis name,
    or a Split): what ``Distribution(...).local_shape(0)`` gives for that dim."""
    if spec is None:
        return length
    split = Split.block(spec) if isinstance(spec, str) else spec
    nblocks = grid_shape[axes_of(grid_shape).index(split.axis)] if split.nblocks is None else split.nblocks
    blocks = ((0,) if split.blocks_of is None else split.blocks_of(0) if callable(split.blocks_of)
              else split.blocks_of[0])
    return sum(block_size(length, nblocks, j) for j in blocks)


def conv_geometry(layer):
    """The :class:`refconv.algorithms.ConvGeometry` of a conv (a graph.Layer), 2-D or 3-D, float32."""
    spec, dims = layer.spec, _dims(layer)
    C, groups = layer.in_shape[1], spec.get("groups", 1)
    return ConvGeometry.of(layer.in_shape, (spec["out"], C // groups) + spatial_tuple(spec["kernel"], dims),
                           stride=spec.get("stride", 1), padding=spec.get("padding", 0),
                           dilation=spec.get("dilation", 1), groups=groups, bias=spec.get("bias", True),
                           itemsize=ITEMSIZE, padding_mode=spec.get("padding_mode", "zeros"), dims=dims)


def conv_calls(layer, grid, algorithm, filter_groups):
    """The calls of a conv on rank 0: its algorithm's ``records()`` (:func:`refconv.algorithms.records`,
    what ``DistConv2d.records()`` and ``DistConv3d.records()`` return); all its allreduces are
    the weight-gradient ones (``dw``, then ``db``)."""
    records = algorithms.records(algorithm, conv_geometry(layer), grid, (0,) * len(grid), filter_groups)
    return [dataclasses.replace(r, axes=comm_axes(r.kind, grid), grad=r.kind == "allreduce") for r in records]


def layer_calls(layer, grid):
    """The calls of a non-conv layer on ``grid`` (rank 0): the ``records`` of its layer module
    (the classifier's with the loss's, which follows it; ReLU has none)."""
    origin, spec = (0,) * len(grid), layer.spec
    if layer.kind == "batchnorm":
        return batch_norm_records(layer.in_shape, grid, origin, ITEMSIZE)
    if layer.kind in ("maxpool", "avgpool"):
        return pool_records(layer.in_shape, spec["kernel"], spec.get("stride"), spec.get("padding", 0), grid, origin,
                            ITEMSIZE)
    if layer.kind == "gap":
        return gap_records(layer.in_shape, grid, origin, ITEMSIZE)
    if layer.kind == "linear":
        return linear_records(layer.in_shape, layer.out_shape[1], spec.get("bias", True), grid, origin, ITEMSIZE) \
            + loss_records(grid, ITEMSIZE)
    return []


def call_seconds(c, grid, machine):
    """Seconds of one call ``c`` (a :class:`refconv.algorithms.Call`) of rank 0 on ``grid``."""
    intra = _axis_span(grid, c.axes or comm_axes(c.kind, grid)) <= machine.ranks_per_node
    return machine.call_seconds(c.kind, c.comm_size, c.bytes, c.messages, intra=intra)


def price_calls(calls, grid, machine, cost):
    for c in calls:
        t = call_seconds(c, grid, machine)
        if c.grad:
            cost.grad += t
        else:
            cost.comm[c.kind] = cost.comm.get(c.kind, 0.0) + t
        if c.kind in ("allgather", "reduce_scatter", "halo"):
            cost.workspace = max(cost.workspace, c.bytes)


def local_conv_shape(layer, grid, F_rows, C_cols):
    """The :class:`refconv.pricing.machine.ConvShape` rank 0 convolves: ``x_win (n, C_cols x groups,
    H_win, W_win)`` (``D_win, H_win, W_win`` for a volume: its output block plus the halo, padding
    included) with the weight block ``(F_rows, C_cols, Kh, Kw)``, at ``padding=0``.  None for a
    grouped conv on a channel split, whose local groups the table does not key."""
    spec, dims = layer.spec, _dims(layer)
    groups = spec.get("groups", 1)
    if groups > 1 and grid[1] > 1:
        return None
    kernel, stride = spatial_tuple(spec["kernel"], dims), spatial_tuple(spec.get("stride", 1), dims)
    dilation = spatial_tuple(spec.get("dilation", 1), dims)
    out = [_ceil(L, p) for L, p in zip(layer.out_shape[2:], grid[SPATIAL:])]  # output rows of rank 0, per dim
    window = tuple((o - 1) * s + d * (k - 1) + 1 for o, k, s, d in zip(out, kernel, stride, dilation))
    return ConvShape(_ceil(layer.in_shape[0], grid[0]), C_cols * groups, F_rows, window, kernel, stride, dilation,
                     groups)


class _Rank0:
    """Rank 0 of a spatial group of ``size`` ranks: what :class:`refconv.halo.Halo` asks of its
    communicator, so that the planner reads rank 0's windows from the layers' own Halo."""

    def __init__(self, size):
        self.size = size

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.size


@functools.lru_cache(maxsize=4096)
def halo_shares(spatial_grid, in_shape, out_shape, kernel, stride, padding, dilation, padding_mode):
    """``(interior, own)`` of rank 0: the share of its output block that reads no halo cell
    (``Halo.interior``), and of its window the share of backward-data cells it keeps
    (``Halo.kept_box``); both 0 where the block is too small for the layer to split its work."""
    halo = Halo(_Rank0(math.prod(spatial_grid)), spatial_grid, in_shape, out_shape, kernel, stride, padding,
                dilation, padding_mode)
    if halo.interior is None:
        return 0.0, 0.0
    kept = 0 if halo.kept_box is None else math.prod(halo.kept_box.shape)
    return math.prod(halo.interior.shape) / math.prod(halo.out_shape), kept / math.prod(halo.window_shape)


def halo_hidden(geom, grid, algorithm, passes, halos, share):
    """``(forward, backward)`` seconds of rank 0's halo exchange and halo return hidden behind
    compute when the layer overlaps them (``Algorithm.conv_behind_halo``, ``backward_behind_halo``).

    ``passes``: seconds of the local forward, backward-data and backward-filter; ``halos``: of
    the exchange and the return; ``share``: what the machine hides of a call in flight
    (``Machine.overlap``).  Behind the exchange runs the interior of the output; behind the
    return, the own cells of backward-data and backward-filter (Stationary-Y and -W run
    backward-filter behind their reduce-scatter of dx instead, ``filter_behind_next``, not priced
    as overlapped here; a block too small to split leaves backward-filter alone behind the return).  Compute is taken in
    proportion to the cells.  A call then costs max(compute behind it, ``share`` of it) plus the
    rest of it, so it saves min(compute behind it, ``share`` of it) of the blocking sum."""
    fwd, data, filt = passes
    exchange, back = halos
    interior, own = halo_shares(tuple(grid[SPATIAL:]), geom.in_shape[2:], geom.out_shape[2:], geom.kernel,
                                 geom.stride, geom.padding, geom.dilation, geom.padding_mode)
    runs = REGISTRY[algorithm] if grid[1] > 1 else SampleSpatial
    behind_return = own * data + (0.0 if runs.filter_behind_next else filt)
    return min(interior * fwd, share * exchange), min(behind_return, share * back)


@functools.lru_cache(maxsize=4096)
def window_share(spatial_grid, in_shape, out_shape, kernel, stride, padding, dilation, padding_mode):
    """Cells of rank 0's halo window (padding included: ``Halo.window_shape``) per cell of its own
    block: what a conv or pool keeps (the window) per byte of its local input."""
    halo = Halo(_Rank0(math.prod(spatial_grid)), spatial_grid, in_shape, out_shape, kernel, stride, padding,
                dilation, padding_mode)
    return math.prod(halo.window_shape) / math.prod(halo.owned[0].shape)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=4096)
def pool_window(spatial_grid, in_shape, kernel_size, stride, padding):
    """``(is_block, share)`` of a pooling's window on rank 0: whether it is the block itself (one rank
    spatially, nothing padded or cut off: ``Halo.is_block``, so that ``Halo.extend`` and ``reduce`` return
    their argument and copy nothing), and its cells per cell of the block (:func:`window_share`)."""
    kernel, stride, padding, out = POOL_GEOMETRY[len(in_shape) - 2](in_shape, kernel_size, stride, padding)
    halo = Halo(_Rank0(math.prod(spatial_grid)), spatial_grid, in_shape[2:], out, kernel, stride, padding,
                (1,) * len(kernel), "zeros")
    return halo.is_block, math.prod(halo.window_shape) / math.prod(halo.owned[0].shape)


def layer_cost(layer, grid, machine, algorithm=None, filter_groups=None):
    """StageCost of one layer on ``grid`` (a conv with the given algorithm)."""
    cost = StageCost(grid, algorithm, filter_groups)
    x_bytes = local_elements(layer.in_shape, grid) * ITEMSIZE
    out_bytes = local_elements(layer.out_shape, grid) * ITEMSIZE
    transient = 2 * max(x_bytes, out_bytes)  # the gradient in and the gradient out, live together in backward
    if layer.kind == "conv":
        calls = conv_calls(layer, grid, algorithm, filter_groups)
        area = math.prod(spatial_tuple(layer.spec["kernel"], _dims(layer)))  # Kh Kw, or Kd Kh Kw
        F_rows, C_cols = local_weight_shape(layer, grid, algorithm, filter_groups)
        shard = F_rows * C_cols * area
        # output pixels (voxels) of rank 0: n h' w' (n d' h' w')
        pixels = _ceil(layer.in_shape[0], grid[0]) * local_elements(layer.out_shape[2:], grid[SPATIAL:])
        # the local pass is the GEMM F_rows x (C_cols Kh Kw) x pixels: each output pixel meets the shard once
        flops = 2 * pixels * shard
        columns = pixels * C_cols * area * ITEMSIZE  # the im2col matrix of the local conv
        shape = local_conv_shape(layer, grid, F_rows, C_cols)  # for a machine's measured table
        passes = [machine.conv_seconds(op, area, flops, columns, shape, _dims(layer))  # fwd, data, filter
                  for op in CONV_OPS]
        cost.fwd, cost.bwd = passes[0], passes[1] + passes[2]
        halos = [call_seconds(c, grid, machine) for c in calls if c.kind == "halo"]  # the exchange, the return
        if halos:
            cost.hidden_fwd, cost.hidden_bwd = halo_hidden(conv_geometry(layer), grid, algorithm, passes, halos,
                                                           machine.overlap)
        # the conv's input: x, or x gathered over channels, Stationary-Y's and -W's first allgather (W's
        # second gathers dy over other ranks, Stationary-X's only one too: neither is kept)
        x_in = x_bytes
        if algorithm in ("stationary-y", "stationary-w") and grid[1] > 1:
            x_in = max(x_in, next((c.bytes for c in calls if c.kind == "allgather"), 0))
        # kept for backward: the window of the conv's input, its zero padding included (the layers keep
        # Halo.extend's window, not the block)
        geom = conv_geometry(layer)
        share = window_share(tuple(grid[SPATIAL:]), geom.in_shape[2:], geom.out_shape[2:], geom.kernel,
                             geom.stride, geom.padding, geom.dilation, geom.padding_mode)
        cost.memory = 3 * (shard + (layer.out_shape[1] if layer.spec.get("bias", True) else 0)) * ITEMSIZE \
            + round(share * x_in)
        params = (shard + (layer.out_shape[1] if layer.spec.get("bias", True) else 0)) * ITEMSIZE
        transient = max(conv_transient(algorithm if grid[1] > 1 else None, calls, x_bytes, out_bytes, x_in, share),
                        out_bytes + x_bytes + 2 * params)  # dw and the allreduce's receive buffer
    else:
        calls = layer_calls(layer, grid)
        op = {"batchnorm": "batchnorm", "maxpool": "pool", "avgpool": "pool"}.get(layer.kind, "elementwise")
        if layer.kind == "linear":
            n, C = _ceil(layer.in_shape[0], grid[0]), layer.in_shape[1]
            K = layer.out_shape[1]
            flops = 2 * n * K * C
            cost.fwd = machine.conv_seconds("conv_fwd", 1, flops)
            cost.bwd = machine.conv_seconds("conv_bwd_data", 1, flops) + machine.conv_seconds("conv_bwd_filter", 1,
                                                                                               flops)
            cost.memory = 3 * (K * C + K) * ITEMSIZE + n * C * ITEMSIZE
            transient = out_bytes + x_bytes + 2 * (K * C + K) * ITEMSIZE  # dw and the allreduce's receive buffer
        else:
            t = machine.local_seconds(op, x_bytes)
            cost.fwd, cost.bwd = t / 2, t / 2  # calibrated as forward + backward together
            params = 2 * _ceil(layer.in_shape[1], grid[1]) if layer.kind == "batchnorm" else 0
            cost.memory = 3 * params * ITEMSIZE + kept_bytes(layer, grid, x_bytes)
            if layer.kind in ("maxpool", "avgpool"):
                is_block, share = pool_window(tuple(grid[SPATIAL:]), tuple(layer.in_shape),
                                              _hashable(layer.spec["kernel"]), _hashable(layer.spec.get("stride")),
                                              _hashable(layer.spec.get("padding", 0)))
                # backward holds dy, dx and, unless the window is the block, the window's gradient (a copy,
                # halo included; forward's window of x and y are less)
                transient = out_bytes + x_bytes + (0 if is_block else round(share * x_bytes))
    overhead = machine.local_seconds("layer", x_bytes + out_bytes)
    cost.fwd += overhead / 2
    cost.bwd += overhead / 2
    price_calls(calls, grid, machine, cost)
    cost.workspace = max(cost.workspace, transient)
    return cost


def conv_transient(algorithm, calls, x_bytes, out_bytes, x_in, share):
    """The bytes a conv holds beyond what it keeps, at the larger of its forward and its backward, on
    rank 0 (as :mod:`refconv.shapes.memory` measures them).  ``x_in``: the conv's input (x, or x gathered
    over channels), ``share``: its window's cells per input cell (:func:`window_share`).

    - forward: y; with Stationary-X/-W the partial y over all filters and the reduce-scatter's receive
      buffer of the same size; with Stationary-Y/-W the gathered x (the window kept is a copy);
    - backward: dy, dx of the window and dx (x_in); with Stationary-X/-W the gathered dy; with
      Stationary-Y/-W the reduce-scatter of dx: its receive buffer (x_in) and the sum (x)."""
    gathers = [c.bytes for c in calls if c.kind == "allgather"]
    reduces = [c.bytes for c in calls if c.kind == "reduce_scatter"]
    forward = backward = out_bytes
    backward += round(share * x_in) + x_in
    if algorithm in ("stationary-x", "stationary-w"):
        forward += 2 * reduces[0]
        backward += gathers[-1]
    if algorithm in ("stationary-y", "stationary-w"):
        forward += x_in
        backward += x_in + x_bytes
    return max(forward, backward)


def kept_bytes(layer, grid, x_bytes):
    """What a layer other than conv and linear keeps for backward on rank 0: max pooling its argmax (int64,
    one per output cell), average and global average pooling only shapes, the rest its input (x_bytes)."""
    if layer.kind == "maxpool":
        return local_elements(layer.out_shape, grid) * 8
    if layer.kind in ("avgpool", "gap"):
        return 0
    return x_bytes


def stage_options(stage, grid, machine):
    """``[StageCost]`` of ``stage`` on ``grid``: one per algorithm (and p_f) when the
    main layer is a conv with P_c > 1; empty if the grid is not feasible."""
    if not all(feasible(layer, grid) for layer in stage.layers):
        return []
    choices = [(None, None)]
    if stage.main.kind == "conv":
        spec = stage.main.spec
        choices = (candidates(grid[1], spec.get("groups", 1), (stage.main.in_shape[1], spec["out"])) if grid[1] > 1
                   else [("stationary-x", None)])
    out = []
    for algorithm, p_f in choices:
        cost = layer_cost(stage.main, grid, machine, algorithm, p_f)
        for layer in stage.followers:
            cost.add(layer_cost(layer, grid, machine))
        out.append(cost)
    return out


def add_seconds(shape, grid, machine):
    """The residual sum (forward) and the sum of the two gradients (backward), local."""
    return machine.local_seconds("elementwise", local_elements(shape, grid) * ITEMSIZE)


def overlapped_step(costs, hidden=1.0):
    """Step seconds if each weight-gradient allreduce overlapped the backward compute of
    the layers before it (one communication stream), and each convolution's halo exchange
    and return the compute its layer runs behind them: ``costs`` in forward order.

    ``hidden``: the share of each allreduce the machine overlaps (``Machine.overlap``, which
    ``refconv calibrate`` measures); the rest of it the rank pays on its own time, as in
    the blocking step.  So each call costs max(compute, its hidden part) plus the part
    that cannot overlap: ``hidden=0`` gives the blocking step, 1 the full overlap.  The
    halo calls' hidden seconds (``hidden_fwd``, ``hidden_bwd``: :func:`halo_hidden`, priced
    with the same share) come off the rank's own time.

    A rank has one link (as on the logical clock, :mod:`refconv.simulated.clock`): a layer's other calls
    in backward (a batch norm's allreduce, the gathers, reduce-scatters and halo return of a conv) start
    once the allreduces queued before them have left it, and the rank waits for them."""
    t = sum(c.fwd + sum(v for k, v in c.comm.items()) / 2 - c.hidden_fwd for c in costs)  # forward half of the comm
    compute, stream = t, t
    for c in reversed(costs):
        compute += c.bwd
        calls = sum(c.comm.values()) / 2 - c.hidden_bwd      # backward's half, less what hid behind compute
        if calls > 0:
            compute = stream = max(compute, stream) + calls  # behind the allreduces on the link
        compute += (1 - hidden) * c.grad
        stream = max(stream, compute) + hidden * c.grad
    return max(compute, stream)
