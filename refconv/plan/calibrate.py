"""``refconv calibrate --out machine.yaml``: measure this machine's machine file.

Run it under mpiexec on the ranks of one node (2 to 4 here), or from one process, which
starts ``mpiexec -n RANKS`` itself (``--ranks``, default 4; collectives need 2 or more)::

    mpiexec -n 4 refconv calibrate --out machine.yaml          # < 1 minute
    refconv calibrate --out machine.yaml                       # the same: it starts mpiexec -n 4
    mpiexec -n 2 refconv calibrate --out m.yaml --quick        # a few seconds (tests)

Collectives: for each kind and each communicator size ``q`` (2, 4, ... up to the
ranks; ``q < P`` runs ``P / q`` groups at once, as channel groups do in training)
it times a sweep of buffer sizes and fits ``time = alpha(q) + beta(q) * m`` by least
squares (``m`` as :class:`refconv.cost_model.Call` records it; for ``alltoallv``
and ``halo`` alpha is per message).  One node gives only the ``intra`` figures:
``inter`` is written as a copy and the file says so.

Overlap: the share of an allreduce this machine hides behind compute polled as training
polls it (:func:`measure_overlap`), the file's ``overlap`` key; ``refconv plan``'s
overlapped step hides that share of each weight-gradient allreduce.

Compute: the backend's kernels (the ones training uses) are timed on every rank
at once on a sweep of local shapes, and ``time = t0 + work / rate`` is fitted per
shape class (1x1 and KxK convolutions, and apart KxKxK ones of volumes; batch norm,
pooling, ReLU and packing per byte; and ``layer``: a one-rank ``DistConv2d`` forward +
backward less its fitted kernels, per byte of its input and output).  The fit is always there because the planner
prices local shapes nobody measured (ResNet-50 split 1024 ways has hundreds), and because
the datasheet machine files can only give rates; the paper's per-shape table is added on
request for one model (``--model``, below).
The fit's relative error per class is written in the file's ``notes``.

With ``--model PRESET|FILE --batch B [--image-size S]`` it also times, after the
above, every local convolution that ``refconv plan`` prices for that model on
the ranks it runs on (each conv layer on every grid and algorithm the planner
enumerates, deduplicated), all ranks running the same shape at once, into the
file's ``compute.conv_table`` (see :mod:`refconv.pricing.machine`): the planner then
prices those shapes as measured, the paper's per-shape method, and any other shape
by the fit::

    mpiexec -n 4 refconv calibrate --out m.yaml --model resnet50 --batch 8   # + the table

BLAS threads per rank are pinned first (``refconv.threads.configure``, ``--threads``),
as training pins them: the rates are per rank at that count.  The timing is
``refconv.bench.common.time_ranks``, the benchmarks' own.
"""

import copy
import dataclasses
import datetime
import os
import statistics
import time
import warnings

import numpy

import yaml
from mpi4py import MPI

from refconv import ProcessGrid, checks, collectives, device, launch, threads, train_config
from refconv.backend import get_backend
from refconv.bench.common import time_ranks
from refconv.layers import DistConv2d
from refconv.pricing import graph, search
from refconv.pricing import machine as machine_mod
from refconv.pricing.machine import CONV_OPS, KINDS
from refconv.train import load_model_spec

COMPUTE_WINDOW_S = 0.02  # each compute sample: this long back to back on every rank at once
COLLECTIVE_WINDOW_S = 0.005  # each collective sample: this long back to back
SLOPE_FLOOR = 1e-15  # fit_line's slope where the time did not grow with the size: a rate of 1e15, "free"
RANKS = 4  # started from one process: the ranks of the docs' command (mpiexec -n 4 refconv calibrate)


HELP = "measure this machine's collectives and kernels into a machine file"
DESCRIPTION = ("Time collectives (a sweep of buffer sizes per communicator size, least-squares alpha-beta fit) "
               "and the local kernels (throughput fit per shape class) on every rank of MPI.COMM_WORLD; rank 0 "
               "writes the machine file. See docs/planning.md.")


