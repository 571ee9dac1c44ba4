"""The logical clock of a priced simulated run: every rank's compute and calls timed from a machine file.

``refconv.simulated.run(fn, K, machine="v100-edr")`` gives each rank a :class:`Clock`.  It reads
no wall clock: a rank's time moves only by what the machine file (:mod:`refconv.pricing.machine`,
the file ``refconv calibrate`` writes) prices, with the planner's own formulas, so a run on a
laptop shows what K ranks of that machine would do, and the same program gives the same times.

**Compute.**  Each local convolution pass costs ``Machine.conv_seconds`` of its FLOPs and im2col
columns (as :func:`refconv.pricing.perf.layer_cost` prices rank 0's), charged where the algorithm
runs it (:meth:`refconv.algorithms.base.Algorithm.conv` and its backward pair).  Every layer of a
:class:`refconv.layers.Sequential` also costs the machine's per-layer overhead, and the layers
without a convolution their kernel's price, half in forward and half in backward, as the planner
splits them.  Python's own time is free.

**Calls.**  A call is priced by the record refconv.collectives made for it (kind, ranks, bytes,
messages: ``Machine.call_seconds``, intra-node when every member sits on one node of
``ranks_per_node`` consecutive ranks).  Each rank has one link:

- a collective starts when its last member has posted it and every member's link is free, and
  occupies every member's link until it ends;
- a message starts when it is sent and the sender's link is free; a halo call's record is priced
  once, on its first message, and its other messages queue behind it on the link.

A blocking call's rank waits until the call ends.  A nonblocking call runs behind the compute that
follows its start, and its ``wait()`` moves the rank's clock to the call's end only if that is
later: the rest was hidden.  A priced run is stepped (one rank at a time), so that the order in
which calls take a link is the same on every run.

The clock's events (:attr:`Clock.events`) are those ``collectives.stats.timeline()`` records,
in logical seconds: :func:`report` sums what was hidden and exposed per kind with training's own
:func:`refconv.overlap.hidden_by_kind`, and ``refconv simulate --trace``
draws them with :func:`refconv.overlap.draw_timeline`, as ``refconv train --timeline`` does.
"""

import math

from refconv import pricing
from refconv.collectives import local
from refconv.overlap import hidden_by_kind
from refconv.layers import (AvgPool2d, AvgPool3d, BatchNorm2d, BatchNorm3d, GlobalAvgPool, GlobalAvgPool3d, Linear,
                            MaxPool2d, MaxPool3d, Redistribute, ReLU, Residual, Sequential)
from refconv.pricing.machine import ConvShape, Machine

ITEMSIZE = 4  # bytes an element, as the planner prices (refconv.pricing.perf.ITEMSIZE)
# which record a call's MPI primitive carries: the refconv kinds each primitive implements
CARRIES = {"Allreduce": ("allreduce",), "Alltoallw": ("reduce_scatter", "allgather"), "Allgather": ("allgather",),
           "Alltoallv": ("alltoallv",), "send": ("halo", "alltoallv")}
LOCAL_OPS = {BatchNorm2d: "batchnorm", BatchNorm3d: "batchnorm", MaxPool2d: "pool", MaxPool3d: "pool",
             AvgPool2d: "pool", AvgPool3d: "pool", GlobalAvgPool: "elementwise", GlobalAvgPool3d: "elementwise"}


