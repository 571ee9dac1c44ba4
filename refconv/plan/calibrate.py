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
polls it (:func:`refconv.plan.measure.measure_overlap`), the file's ``overlap`` key; ``refconv plan``'s
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
is measured again at larger sizes (:func:`refconv.plan.fits.until_grown`, up to
:data:`~refconv.plan.fits.RETRIES` times); if it never grows, :class:`Unmeasured` ends the command
(status 4, no file) naming each such item, the sizes tried and how to measure it.

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
import time

import yaml
from mpi4py import MPI

from refconv import checks, device, failure, launch, threads, train_config
from refconv.backend import get_backend
from refconv.plan import measure
from refconv.plan.fits import RETRIES, SLOPE_FLOOR
from refconv.pricing import graph, search
from refconv.pricing import machine as machine_mod
from refconv.pricing.machine import KINDS
from refconv.train import load_model_spec

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


class Unmeasured(failure.SharedFailure):
    """An item whose time did not grow with its size in every try: no rate was measured, so no file
    is written (status 4)."""

    status = 4


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


def calibrate(comm, backend_name="auto", quick=False, name="this-machine", shapes=(), say=lambda *a: None):
    """The machine file as a dict (every rank gets the same); ``shapes`` (ConvShapes, e.g. of
    :func:`model_shapes`) are timed into ``compute.conv_table`` as well."""
    backend = get_backend(backend_name)
    started = time.perf_counter()
    load = os.getloadavg()[0]  # a shared machine measures slow when busy: the file says how busy
    tables, cnotes, cfailed = measure.measure_collectives(comm, quick)
    overlap, onote = (measure.measure_overlap(comm, quick) if comm.Get_size() > 1
                      else (1.0, "overlap: one rank, nothing to hide"))
    compute, knotes, kfailed = measure.measure_compute(comm, backend, quick)
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
        compute["conv_table"] = measure.measure_conv_table(comm, backend, shapes, 2 if quick else 5, say)
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