def add_arguments(p):
    p.add_argument("--out", required=True, help="the machine file to write (.yaml)")
    p.add_argument("--ranks", type=int, default=None, help=f"ranks to start when run without mpiexec (default "
                                                           f"{RANKS}; collectives need 2 or more); under mpiexec, "
                                                           f"its -n")
    p.add_argument("--quick", action="store_true", help="few sizes and repeats: seconds, for tests")
    train_config.add_option(p, "backend", purpose="the kernels to time")
    p.add_argument("--name", default="this-machine", help="the machine's name in the file")
    train_config.add_option(p, "threads")
    train_config.add_option(p, "model", default=None, unset="no table", purpose="also time the local convolutions "
                            "`refconv plan` prices for this model on these ranks, into compute.conv_table")
    p.add_argument("--batch", type=int, help="global batch size of --model (required with it)")
    p.add_argument("--image-size", type=int, default=32, help="image height and width of --model (default 32; "
                                                               "depth, height and width for a model of volumes)")
    p.add_argument("--max-shapes", type=int, default=300, help="refuse a --model with more local shapes than this "
                                                                 "(default 300; about 0.4 s each on 4 ranks of the 2-core "
                                                                 "dev-cpu machine, 2026-11-30)")
    return p


def _median_time(comm, fn, repeats, window):
    """Median seconds of one call of ``fn`` on the slowest rank, each sample ``window``
    seconds of calls back to back on every rank at once.  No pause: the samples run back to
    back as training's calls do, at the BLAS threads training pins (one per rank once the
    ranks fill the cores, so no worker spins between samples)."""
    return statistics.median(time_ranks(comm, {"fn": fn}, repeats, 0, 0.0, window=window)["fn"])


def fit_line(x, y):
    """``(a, b)`` of ``y = a + b x`` minimising the squared *relative* errors (the sizes span
    orders of magnitude), both kept >= 0 (a time cannot shrink as the size grows)."""
    x, y = numpy.asarray(x, float), numpy.asarray(y, float)
    A = numpy.stack([numpy.ones(len(x)), x], axis=1) / y[:, None]
    (a, b), *_ = numpy.linalg.lstsq(A, numpy.ones(len(x)), rcond=None)
    if b <= 0:
        return float(numpy.median(y)), SLOPE_FLOOR
    if a < 0:
        b, a = float(numpy.median(y / x)), 0.0
    return float(a), float(b)


def fit_plane(x1, x2, y):
    """``(a, b, c)`` of ``y = a + b x1 + c x2`` by relative least squares, all kept >= 0 (a
    term fitted negative is dropped and the rest refitted)."""
    x1, x2, y = (numpy.asarray(v, float) for v in (x1, x2, y))
    A = numpy.stack([numpy.ones(len(y)), x1, x2], axis=1) / y[:, None]
    (a, b, c), *_ = numpy.linalg.lstsq(A, numpy.ones(len(y)), rcond=None)
    if c <= 0 or b <= 0:
        a, b = fit_line(x1, y)
        return a, b, 0.0
    if a < 0:
        A = numpy.stack([x1, x2], axis=1) / y[:, None]
        (b, c), *_ = numpy.linalg.lstsq(A, numpy.ones(len(y)), rcond=None)
        if b <= 0 or c <= 0:
            a, b = fit_line(x1, y)
            return a, b, 0.0
        a = 0.0
    return float(a), float(b), float(c)


def _fit_error(x, y, a, b):
    pred = a + b * numpy.asarray(x, float)
    return float(numpy.median(numpy.abs(pred - y) / numpy.asarray(y)))


