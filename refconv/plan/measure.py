"""The measuring of ``refconv calibrate``: collectives, the overlap, and the local kernels, timed on every rank at
once (``refconv.bench.common.time_ranks``) and fitted (:mod:`refconv.plan.fits`).

The command that writes the machine file is :mod:`refconv.plan.calibrate`.
"""

import statistics
import time

import numpy

from refconv import ProcessGrid, collectives
from refconv.bench.common import time_ranks
from refconv.layers import DistConv2d
from refconv.plan.fits import SLOPE_FLOOR, fit_error, fit_plane, grown_line, until_grown
from refconv.pricing import machine as machine_mod
from refconv.pricing.machine import CONV_OPS, KINDS

COMPUTE_WINDOW_S = 0.02  # each compute sample: this long back to back on every rank at once


COLLECTIVE_WINDOW_S = 0.005  # each collective sample: this long back to back


def _median_time(comm, fn, repeats, window):
    """Median seconds of one call of ``fn`` on the slowest rank, each sample ``window``
    seconds of calls back to back on every rank at once.  No pause: the samples run back to
    back as training's calls do, at the BLAS threads training pins (one per rank once the
    ranks fill the cores, so no worker spins between samples)."""
    return statistics.median(time_ranks(comm, {"fn": fn}, repeats, 0, 0.0, window=window)["fn"])


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
                               lambda item, ms: [4 * m for m in ms], lambda item, xy: grown_line(*xy))
    out, notes = {k: {} for k in KINDS}, []
    for (kind, q), ((a, b), (xs, ys), tries) in done.items():
        notes.append(f"{kind} q={q}: fit median relative error {fit_error(xs, ys, a, b):.0%}{_again(tries, xs)}")
        out[kind][q] = [a / (q - 1) if kind == "alltoallv" else a, b]  # alltoallv: alpha per message
    for grid in grids.values():
        grid.close()
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
                               lambda op, sz: measures[op][2](sz), lambda item, xy: grown_line(*xy))
    for op, ((a, b), (xs, ys), tries) in done.items():
        compute[op] = {"t0": a, "rate": 1 / b}
        notes.append(f"{op}: fit median relative error {fit_error(xs, ys, a, b):.0%}{_again(tries, xs)}")
    failed_items += [(op, f"{_bytes(min(xs))} to {_bytes(max(xs))}") for op, (xs, _) in failed.items()]
    order = list(CONV_OPS) + list(measures)  # the file's order, whatever order the retries finished in
    compute = {op: ({cls: compute[op][cls] for cls in sweep if cls in compute[op]} if op in CONV_OPS else compute[op])
               for op in order if op in compute}
    return compute, notes, failed_items


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
    grid.close()
    xs, ys = [], []
    for i, (N, C, F, H, K) in enumerate(shapes):
        beyond = [t - sum(k) for t, *k in zip(rounds[i, "layer"], *(rounds[i, op] for op in CONV_OPS))]
        xs.append((N * C + N * F) * H * H * 4)
        ys.append(max(statistics.median(beyond), 1e-6))
    return xs, ys


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
