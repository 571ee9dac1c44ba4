"""``refconv bench overlap``: overlapped against blocking communication, side by side.

    mpiexec -n 2 refconv bench overlap progress [--mb 8] [--rounds 7]
    MPICH_ASYNC_PROGRESS=1 mpiexec -n 2 refconv bench overlap progress
    mpiexec -n 2 refconv bench overlap step [--model wide-cnn] [--batch 32]
    mpiexec -n 2 refconv bench overlap halo [--size 64] [--channels 64] [--batch 2] [--poll-chunks 4]
    mpiexec -n 2 refconv bench overlap buckets [--model wide-cnn] [--bucket-kib 0 256 1024 4096 25600]

(``python -m refconv.bench.overlap ...`` runs the same.)  Unlike the other benchmarks it
prints a side-by-side table and writes no JSON lines: its own flags only.

``progress``: what makes a nonblocking call move while the caller computes.  An
allreduce of ``--mb`` MB and a compute of about the same time (float32 matrix
products, in 16 chunks), four contenders in alternating rounds:

- ``comm``: the allreduce alone; ``compute``: the compute alone;
- ``blocking``: the allreduce, waited for, then the compute;
- ``overlap``: the allreduce started (``collectives.iallreduce_``), the compute, the wait;
- ``overlap+test``: the same with ``collectives.progress()`` (MPI_Test of the calls in
  flight) between the chunks.

``hidden`` is the share of the allreduce's time the overlap took off the blocking
time, ``(blocking - overlapped) / comm`` round by round (1: all of it); ``waited`` the
seconds spent in ``wait()`` (what ``stats`` counts for the kind).  MPICH moves a
nonblocking call only inside MPI calls unless ``MPICH_ASYNC_PROGRESS=1`` starts its
progress thread (read when MPI starts: set it on the mpiexec line).

``step``: one sample-parallel training step (``refconv.bench.model_pair``'s models),
``Model.set_overlap(False)`` against ``set_overlap(True)``, on the same model.  With
``--timeline out.json`` it then records one step of each (``stats.timeline()``: when
each call started, when the rank began to wait for it, when it finished), writes them
per rank, and draws ``out.png``: :func:`draw_timeline`.

``halo``: one convolution (``--channels`` in and out, 3x3, 'same') with ``--size`` x
``--size`` per rank, split over height on every rank; forward and backward, three
contenders: ``blocking`` (``overlap_halo`` off), ``overlap`` (on, the work behind each
halo call in one piece) and ``overlap+test`` (on, that work in ``--poll-chunks`` bands
with ``collectives.progress()`` between them: ``DistConv2d.poll_chunks``).  ``hidden``
is the share of the halo wait of the blocking run that an overlapped run no longer
waits, ``1 - waited(overlap) / waited(blocking)``, per pass, from the seconds ``stats``
counts inside the halo's ``wait()``.

``buckets``: the ``step`` with the overlap on and the gradients packed into buckets
(``Model.set_buckets``, :mod:`refconv.collectives.buckets`) of each ``--bucket-kib``
threshold, side by side; the ratios are against the first (0: each gradient its own
allreduce).  It prints how many allreduces each threshold makes per step.

One BLAS thread per rank (``threads.configure(comm, 1)``), and a pause between contenders (``refconv.bench.timing``).
"""

import argparse
import os
import sys
import time

import numpy
from mpi4py import MPI

from refconv import cli, collectives, overlap, threads
from refconv.algorithms.base import POLL_CHUNKS
from refconv.bench import timing
from refconv.bench.common import time_ranks
from refconv.bench.model_pair import MODELS, refconv_step_of
from refconv.grid import ProcessGrid
from refconv.layers import DistConv2d
from refconv.overlap import draw_timeline  # noqa: F401  (its home was here: the name still imports)

CHUNKS = 16
BUCKET_SWEEP_KIB = [0, 256, 1024, 4096, 25600]  # 0: each gradient its own call; 25 MiB: DDP's default