def collective_calls(kind, sub, nbytes):
    """``(call, messages, m)``: a callable making one ``kind`` call of about ``nbytes`` on
    ``sub``, its point-to-point messages, and the bytes ``m`` as the cost model counts them
    (the full buffer; for ``alltoallv`` and ``halo`` the bytes this rank sends).

    The channel collectives work on activations split along the channel axis (axis 1 of
    ``(n, C, h, w)``), as the algorithms call them, so their packing is timed too.
    """
    q, me = sub.Get_size(), sub.Get_rank()
    n = max(q, nbytes // 4 // q * q)  # float32 elements, a multiple of q
    x = numpy.ones(n, numpy.float32)
    if kind == "allreduce":
        return (lambda: collectives.allreduce(sub, x)), 0, x.nbytes
    if kind in ("allgather", "reduce_scatter"):
        batch = 8 if n >= 8 * q * 16 else 1
        c = max(1, n // (batch * q * 16))  # channels per rank; 4 x 4 pixels each
        full = numpy.ones((batch, c * q, 4, 4), numpy.float32)
        if kind == "allgather":
            mine = numpy.ascontiguousarray(full[:, :c])
            return (lambda: collectives.allgather(sub, mine, [c] * q, axis=1)), 0, full.nbytes
        return (lambda: collectives.reduce_scatter(sub, full, [c] * q, axis=1)), 0, full.nbytes
    if kind == "alltoallv":  # m = bytes sent: q - 1 blocks
        block = max(1, n // max(q - 1, 1))
        blocks = [numpy.ones(block, numpy.float32) for _ in range(q)]
        return (lambda: collectives.alltoallv(sub, blocks, [(block,)] * q)), q - 1, block * 4 * (q - 1)
    peer = me ^ 1 if (me ^ 1) < q else me  # halo: one message to a neighbour and one back
    return (lambda: collectives.exchange(sub, {peer: x}, {peer: (n,)}, numpy.float32)), 1, x.nbytes


OVERLAP_CHUNKS = 16  # the compute behind the allreduce, in chunks with collectives.progress() between (as training polls)


def measure_overlap(comm, quick):
    """``(share, note)``: how much of a gradient allreduce this machine hides behind compute,
    ``(blocking - overlapped) / allreduce alone`` round by round (median, clipped to 0..1),
    where the compute (float32 matrix products) takes about the allreduce's time and is
    polled between chunks, as training polls between layers.  The planner's overlapped step
    hides this share of each allreduce (``refconv.pricing.perf.overlapped_step``)."""
    nbytes = 2**19 if quick else 2**23
    x = numpy.ones(nbytes // 4, numpy.float32)
    a = numpy.random.default_rng(comm.Get_rank()).standard_normal((128, 128), dtype=numpy.float32)
    alone = statistics.median(time_ranks(comm, {"c": lambda: collectives.iallreduce_(comm, x).wait()}, 3, 1, 0.0)["c"])
    chunk = statistics.median(time_ranks(comm, {"k": lambda: a @ a}, 3, 1, 0.0)["k"])
    per_chunk = max(1, round(collectives.allreduce(comm, numpy.array([alone / OVERLAP_CHUNKS / chunk]),
                                                   op="max")[0]))

    def compute():
        for _ in range(OVERLAP_CHUNKS):
            for _ in range(per_chunk):
                a @ a
            collectives.progress()

    def overlapped():
        request = collectives.iallreduce_(comm, x, overlap="calibrate")
        compute()
        request.wait()

    times = time_ranks(comm, {"comm": lambda: collectives.iallreduce_(comm, x).wait(),
                              "blocking": lambda: (collectives.iallreduce_(comm, x).wait(), compute()),
                              "overlap": overlapped}, 3 if quick else 7, 1, 0.0)
    shares = [(b - o) / c for b, o, c in zip(times["blocking"], times["overlap"], times["comm"])]
    share = min(1.0, max(0.0, statistics.median(shares)))
    return float(f"{share:.3g}"), (f"overlap: {share:.0%} of an allreduce of {nbytes / 2**20:g} MiB hidden behind "
                                   f"as much compute, polled {OVERLAP_CHUNKS} times (median of {len(shares)} rounds)")


def measure_collectives(comm, quick):
    """``({kind: {q: [alpha, beta]}}, notes)``.

    Every (kind, q, size) is a contender of one :func:`time_ranks` call: each takes its
    turn in every round, so a change of load during the run (the machine may be shared)
    hits them all alike instead of whichever kind or ``q`` was being timed then."""
    P = comm.Get_size()
    sizes = [2**k for k in ((10, 14, 18) if quick else range(10, 23))]
    repeats = 3 if quick else 7
    sizes_q = [2**k for k in range(1, P.bit_length()) if P % 2**k == 0]  # 2, 4, ... dividing P
    sizes_q += [P] if P > 1 and P not in sizes_q else []  # and P itself (3 ranks: q = 3)
    if not sizes_q:
        return {k: {} for k in KINDS}, ["one rank: no collective measured"]
    grids = {q: ProcessGrid(comm, sample=P // q, channel=q) for q in sizes_q}
    calls, counted = {}, {}
    for q, grid in grids.items():
        for kind in KINDS:
            for m in sizes:
                fn, _, counted[kind, q, m] = collective_calls(kind, grid.channel_comm, m)
                fn()  # warm-up
                calls[kind, q, m] = fn
    rounds = time_ranks(comm, calls, repeats, 0, 0.0, window=COLLECTIVE_WINDOW_S)
    out, notes = {k: {} for k in KINDS}, []
    for q in sizes_q:
        for kind in KINDS:
            xs = [counted[kind, q, m] for m in sizes]
            ys = [statistics.median(rounds[kind, q, m]) for m in sizes]
            a, b = fit_line(xs, ys)
            notes.append(f"{kind} q={q}: fit median relative error {_fit_error(xs, ys, a, b):.0%}")
            out[kind][q] = [a / (q - 1) if kind == "alltoallv" else a, b]  # alltoallv: alpha per message
    for grid in grids.values():
        grid.free()
    return out, notes


def conv_shapes(quick):
    """(N, C, F, H, K): local shapes of the sweep, 1x1 and 3x3, narrow and wide (F from C/4
    to 4C, so that FLOPs and im2col columns vary apart)."""
    if quick:
        return [(2, 8, 8, 8, 1), (2, 16, 16, 8, 1), (2, 8, 4, 8, 1), (2, 8, 8, 8, 3), (2, 16, 16, 8, 3),
                (2, 16, 4, 8, 3)]
    out = []
    for K in (1, 3):
        for N, C, F, H in ((2, 16, 16, 16), (4, 32, 32, 16), (4, 64, 64, 8), (8, 32, 32, 16), (4, 64, 64, 16),
                           (8, 64, 64, 16), (8, 64, 16, 16), (8, 16, 64, 16), (4, 128, 32, 8), (4, 32, 128, 8)):
            out.append((N, C, F, H, K))
    return out


def volume_shapes(quick):
    """(N, C, F, S, 3): local 3x3x3 convolutions of S x S x S volumes, the sweep of the
    ``kxkxk`` class (F from C/4 to 4C, as :func:`conv_shapes`)."""
    if quick:
        return [(2, 4, 4, 6, 3), (2, 8, 8, 6, 3), (2, 8, 2, 6, 3)]
    return [(N, C, F, S, 3) for N, C, F, S in ((2, 8, 8, 8), (2, 16, 16, 8), (4, 16, 16, 8), (2, 32, 32, 8),
                                               (2, 16, 64, 6), (2, 64, 16, 6), (4, 4, 16, 12), (2, 32, 8, 8),
                                               (2, 64, 64, 4), (1, 16, 16, 12))]


def measure_compute(comm, backend, quick):
    rng = numpy.random.default_rng(comm.Get_rank())
    repeats = 2 if quick else 5
    rows = {op: {c: ([], [], []) for c in ("1x1", "kxk", machine_mod.VOLUME_CLASS)}  # (FLOPs, columns bytes, s)
            for op in CONV_OPS}
    # The sweep's shapes as the algorithms convolve them (a window of the padded input, padding 0),
    # timed as the conv table is: every (shape, pass) a contender of each round.  Images and
    # volumes: a 3x3x3 kernel's passes are fitted apart (docs/planning.md, "Models of volumes").
    sweep = [(s, 2) for s in conv_shapes(quick)] + [(s, 3) for s in volume_shapes(quick)]
    windows = [machine_mod.ConvShape(N, C, F, (H + 2 * (K // 2),) * dims, (K,) * dims)
               for (N, C, F, H, K), dims in sweep]
    for ((N, C, F, H, K), dims), entry in zip(sweep, measure_conv_table(comm, backend, windows, repeats)):
        cls = "1x1" if K == 1 else "kxk" if dims == 2 else machine_mod.VOLUME_CLASS
        for op in CONV_OPS:
            rows[op][cls][0].append(2 * N * F * C * (H * K) ** dims)  # FLOPs
            rows[op][cls][1].append(N * C * (H * K) ** dims * 4)  # bytes of im2col columns
            rows[op][cls][2].append(entry[op])
    sizes = [(2, 8, 16), (4, 16, 16)] if quick else [(2, 16, 16), (4, 32, 16), (8, 32, 32), (8, 64, 32)]
    compute, notes = {}, []
    kernel_fits = {op: {cls: fit_plane(*xyz) for cls, xyz in classes.items()} for op, classes in rows.items()}
    for op, classes in rows.items():
        compute[op] = {}
        for cls, (flops, columns, ys) in classes.items():
            a, b, c = kernel_fits[op][cls]
            compute[op][cls] = {"t0": a, "rate": 1 / b, **({"bw": 1 / c} if c > 0 else {})}
            pred = a + b * numpy.asarray(flops, float) + c * numpy.asarray(columns, float)
            err = float(numpy.median(numpy.abs(pred - ys) / numpy.asarray(ys)))
            notes.append(f"{op} {cls}: fit median relative error {err:.0%}")
    measures = {op: (lambda sz, op=op: measure_bandwidth(comm, backend, rng, op, sz, repeats), sizes, _wider)
                for op in ("batchnorm", "pool", "elementwise", "pack")}
    measures["layer"] = (lambda sz: measure_layer_overhead(comm, backend, sz, repeats),
                         layer_shapes(quick), _larger_images)
    for op, (measure, first, grow) in measures.items():
        a, b, (xs, ys), note = fit_rate(measure, first, grow, op)
        compute[op] = {"t0": a, "rate": 1 / b}
        notes.append(note or f"{op}: fit median relative error {_fit_error(xs, ys, a, b):.0%}")
    return compute, notes


RETRIES = 2  # a rate whose time did not grow with the size is measured again, at 4x the bytes each time


def _wider(sizes):
    """(N, C, H) sizes with twice the rows and columns: 4x the bytes."""
    return [(N, C, 2 * H) for N, C, H in sizes]


def _larger_images(shapes):
    """(N, C, F, H, K) conv shapes with twice the rows and columns: 4x the bytes."""
    return [(N, C, F, 2 * H, K) for N, C, F, H, K in shapes]


def fit_rate(measure, sizes, grow, what):
    """``(t0, seconds per unit, (xs, ys), note)`` of ``measure(sizes)`` (-> ``(xs, ys)``), fitted by
    :func:`fit_line`.  Where the time did not grow with the size, it is measured again at
    ``grow(sizes)``, up to :data:`RETRIES` times.  If it never grows, every second measured is
    charged per unit (``t0`` 0, the median of ``y / x``: an upper bound, never free), and ``note``
    says which item and how to measure it.  Collective: the times are the slowest rank's, so
    every rank decides alike."""
    for attempt in range(RETRIES + 1):
        xs, ys = measure(sizes)
        a, b = fit_line(xs, ys)
        if b > SLOPE_FLOOR:
            note = (f"{what}: fit median relative error {_fit_error(xs, ys, a, b):.0%} (measured again "
                    f"{attempt} time{'s' if attempt > 1 else ''}: the time grew only at larger sizes)") if attempt else None
            return a, b, (xs, ys), note
        sizes = grow(sizes)
    b = float(numpy.median(numpy.asarray(ys, float) / numpy.asarray(xs, float)))
    note = (f"{what}: its time did not grow with the size in {RETRIES + 1} tries up to {max(xs):,} bytes, so it is "
            f"priced at its measured seconds per byte with no fixed cost ({1 / b:.3g} bytes/s, an upper bound of "
            f"its time, not free); to measure its rate, run refconv calibrate again on a quieter machine, "
            f"without --quick")
    warnings.warn(note, stacklevel=2)
    return 0.0, b, (xs, ys), note


def measure_bandwidth(comm, backend, rng, op, sizes, repeats):
    """``(bytes, seconds)`` of ``op`` (batchnorm, pool, elementwise, pack) on ``(N, C, H, H)``
    float32 arrays of each of ``sizes``: its forward and backward, as the layers compute them."""
    xs, ys = [], []
    for N, C, H in sizes:
        x = backend.asarray(rng.standard_normal((N, C, H, H), dtype=numpy.float32))
        g = backend.asarray(numpy.ones(C, numpy.float32))

        def bn():
            mean = backend.batch_norm_sum(x) / (N * H * H)  # as refconv.layers.BatchNorm2d computes
            sq = backend.batch_norm_centered_sum_squares(x, mean)
            invstd = 1 / numpy.sqrt(sq / (N * H * H) + 1e-5)
            y = backend.batch_norm_apply(x, mean, invstd, g, g)
            sdy, sdyx = backend.batch_norm_grad_sums(y, x, mean, invstd)
            backend.batch_norm_backward_apply(y, x, mean, invstd, g, sdy, sdyx, N * H * H)

        def pool():
            y, arg = backend.max_pool2d_forward(x, 2)
            backend.max_pool2d_backward(y, arg, x.shape, 2)

        def relu():
            backend.relu_backward(backend.relu_forward(x), x)

        def pack():  # a strided block into a contiguous buffer, as a halo or a shuffle packs
            backend.xp.ascontiguousarray(x[:, :C // 2])

        fn = {"batchnorm": bn, "pool": pool, "elementwise": relu, "pack": pack}[op]
        xs.append(x.size * 4 if op != "pack" else x.size * 2)  # pack: the half it copies
        ys.append(_median_time(comm, fn, repeats, COMPUTE_WINDOW_S))
    return xs, ys


def layer_shapes(quick):
    """(N, C, F, H, 1): one-rank convolutions of few channels and many pixels, whose time beyond
    the kernels (padding, packing, the layer's bookkeeping) grows with the bytes: the sweep's
    shapes did not make it grow (issue 35: ``layer`` came out free)."""
    return [(2, 4, 4, H, 1) for H in ((16, 48) if quick else (16, 32, 48, 64))]


def measure_layer_overhead(comm, backend, shapes, repeats):
    """(bytes, seconds): a one-rank DistConv2d's forward + backward less its three kernels, each
    kernel timed on the same shape (:func:`measure_conv_table`: subtracting the sweep's fit left
    less than nothing at these shapes), against the bytes of its input and output."""
    grid = ProcessGrid(collectives.comm_self())
    rng = numpy.random.default_rng(0)
    windows = [machine_mod.ConvShape(N, C, F, (H + 2 * (K // 2),) * 2, (K,) * 2) for N, C, F, H, K in shapes]
    kernels = [sum(entry[op] for op in CONV_OPS) for entry in measure_conv_table(comm, backend, windows, repeats)]
    xs, ys = [], []
    for (N, C, F, H, K), kernel_s in zip(shapes, kernels):
        layer = DistConv2d(C, F, K, padding=K // 2, grid=grid, backend="numpy", input_shape=(N, C, H, H))
        x = rng.standard_normal((N, C, H, H)).astype(numpy.float32)
        dy = rng.standard_normal((N, F, H, H)).astype(numpy.float32)

        def fn():
            layer.forward(x)
            layer.backward(dy)

        t = _median_time(comm, fn, repeats, COMPUTE_WINDOW_S)  # its untimed first call warms up
        xs.append((N * C + N * F) * H * H * 4)
        ys.append(max(t - kernel_s, 1e-6))
    return xs, ys


class _AskedShapes:
    """A stand-in ``conv_table`` with no entries that keeps every local shape asked for."""

    def __init__(self):
        self.shapes = {}  # ConvShape -> None: a set in the order asked

    def get(self, key, default=None):
        self.shapes[key[1]] = None
        return default


def priced_shapes(machine, price):
    """The :class:`ConvShape` s that ``price(m)`` asks ``m.conv_seconds`` for, deduplicated in
    order: ``m`` is ``machine`` with a recording table, so the shapes are exactly those the
    pricing code (refconv.pricing.perf) keys, with no second copy of how it derives them."""
    asked = _AskedShapes()
    price(dataclasses.replace(machine, conv_table=asked))
    return list(asked.shapes)


def model_shapes(spec, input_shape, P, machine):
    """The local conv shapes ``refconv plan`` prices for ``spec`` on ``P`` ranks: every stage on
    every grid, algorithm and p_f the planner enumerates (raises BindError as plan does)."""

    def price(m):
        planner = search.Planner(spec, input_shape, P, m)
        for stage in graph.stages(planner.elements):
            planner.options(stage)

    return priced_shapes(machine, price)


def measure_conv_table(comm, backend, shapes, repeats, say=lambda *a: None):
    """``[{shape: [...], conv_fwd: s, conv_bwd_data: s, conv_bwd_filter: s}]``: each local shape's
    three passes (the backend's ``conv2d_*``, or ``conv3d_*`` for a volume's shape), ``padding=0`` on
    the window as the algorithms run them, with every rank running the same pass at once.  Every (shape, pass) is a contender of each round, as the collectives
    are: a change of load during the run (the machine may be shared) hits every shape alike
    instead of whichever was being timed then.  All shapes' arrays are held at once."""
    rng = numpy.random.default_rng(comm.Get_rank())
    passes = {}
    for i, s in enumerate(shapes):
        local = dict(stride=s.stride, dilation=s.dilation, groups=s.groups)
        fwd, data, filt = (getattr(backend, f"conv{s.dims}d_{p}") for p in ("forward", "backward_data",
                                                                           "backward_filter"))
        x = backend.asarray(rng.standard_normal((s.n, s.C) + s.window, dtype=numpy.float32))
        w = backend.asarray(rng.standard_normal((s.F, s.C // s.groups) + s.kernel, dtype=numpy.float32))
        dy = fwd(x, w, **local)  # (n, F, h, w), or (n, F, d, h, w): the output block
        passes[i, "conv_fwd"] = lambda x=x, w=w, local=local, fwd=fwd: fwd(x, w, **local)
        passes[i, "conv_bwd_data"] = lambda dy=dy, w=w, x=x, local=local, data=data: data(dy, w, x.shape, **local)
        passes[i, "conv_bwd_filter"] = lambda x=x, dy=dy, w=w, local=local, filt=filt: filt(x, dy, w.shape, **local)
    started = time.perf_counter()
    rounds = time_ranks(comm, passes, repeats, 0, 0.0, window=COMPUTE_WINDOW_S,
                        progress=lambda done: say(f"conv table: round {done}/{repeats} of {len(shapes)} local "
                                                  f"shapes x 3 passes ({time.perf_counter() - started:.0f} s)"))
    return [{"shape": s.as_list(), **{op: float(f"{statistics.median(rounds[i, op]):.4g}") for op in CONV_OPS}}
            for i, s in enumerate(shapes)]


def calibrate(comm, backend_name="auto", quick=False, name="this-machine", shapes=(), say=lambda *a: None):
    """The machine file as a dict (every rank gets the same); ``shapes`` (ConvShapes, e.g. of
    :func:`model_shapes`) are timed into ``compute.conv_table`` as well."""
    backend = get_backend(backend_name)
    started = time.perf_counter()
    load = os.getloadavg()[0]  # a shared machine measures slow when busy: the file says how busy
    tables, cnotes = measure_collectives(comm, quick)
    overlap, onote = measure_overlap(comm, quick) if comm.Get_size() > 1 else (1.0, "overlap: one rank, nothing to hide")
    compute, knotes = measure_compute(comm, backend, quick)
    P = comm.Get_size()
    if P >= 2:
        links = {k: {"table": {q: [float(f"{a:.4g}"), float(f"{b:.4g}")] for q, (a, b) in tables[k].items()}}
                 for k in KINDS}
    else:  # one rank: nothing to measure; zero-cost links (every communicator has one rank)
        links = {k: {"alpha": 0.0, "beta": 0.0} for k in KINDS}
    round_rate = lambda r: {k: float(f"{v:.4g}") for k, v in r.items()}  # noqa: E731
    if shapes:
        say(f"conv table: timing {len(shapes)} local shapes of the model")
        compute["conv_table"] = measure_conv_table(comm, backend, shapes, 2 if quick else 5, say)
        knotes.append(f"conv_table: {len(shapes)} local shapes of --model at {P} ranks, every rank timing the "
                      f"same shape at once")
    doc = {
        "name": name,
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "source": f"refconv calibrate{' --quick' if quick else ''} on {P} ranks of one node "
                  f"({os.cpu_count()} CPUs, load average {load:.1f} at the start, "
                  f"{device.threads_per_rank()} BLAS thread(s) per rank), backend "
                  f"{type(backend).__name__}, {time.perf_counter() - started:.0f} s",
        "ranks_per_node": P,
        "overlap": overlap,
        "collectives": {"intra": links, "inter": copy.deepcopy(links)},
        "compute": {op: (v if op == "conv_table" else {c: round_rate(r) for c, r in v.items()}
                         if op.startswith("conv") else round_rate(v)) for op, v in compute.items()},
        "notes": ["one node: 'inter' is a copy of 'intra' (nothing across nodes was measured)", onote]
                 + cnotes + knotes,
    }
    free = unmeasured(doc)
    if free:
        message = (f"the time of {', '.join(free)} did not grow with the size, so no rate was measured: the file "
                   f"prices it as free (rate {1 / SLOPE_FLOOR:.0e}); measure again on a quieter machine"
                   f"{' and without --quick' if quick else ''}")
        doc["notes"].append(message)
        warnings.warn(message, stacklevel=2)
    return doc


def unmeasured(doc):
    """The entries of a machine file (a dict) whose fitted slope hit ``SLOPE_FLOOR``: a collective
    kind's beta (per q), or a kernel's seconds per unit of work (its ``rate`` 1 / SLOPE_FLOOR)."""
    out = []
    for kind, link in doc["collectives"]["intra"].items():
        out += [f"{kind} q={q}" for q, (_, beta) in link.get("table", {}).items() if beta <= SLOPE_FLOOR]
    for op, value in doc["compute"].items():
        if op == "conv_table":
            continue
        classes = value.items() if op.startswith("conv") else [(None, value)]
        out += [f"{op}{' ' + cls if cls else ''}" for cls, fit in classes if fit["rate"] >= 1 / SLOPE_FLOOR * 0.999]
    return out


def run(args):
    comm = MPI.COMM_WORLD
    if not args.out.endswith((".yaml", ".yml")):  # checked identically on every rank, before any collective
        raise ValueError(f"--out: expected a .yaml path, got {args.out!r}")
    checks.output_file(args.out, "--out")  # on every rank, before the timing: not on rank 0 at the end
    if args.ranks is not None and args.ranks < 2:
        raise ValueError(f"--ranks: expected an int >= 2 (collectives are timed between ranks), got {args.ranks}")
    if comm.Get_size() > 1 and args.ranks not in (None, comm.Get_size()):
        raise ValueError(f"--ranks: {args.ranks} given, but mpiexec started {comm.Get_size()}; leave --ranks out "
                         f"under mpiexec (it is for runs without it)")
    ranks = comm.Get_size() if comm.Get_size() > 1 else args.ranks or RANKS
    shapes = _model_shapes(args, ranks)  # every rank alike, before any collective (and before starting them)
    if comm.Get_size() == 1:  # from one process: start the ranks (as refconv demo does)
        print(f"refconv calibrate: starting mpiexec -n {ranks} (collectives need ranks; --ranks sets how many)",
              flush=True)
        return launch.relaunch(ranks, args.argv)
    choice = threads.configure(comm, args.threads)  # as training runs: the rates are per rank at this count
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    say(choice.describe(), flush=True)
    doc = calibrate(comm, args.backend, args.quick, args.name, shapes, lambda text: say(text, flush=True))
    if comm.Get_rank() == 0:
        with open(args.out, "w") as f:
            f.write("# Measured by refconv calibrate (see the 'source' and 'notes' keys).\n")
            yaml.safe_dump(doc, f, sort_keys=False, default_flow_style=None)
        print(f"wrote {args.out} ({doc['source']})", flush=True)
    return 0


def _model_shapes(args, P):
    """The local conv shapes of ``--model`` on ``P`` ranks (empty without it); ValueError naming
    the option (a BindError from the planner names the layer)."""
    if args.model is None:
        if args.batch is not None:
            raise ValueError("--batch: given without --model (it is the batch of --model's local shapes)")
        return []
    if args.batch is None or args.batch < 1 or args.image_size < 1 or args.max_shapes < 1:
        raise ValueError(f"--batch, --image-size, --max-shapes: expected positive ints with --model, got "
                         f"{args.batch}, {args.image_size}, {args.max_shapes}")
    spec = load_model_spec(args.model)  # a file that does not parse: "--model: ..." (as refconv train and plan)
    in_channels = spec.get("in_channels", 3) if isinstance(spec, dict) else 3
    dims = graph.dims_of(spec) if isinstance(spec, dict) else 2
    try:
        shapes = model_shapes(spec, (args.batch, in_channels) + (args.image_size,) * dims, P,
                              machine_mod.load(machine_mod.DEFAULT_MACHINE))  # any machine: only the shapes count
    except graph.BindError as exc:
        raise graph.BindError(f"--model/--image-size: {exc}") from None
    if len(shapes) > args.max_shapes:
        raise ValueError(f"--max-shapes: the model has {len(shapes)} local conv shapes on {P} ranks, more than "
                         f"{args.max_shapes}; raise --max-shapes (each takes about 0.4 s on 4 ranks here) or give "
                         f"a smaller model")
    return shapes
