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
backward less its kernels timed on the same shape in the same rounds, per byte of its input and output).  The fit is always there because the planner
prices local shapes nobody measured (ResNet-50 split 1024 ways has hundreds), and because
the datasheet machine files can only give rates; the paper's per-shape table is added on
request for one model (``--model``, below).
The fit's relative error per class is written in the file's ``notes``.

No measured item is priced free: where an item's fitted time did not grow with its size, it alone
is measured again at larger sizes (:func:`until_grown`, up to :data:`RETRIES` times); if it never
grows, :class:`Unmeasured` ends the command (status 4, no file) naming each such item, the sizes
tried and how to measure it.

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

import numpy

import yaml
from mpi4py import MPI

from refconv import ProcessGrid, checks, collectives, device, failure, launch, threads, train_config
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
               "writes the machine file. An item whose time does not grow with its size is measured again at "
               "larger sizes; if it never grows, no file is written and the command exits with status 4, naming "
               "it. See docs/planning.md.")


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
    """``({kind: {q: [alpha, beta]}}, notes, failed)``; ``failed`` lists ``(item, what was tried)``
    for each (kind, q) whose time did not grow with the buffer in :data:`RETRIES` + 1 sweeps
    (:func:`until_grown`, each 4x the bytes of the last).

    Every (kind, q, size) is a contender of one :func:`time_ranks` call: each takes its
    turn in every round, so a change of load during the run (the machine may be shared)
    hits them all alike instead of whichever kind or ``q`` was being timed then."""
    P = comm.Get_size()
    sizes = [2**k for k in ((10, 14, 18) if quick else range(10, 23))]
    repeats = 3 if quick else 7
    sizes_q = [2**k for k in range(1, P.bit_length()) if P % 2**k == 0]  # 2, 4, ... dividing P
    sizes_q += [P] if P > 1 and P not in sizes_q else []  # and P itself (3 ranks: q = 3)
    if not sizes_q:
        return {k: {} for k in KINDS}, ["one rank: no collective measured"], []
    grids = {q: ProcessGrid(comm, sample=P // q, channel=q) for q in sizes_q}

    def measure(pending):
        calls, counted = {}, {}
        for (kind, q), ms in pending.items():
            for m in ms:
                calls[kind, q, m], _, counted[kind, q, m] = collective_calls(kind, grids[q].channel_comm, m)
        rounds = time_ranks(comm, calls, repeats, 0, 0.0, window=COLLECTIVE_WINDOW_S)  # first call: warm-up
        return {(kind, q): ([counted[kind, q, m] for m in ms], [statistics.median(rounds[kind, q, m]) for m in ms])
                for (kind, q), ms in pending.items()}

    done, failed = until_grown(measure, {(kind, q): sizes for q in sizes_q for kind in KINDS},
                               lambda item, ms: [4 * m for m in ms], lambda item, xy: _grown_line(*xy))
    out, notes = {k: {} for k in KINDS}, []
    for (kind, q), ((a, b), (xs, ys), tries) in done.items():
        notes.append(f"{kind} q={q}: fit median relative error {_fit_error(xs, ys, a, b):.0%}{_again(tries, xs)}")
        out[kind][q] = [a / (q - 1) if kind == "alltoallv" else a, b]  # alltoallv: alpha per message
    for grid in grids.values():
        grid.free()
    return out, notes, [(f"{kind} q={q}", f"buffers of {_bytes(min(xs))} to {_bytes(max(xs))}")
                        for (kind, q), (xs, _) in failed.items()]


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
    """``(compute, notes, failed)``: the ``compute`` section of the file (every rate measured),
    a note per entry, and ``(item, what was tried)`` for each whose time did not grow with its
    work in :data:`RETRIES` + 1 sweeps (:func:`until_grown`)."""
    rng = numpy.random.default_rng(comm.Get_rank())
    repeats = 2 if quick else 5
    # The sweep's shapes as the algorithms convolve them (a window of the padded input, padding 0),
    # timed as the conv table is: every (shape, pass) a contender of each round.  Images and
    # volumes: a 3x3x3 kernel's passes are fitted apart (docs/planning.md, "Models of volumes").
    sweep = {"1x1": [], "kxk": [], machine_mod.VOLUME_CLASS: []}
    for s in conv_shapes(quick):
        sweep["1x1" if s[-1] == 1 else "kxk"].append(s)
    sweep[machine_mod.VOLUME_CLASS] = volume_shapes(quick)

    def measure_convs(pending):
        """{(op, cls): (FLOPs, bytes of im2col columns, seconds)} of each pending class's shapes,
        every (shape, pass) of them a contender of the same rounds."""
        classes = {cls: shapes for (op, cls), shapes in pending.items()}
        timed = [(cls, s) for cls, shapes in classes.items() for s in shapes]
        dims = lambda cls: 3 if cls == machine_mod.VOLUME_CLASS else 2  # noqa: E731
        windows = [machine_mod.ConvShape(N, C, F, (H + 2 * (K // 2),) * dims(cls), (K,) * dims(cls))
                   for cls, (N, C, F, H, K) in timed]
        entries = measure_conv_table(comm, backend, windows, repeats)
        out = {}
        for op, cls in pending:
            rows = [(2 * N * F * C * (H * K) ** dims(cls), N * C * (H * K) ** dims(cls) * 4, entry[op])
                    for (c, (N, C, F, H, K)), entry in zip(timed, entries) if c == cls]
            out[op, cls] = tuple(list(v) for v in zip(*rows))
        return out

    def fit_conv(item, data):
        a, b, c = fit_plane(*data)
        return (a, b, c) if b > SLOPE_FLOOR else None

    done, failed = until_grown(measure_convs, {(op, cls): shapes for op in CONV_OPS for cls, shapes in sweep.items()},
                               _larger_convs, fit_conv)
    compute, notes, failed_items = {op: {} for op in CONV_OPS}, [], []
    for (op, cls), ((a, b, c), (flops, columns, ys), tries) in done.items():
        compute[op][cls] = {"t0": a, "rate": 1 / b, **({"bw": 1 / c} if c > 0 else {})}
        pred = a + b * numpy.asarray(flops, float) + c * numpy.asarray(columns, float)
        err = float(numpy.median(numpy.abs(pred - ys) / numpy.asarray(ys)))
        notes.append(f"{op} {cls}: fit median relative error {err:.0%}{_again(tries, flops, 'FLOPs')}")
    failed_items += [(f"{op} {cls}", f"{min(flops):.3g} to {max(flops):.3g} FLOPs")
                    for (op, cls), (flops, _, _) in failed.items()]

    sizes = [(2, 8, 16), (4, 16, 16)] if quick else [(2, 16, 16), (4, 32, 16), (8, 32, 32), (8, 64, 32)]
    measures = {op: (lambda sz, op=op: measure_bandwidth(comm, backend, rng, op, sz, repeats), sizes, _wider)
                for op in ("batchnorm", "pool", "elementwise", "pack")}
    measures["layer"] = (lambda sz: measure_layer_overhead(comm, backend, sz, repeats),
                         layer_shapes(quick), _larger_images)
    done, failed = until_grown(lambda pending: {op: measures[op][0](sz) for op, sz in pending.items()},
                               {op: first for op, (_, first, _) in measures.items()},
                               lambda op, sz: measures[op][2](sz), lambda item, xy: _grown_line(*xy))
    for op, ((a, b), (xs, ys), tries) in done.items():
        compute[op] = {"t0": a, "rate": 1 / b}
        notes.append(f"{op}: fit median relative error {_fit_error(xs, ys, a, b):.0%}{_again(tries, xs)}")
    failed_items += [(op, f"{_bytes(min(xs))} to {_bytes(max(xs))}") for op, (xs, _) in failed.items()]
    order = list(CONV_OPS) + list(measures)  # the file's order, whatever order the retries finished in
    compute = {op: ({cls: compute[op][cls] for cls in sweep if cls in compute[op]} if op in CONV_OPS else compute[op])
               for op in order if op in compute}
    return compute, notes, failed_items


RETRIES = 2  # an item whose time did not grow with its size is measured again, larger each time


def until_grown(measure, sizes, grow, fit):
    """Measure each item until its fitted time grows with its size.

    ``measure({item: sizes})`` -> ``{item: data}`` times every pending item at once;
    ``fit(item, data)`` -> its fitted figures, or None where the time did not grow; an item
    that did not is measured again at ``grow(item, sizes)``, up to :data:`RETRIES` times.
    Returns ``({item: (figures, data, retries)}, {item: data of its last try})``: the second
    holds what never grew.  The times are the slowest rank's (:func:`time_ranks`), so every
    rank decides alike."""
    done, pending = {}, dict(sizes)
    for attempt in range(RETRIES + 1):
        data = measure(pending)
        for item in list(pending):
            figures = fit(item, data[item])
            if figures is not None:
                done[item] = (figures, data[item], attempt)
                del pending[item]
            elif attempt < RETRIES:
                pending[item] = grow(item, pending[item])
        if not pending:
            break
    return done, {item: data[item] for item in pending}


def _grown_line(xs, ys):
    """``(t0, seconds per unit)`` of :func:`fit_line`, or None where the time did not grow."""
    a, b = fit_line(xs, ys)
    return (a, b) if b > SLOPE_FLOOR else None


def _again(tries, xs, unit="bytes"):
    """A note's tail saying an item was measured again (nothing if it was not)."""
    if not tries:
        return ""
    return (f" (measured again {tries} time{'s' if tries > 1 else ''}: its time grew only at larger sizes, "
            f"{min(xs):.3g} to {max(xs):.3g} {unit})")


def _bytes(n):
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB" if n >= 2**10 else f"{n:.0f} bytes"


def _wider(sizes):
    """(N, C, H) sizes with twice the rows and columns: 4x the bytes."""
    return [(N, C, 2 * H) for N, C, H in sizes]


def _larger_images(shapes):
    """(N, C, F, H, K) conv shapes with 4x the rows and columns: 16x the bytes.  ``layer`` is a
    difference of two times of about its size (the layer's less its kernels'), so its per-byte part
    shows only where it outgrows their noise: at 4x the bytes a try, a busy machine (load 4.5 on
    2 cores) left it unmeasured up to 2.25 MiB in one quick run of five."""
    return [(N, C, F, 4 * H, K) for N, C, F, H, K in shapes]


def _larger_convs(item, shapes):
    """A conv class's (N, C, F, H, K) sweep with 4x the channels in and out: 16x the FLOPs, 4x the
    im2col columns.  The GEMM then outweighs the column copies and the call's fixed cost, which at
    --quick's small shapes on a busy machine hid the FLOPs' share (twice the rows and columns
    instead grew both terms alike, and 4x the FLOPs twice left 1x1 unmeasured at 1 MFLOP)."""
    return [(N, 4 * C, 4 * F, H, K) for N, C, F, H, K in shapes]


class Unmeasured(failure.SharedFailure):
    """An item whose time did not grow with its size in every try: no rate was measured, so no file
    is written (status 4)."""

    status = 4


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
    """(bytes, seconds): a one-rank DistConv2d's forward + backward less its three kernels on the
    same shape, against the bytes of its input and output.  The layers and their kernels are
    contenders of the same rounds, and the difference is taken round by round (median over the
    rounds): timed in two runs apart, a change of load between them (the machine may be shared)
    outweighed the difference, which then did not grow with the bytes."""
    grid = ProcessGrid(collectives.comm_self())
    rng = numpy.random.default_rng(comm.Get_rank())
    windows = [machine_mod.ConvShape(N, C, F, (H + 2 * (K // 2),) * 2, (K,) * 2) for N, C, F, H, K in shapes]
    contenders = _conv_passes(backend, windows, rng)
    for i, (N, C, F, H, K) in enumerate(shapes):
        layer = DistConv2d(C, F, K, padding=K // 2, grid=grid, backend="numpy", input_shape=(N, C, H, H))
        x = rng.standard_normal((N, C, H, H)).astype(numpy.float32)
        dy = rng.standard_normal((N, F, H, H)).astype(numpy.float32)
        contenders[i, "layer"] = lambda layer=layer, x=x, dy=dy: (layer.forward(x), layer.backward(dy))
    rounds = time_ranks(comm, contenders, repeats, 0, 0.0, window=COMPUTE_WINDOW_S)  # first call: warm-up
    xs, ys = [], []
    for i, (N, C, F, H, K) in enumerate(shapes):
        beyond = [t - sum(k) for t, *k in zip(rounds[i, "layer"], *(rounds[i, op] for op in CONV_OPS))]
        xs.append((N * C + N * F) * H * H * 4)
        ys.append(max(statistics.median(beyond), 1e-6))
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
    passes = _conv_passes(backend, shapes, numpy.random.default_rng(comm.Get_rank()))
    started = time.perf_counter()
    rounds = time_ranks(comm, passes, repeats, 0, 0.0, window=COMPUTE_WINDOW_S,
                        progress=lambda done: say(f"conv table: round {done}/{repeats} of {len(shapes)} local "
                                                  f"shapes x 3 passes ({time.perf_counter() - started:.0f} s)"))
    return [{"shape": s.as_list(), **{op: float(f"{statistics.median(rounds[i, op]):.4g}") for op in CONV_OPS}}
            for i, s in enumerate(shapes)]


def _conv_passes(backend, shapes, rng):
    """``{(i, op): fn}``: the three passes of each local shape (ConvShape), ``padding=0`` on its window."""
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
    return passes


def calibrate(comm, backend_name="auto", quick=False, name="this-machine", shapes=(), say=lambda *a: None):
    """The machine file as a dict (every rank gets the same); ``shapes`` (ConvShapes, e.g. of
    :func:`model_shapes`) are timed into ``compute.conv_table`` as well."""
    backend = get_backend(backend_name)
    started = time.perf_counter()
    load = os.getloadavg()[0]  # a shared machine measures slow when busy: the file says how busy
    tables, cnotes, cfailed = measure_collectives(comm, quick)
    overlap, onote = measure_overlap(comm, quick) if comm.Get_size() > 1 else (1.0, "overlap: one rank, nothing to hide")
    compute, knotes, kfailed = measure_compute(comm, backend, quick)
    if cfailed or kfailed:  # before the conv table: a rerun is needed anyway
        raise Unmeasured(_unmeasured_message(cfailed + kfailed, load, quick))
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
    free = unmeasured(doc)  # the rounding to 4 digits cannot make a measured rate free; checked all the same
    if free:
        raise Unmeasured(_unmeasured_message([(item, "the sweep") for item in free], load, quick))
    return doc


def _unmeasured_message(failed, load, quick):
    """Which items were not measured, what was tried, and how to measure them."""
    return (f"no rate measured for {'; '.join(f'{item} ({tried})' for item, tried in failed)}: "
            f"{'its' if len(failed) == 1 else 'their'} time did not grow with the size in {RETRIES + 1} sweeps, "
            f"each larger than the last, so no machine file was written (a rate not measured here "
            f"would misprice every plan made with the file); run refconv calibrate again on a quieter "
            f"machine (load average {load:.1f} at the start){' without --quick (its sweeps are small)' if quick else ''}"
            f", or plan with a shipped machine file (refconv plan --machine NAME, one of "
            f"{', '.join(machine_mod.builtin_names())})")


def unmeasured(doc):
    """The entries of a machine file (a dict) that price a measured item as free: a collective
    kind's beta (per q) at ``SLOPE_FLOOR`` or below, or a kernel's ``rate`` at 1 / SLOPE_FLOOR or above."""
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