class Clock:
    """One rank's logical time in seconds, and what it was spent on."""

    def __init__(self, machine, rank):
        self.machine, self.rank = machine, rank
        self.t = 0.0                 # this rank's time
        self.arrival = 0.0           # when the calls last completed had finished (<= t)
        self.link_free = 0.0         # when this rank's link is next free
        self.compute = {}            # op -> seconds charged
        self.events = []             # the calls' times (collectives.stats.timeline's events)
        self._priced = None          # the last record a call was priced with

    def now(self):
        return self.t

    # -- compute ------------------------------------------------------------------------------------
    def charge(self, op, seconds):
        self.t += seconds
        self.compute[op] = self.compute.get(op, 0.0) + seconds

    def conv(self, op, window, w_shape, out_shape, stride, dilation, groups):
        """A local convolution pass: ``x_win`` of shape ``window`` with ``w_loc (F, C/groups, *kernel)``
        giving (or taking, backward) ``out_shape``."""
        kernel = tuple(w_shape[2:])
        area = math.prod(kernel)
        pixels = out_shape[0] * math.prod(out_shape[2:])
        flops = 2 * pixels * w_shape[0] * w_shape[1] * area
        columns = pixels * w_shape[1] * area * ITEMSIZE
        shape = ConvShape(window[0], w_shape[1] * groups, w_shape[0], tuple(window[2:]), kernel, _tuple(stride, kernel),
                          _tuple(dilation, kernel), groups) if groups == 1 else None
        self.charge(op, self.machine.conv_seconds(op, area, flops, columns, shape, len(kernel)))

    def layer(self, layer, x_size, y_size, direction):
        """What a layer costs besides its convolution passes, in ``direction`` (half of each).  A block's
        layers are priced one by one, and a shuffle between grids as its calls."""
        if isinstance(layer, (Sequential, Residual, Redistribute)):
            return
        self.charge("layer", self.machine.local_seconds("layer", (x_size + y_size) * ITEMSIZE) / 2)
        if isinstance(layer, Linear):
            n, K, C = layer.output_distribution.local_shape(layer.grid.rank)[0], layer.out_features, layer.in_features
            ops = ("conv_fwd",) if direction == "forward" else ("conv_bwd_data", "conv_bwd_filter")
            for op in ops:
                self.charge(op, self.machine.conv_seconds(op, 1, 2 * n * K * C))
        elif type(layer) in LOCAL_OPS or isinstance(layer, ReLU):
            op = LOCAL_OPS.get(type(layer), "elementwise")
            self.charge(op, self.machine.local_seconds(op, x_size * ITEMSIZE) / 2)

    # -- calls: the engine's hooks, under the world's lock ---------------------------------------------
    def posted(self, post, comm):
        """A call of this rank's posted now: its time, and its price if it carries a fresh record."""
        post.t, post.cost = self.t, 0.0
        records = local.current().stats.records
        record = records[-1] if records else None
        if record is None or record is self._priced or record.kind not in CARRIES.get(post.call, ()):
            return
        self._priced = record
        rpn = self.machine.ranks_per_node
        intra = _on_one_node(comm.group, rpn)
        post.cost = self.machine.call_seconds(record.kind, record.comm_size, record.bytes, record.messages,
                                              intra=intra)

    @staticmethod
    def collective_done(group, posts):
        clocks = [p.request.owner.clock for p in posts]
        end = max([p.t for p in posts] + [c.link_free for c in clocks]) + max(p.cost for p in posts)
        for p, c in zip(posts, clocks):
            p.request.ready = c.link_free = end

    @staticmethod
    def message_done(group, send, recv):
        sender = send.request.owner.clock
        end = max(send.t, sender.link_free) + send.cost
        send.request.ready = recv.request.ready = sender.link_free = end

    def arrived(self, requests):
        return all(r.ready <= self.t for r in requests)

    def waited(self, requests):
        self.arrival = max(r.ready for r in requests)
        self.t = max(self.t, self.arrival)


def current():
    """The calling simulated rank's clock (a priced run's), or a RuntimeError."""
    clock = local.current().clock
    if clock is None:
        raise RuntimeError("refconv.simulated.clock.current: not on a rank of a priced run "
                           "(refconv.simulated.run(..., machine=...))")
    return clock


def _on_one_node(group, rpn):
    """Whether every member of ``group`` sits on one node of ``rpn`` ranks: computed once per group
    (O(members)), not at every post of every member (O(members^2) per collective)."""
    cached = getattr(group, "_one_node", None)
    if cached is None or cached[0] != rpn:
        cached = group._one_node = (rpn, len({m // rpn for m in group.members}) == 1)
    return cached[1]


def clocks_for(machine, world):
    """One clock per rank of ``world``, on ``machine`` (a Machine, a built-in name or a path)."""
    if not isinstance(machine, Machine):
        machine = pricing.machine.load(machine)
    return [Clock(machine, r) for r in range(world.size)]


def _tuple(v, kernel):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * len(kernel)


# -- what a run's clocks say --------------------------------------------------------------------------
def report(clocks):
    """Per rank: the time, the compute, and per kind of call (and in total) the seconds in flight,
    waited (exposed) and hidden, as training measures them (:func:`refconv.overlap.hidden_by_kind`):
    ``[{"rank", "seconds", "compute", "calls": {kind: {"calls", "in_flight", "waited", "hidden"}}}]``."""
    return [{"rank": c.rank, "seconds": c.t, "compute": sum(c.compute.values()), "calls": hidden_by_kind(c.events)}
            for c in clocks]