def _waited(fn, waits, name):
    """``fn`` with the seconds its calls spent in MPI (``stats``' per kind) added to ``waits[name]``."""
    def run():
        with collectives.stats.recording() as region:
            fn()
        waits.setdefault(name, []).append(sum(region.seconds.values()))
    return run


def _report(comm, spans, waits, baseline, lines):
    """Rank 0 prints each contender's time, its ratio to ``baseline`` and its seconds in MPI."""
    waited = {name: collectives.allreduce(comm, numpy.array([numpy.median(w)]), op="max")[0]
              for name, w in waits.items()}
    if comm.Get_rank() == 0:
        for name, span in spans.items():
            speedup = timing.ratio(spans, baseline, name).format(1, "x", 2)
            lines.append(f"  {name:<14} {span}   {baseline}/{name} {speedup}   in MPI {waited[name] * 1e3:6.2f} ms")
        print("\n".join(lines), flush=True)


def run_progress(args, comm):
    x = numpy.ones(int(args.mb * 1e6) // 4, numpy.float32)  # x: (n,), reduced in place
    a = numpy.random.default_rng(comm.Get_rank()).standard_normal((256, 256), dtype=numpy.float32)

    def chunk():
        a @ a

    comm_alone = numpy.median(time_ranks(comm, {"comm": lambda: collectives.iallreduce_(comm, x).wait()},
                                         5, 1, timing.spin_pause())["comm"])
    chunk_s = numpy.median(time_ranks(comm, {"chunk": chunk}, 5, 1, timing.spin_pause())["chunk"])
    per_chunk = max(1, round(float(comm_alone / CHUNKS / chunk_s)))  # the compute takes about the allreduce's time
    chunk_s = collectives.allreduce(comm, numpy.array([chunk_s]), op="max")[0]

    def compute(poll=False):
        for _ in range(CHUNKS):
            for _ in range(per_chunk):
                chunk()
            if poll:
                collectives.progress()

    def overlapped(poll):
        request = collectives.iallreduce_(comm, x, overlap="matrix products")
        compute(poll)
        request.wait()

    waits = {}
    contenders = {"comm": lambda: collectives.iallreduce_(comm, x).wait(), "compute": compute,
                  "blocking": lambda: (collectives.iallreduce_(comm, x).wait(), compute()),
                  "overlap": lambda: overlapped(False), "overlap+test": lambda: overlapped(True)}
    contenders = {name: _waited(fn, waits, name) for name, fn in contenders.items()}
    times = time_ranks(comm, contenders, args.rounds, 1, timing.spin_pause())
    spans = {name: timing.Span(tuple(t)) for name, t in times.items()}
    async_progress = os.environ.get("MPICH_ASYNC_PROGRESS", "unset")
    lines = [f"progress: allreduce of {args.mb:g} MB on {comm.Get_size()} ranks behind {CHUNKS} x {per_chunk} "
             f"matrix products (256x256 float32); MPICH_ASYNC_PROGRESS={async_progress}; "
             f"{MPI.Get_library_version().splitlines()[0].strip()}; median (min-max) of {args.rounds} rounds"]
    for name in ("overlap", "overlap+test"):
        hidden = [(b - o) / c for b, o, c in zip(times["blocking"], times[name], times["comm"])]
        lines.append(f"  hidden by {name}: {timing.Span(tuple(hidden)).format(100, ' %', 0)} of the allreduce's time")
    _report(comm, spans, waits, "blocking", lines)


def _setting(setter, value, step):
    """A contender: ``setter(value)`` (the model's overlap or bucket size), then one training step."""
    def run():
        setter(value)
        step()
    return run


def run_step(args, comm):
    batch = args.batch or MODELS[args.model][2]
    step, model, _, _ = refconv_step_of(args.model, batch, comm)
    waits = {}
    contenders = {name: _waited(_setting(model.set_overlap, on, step), waits, name)
                  for name, on in (("blocking", False), ("overlap", True))}
    times = time_ranks(comm, contenders, args.rounds, 1, timing.spin_pause())
    spans = {name: timing.Span(tuple(t)) for name, t in times.items()}
    lines = [f"step: {args.model}, batch {batch}, sample={comm.Get_size()}; MPICH_ASYNC_PROGRESS="
             f"{os.environ.get('MPICH_ASYNC_PROGRESS', 'unset')}; median (min-max) of {args.rounds} rounds"]
    _report(comm, spans, waits, "blocking", lines)
    if args.timeline:
        write_timeline(comm, model, step, args.timeline, f"{args.model}, batch {batch}, sample={comm.Get_size()}")
    model.close()


def run_buckets(args, comm):
    batch = args.batch or MODELS[args.model][2]
    step, model, _, _ = refconv_step_of(args.model, batch, comm)
    model.set_overlap(True)
    waits = {}
    names = {f"{kib} KiB": kib * 1024 for kib in args.bucket_kib}
    contenders = {name: _waited(_setting(model.set_buckets, nbytes, step), waits, name) for name, nbytes in names.items()}
    times = time_ranks(comm, contenders, args.rounds, 1, timing.spin_pause())
    spans = {name: timing.Span(tuple(t)) for name, t in times.items()}
    counts = {}
    for name, nbytes in names.items():
        model.set_buckets(nbytes)
        counts[name] = len(model.bucket_plan()[0])
    lines = [f"buckets: {args.model}, batch {batch}, sample={comm.Get_size()}, overlap on; gradient allreduces per step: "
             + ", ".join(f"{name} {n}" for name, n in counts.items())
             + f"; MPICH_ASYNC_PROGRESS={os.environ.get('MPICH_ASYNC_PROGRESS', 'unset')}; median (min-max) of "
             f"{args.rounds} rounds"]
    _report(comm, spans, waits, next(iter(names)), lines)
    model.close()


def write_timeline(comm, model, step, path, title):
    """One blocking and one overlapped step under ``stats.timeline()``; rank 0 writes every rank's
    calls to ``path`` (JSON, seconds from the step's start) and draws them (:func:`draw_timeline`)."""
    steps = {}
    for name, on in (("blocking", False), ("overlap", True)):
        model.set_overlap(on)
        step()                                             # the same state of the caches for both
        collectives.barrier(comm)
        with collectives.stats.timeline() as events:
            start = time.perf_counter()
            step()
            seconds = time.perf_counter() - start
        steps[name] = {"seconds": seconds, "calls": overlap.relative(events, start)}
    ranks = collectives.allgather_object(comm, steps)
    if comm.Get_rank() == 0:
        print(f"wrote {path} and {overlap.write_timeline(path, ranks, title)}")


def run_halo(args, comm):
    P = comm.Get_size()
    grid = ProcessGrid(comm, height=P)
    C, H = args.channels, args.size
    layer = DistConv2d(C, C, 3, padding=1, grid=grid, algorithm="stationary-x", backend="numpy",
                       input_shape=(args.batch, C, H * P, H))
    rng = numpy.random.default_rng(comm.Get_rank())
    x_loc = rng.standard_normal(layer.input_distribution.local_shape(grid.rank), dtype=numpy.float32)
    dy_loc = rng.standard_normal(layer.output_distribution.local_shape(grid.rank), dtype=numpy.float32)
    halo_waits = {}  # contender -> [(forward's halo wait, backward's)] per round
    settings = {"blocking": (False, 1), "overlap": (True, 1), "overlap+test": (True, args.poll_chunks)}

    def run(name):
        def passes():
            layer.overlap_halo, layer.poll_chunks = settings[name]
            waited = []
            for pass_ in (lambda: layer.forward(x_loc), lambda: layer.backward(dy_loc)):
                with collectives.stats.recording() as region:
                    pass_()
                waited.append(region.seconds.get("halo", 0.0))
            halo_waits.setdefault(name, []).append(waited)
        return passes

    waits = {}
    contenders = {name: _waited(run(name), waits, name) for name in settings}
    times = time_ranks(comm, contenders, args.rounds, 1, timing.spin_pause())
    spans = {name: timing.Span(tuple(t)) for name, t in times.items()}
    waited = {name: collectives.allreduce(comm, numpy.median(numpy.array(w), axis=0), op="max")  # (forward, backward)
              for name, w in halo_waits.items()}
    lines = [f"halo: conv {C}->{C} 3x3 'same', {H}x{H} per rank, batch {args.batch}, height={P}; forward + backward; "
             f"interior {layer._algo.halo.interior} ({layer._algo.halo.no_overlap or 'overlapped'}); "
             f"overlap+test polls between {args.poll_chunks} bands; "
             f"MPICH_ASYNC_PROGRESS={os.environ.get('MPICH_ASYNC_PROGRESS', 'unset')}; median (min-max) of "
             f"{args.rounds} rounds",
             "  halo wait (max over ranks of the median), forward / backward, and the share of the blocking "
             "run's wait hidden:"]
    (f0, b0) = waited["blocking"]
    share = lambda got, base: f"{1 - got / base if base else 0:4.0%}"  # noqa: E731
    for name, (f, b) in waited.items():
        lines.append(f"  {name:<14} {f * 1e3:6.2f} / {b * 1e3:6.2f} ms   hidden: forward {share(f, f0)}, "
                     f"backward {share(b, b0)}, both {share(f + b, f0 + b0)}")
    grid.close()
    _report(comm, spans, waits, "blocking", lines)


def add_arguments(parser):
    """The flags of ``python -m refconv.bench.overlap`` and of ``refconv bench overlap``."""
    parser.add_argument("what", choices=("progress", "step", "halo", "buckets"))
    parser.add_argument("--mb", type=float, default=8.0, help="progress: the allreduce's megabytes (default 8)")
    parser.add_argument("--model", default="wide-cnn", choices=sorted(MODELS),
                        help="step: a model of refconv.bench.model_pair's table (default wide-cnn)")
    parser.add_argument("--batch", type=int, help="step: the global batch (default: the model's); halo: default 2")
    parser.add_argument("--timeline", help="step: write one blocking and one overlapped step's calls here (JSON) "
                                           "and draw them beside it (.png)")
    parser.add_argument("--size", type=int, default=64, help="halo: rows and columns per rank (default 64)")
    parser.add_argument("--channels", type=int, default=64, help="halo: C = F (default 64)")
    parser.add_argument("--poll-chunks", type=int, default=POLL_CHUNKS,
                        help=f"halo: the bands overlap+test computes, MPI_Test between them (default {POLL_CHUNKS})")
    parser.add_argument("--bucket-kib", type=int, nargs="+", default=BUCKET_SWEEP_KIB,
                        help=f"buckets: the thresholds to time, KiB (default {' '.join(map(str, BUCKET_SWEEP_KIB))}; "
                             f"the first is the baseline)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timed rounds (default 7)")
    return parser


def run(args):
    """Run the chosen comparison on every rank; bad flags raise ValueError on every rank alike
    (``refconv bench overlap`` prints it as one line and exits 2)."""
    if args.what == "halo":
        args.batch = args.batch or 2
    for name in ("rounds", "poll_chunks"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected an int >= 1, got {getattr(args, name)}")
    if args.mb <= 0:
        raise ValueError(f"--mb: expected megabytes > 0, got {args.mb}")
    if any(kib < 0 for kib in args.bucket_kib):
        raise ValueError(f"--bucket-kib: expected KiB >= 0, got {args.bucket_kib}")
    if args.timeline:
        overlap.check_timeline_path(args.timeline, "--timeline")
    comm = MPI.COMM_WORLD
    threads.configure(comm, 1)  # one BLAS thread per rank
    {"progress": run_progress, "step": run_step, "halo": run_halo, "buckets": run_buckets}[args.what](args, comm)
    return 0


def main(argv=None):
    """``python -m refconv.bench.overlap ...``: the same as ``refconv bench overlap ...``."""
    return cli.main(["bench", "overlap", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
