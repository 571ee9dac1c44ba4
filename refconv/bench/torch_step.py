"""refconv's CPU path against PyTorch, side by side in one run (torch needed for the first three).

    python -m refconv.bench.torch_step passes [--batch 8] [--rounds 7]
    python -m refconv.bench.torch_step passes3d [--batch 4] [--rounds 7]
    python -m refconv.bench.torch_step step --model digits-cnn resnet50 wide-cnn [--batch N]
    mpiexec -n 2 python -m mpi4py -m refconv.bench.torch_step ddp --model digits-cnn
    python -m refconv.bench.torch_step columns
    python -m refconv.bench.torch_step memory
    python -m refconv.bench.torch_step profile --model digits-cnn [--rounds 7]

- ``passes``: forward, backward-data and backward-filter of the numpy backend
  against ``torch.nn.functional.conv2d`` and its gradients, on the five
  ResNet-50 3x3 and stem shapes plus a 1x1 layer; prints the geometric mean
  of the per-shape ratios for each pass.  A third contender, ``GEMM``, is the
  pass's matrix product alone on operands built beforehand: the floor of any
  im2col formulation on numpy's BLAS, so ``refconv / GEMM`` is what the copies
  around it cost.  A fourth, ``im2col``, is refconv's pass with the rule of
  :mod:`refconv.reference.conv_taps` off (every shape to im2col): ``im2col / refconv``
  is what the tap path gains where the rule takes it (1 where it does not).
- ``passes3d``: the same for the 3-D passes (``refconv.reference.conv3d_*`` against
  ``torch.nn.functional.conv3d`` and its gradients) on CosmoFlow-like layers: the five
  3x3x3 convolutions of MLPerf HPC's CosmoFlow (4 -> 32 -> 64 -> 128 -> 256 -> 256
  channels, each volume half the last after its pooling) on a 32^3 input.
- ``step``: one training step (forward, loss, backward, SGD update) of a model
  preset built by ``refconv.Model.from_spec`` against the same model written in
  PyTorch (``torch.nn`` modules built from the same spec, holding the same
  initial parameters).  The first step's loss must agree with torch's on the
  whole batch before anything is timed.  A third contender, ``refconv im2col``,
  is refconv's step with the tap rule off (every convolution through im2col).
  ``--cpu-time`` (``step``, ``passes`` and ``passes3d``, one rank) times each by the process's CPU
  seconds instead of wall seconds: robust to other jobs on a shared machine.
- ``ddp``: the same with one sample-parallel model per rank, against
  ``torch.nn.parallel.DistributedDataParallel`` over gloo (which itself overlaps its
  bucketed allreduces with backward); each rank holds ``batch / ranks`` samples.
  Three contenders: ``refconv`` with the overlap on (``refconv train``'s default),
  ``refconv blocking`` (``Model.set_overlap(False)``) and ``torch``.  Every round is
  timed by the slowest rank.
- ``columns``: forward + backward-filter with the im2col columns recomputed in
  each pass, against computed once and kept (``cols=``), and the memory kept.
- ``memory``: the peak memory of one DistConv2d forward and backward on the
  C=F=1024, 7x7, N=8 layer, against the size of its x, y, w and dw.
- ``profile``: refconv's step alone under cProfile (torch not needed): the
  functions that take the most time of their own, per step and as a share.

Every figure is the median (min-max) over interleaved rounds of
:mod:`refconv.bench.timing`; "vs torch" is torch's time divided by refconv's
(above 1: refconv is faster).  BLAS threads are chosen by :mod:`refconv.threads`
(``--threads``, the environment, else cores per rank on the node) and torch
gets the same number.  torch is imported only here, and only when it runs.
"""

import argparse
import cProfile
import math
import os
import pstats
import sys
import time
import tracemalloc

import numpy
from mpi4py import MPI
from threadpoolctl import threadpool_info

from refconv import DistConv2d, ProcessGrid, collectives, failure, threads, train_config
from refconv import reference as ref
from refconv.bench import timing
from refconv.bench.model_pair import MODELS, init_torch_distributed, refconv_step_of, step_contenders
from refconv.reference import conv as ref_conv
from refconv.reference import conv_taps
from refconv.reference.shapes import QUICK_SHAPES, QUICK_SHAPES3D, SHAPES, SHAPES3D  # noqa: F401 (re-exported)

EXTRA_SHAPES = {"foundation": (64, 64, 32, 3, 1, 1),  # the foundation issue's layer (use --batch 32)
                "digits2": (32, 32, 16, 3, 1, 1), "digits3": (32, 64, 8, 3, 1, 1),  # the digits CNN's (--batch 64)
                # the wide CNN's three wide convolutions (--batch 16: a rank's half of its batch on 2 ranks)
                "wide2": (128, 128, 32, 3, 1, 1), "wide3": (128, 256, 16, 3, 1, 1), "wide4": (256, 256, 16, 3, 1, 1)}
PASSES = ("forward", "backward-data", "backward-filter")


def import_torch():
    try:
        import torch
    except ImportError:
        # torch stays optional: one line on every rank, exit status 2 (refconv's bad-input status)
        sys.exit(failure.exit_on_shared_error("refconv.bench.torch_step: torch is not installed; it compares "
                                              "against PyTorch, an optional contender: install torch (CPU) first"))
    return torch


# ----------------------------------------------------------------------------- single passes


def layer_arrays(C, F, H, K, stride, padding, batch, seed=0, dims=2):
    """``(x, w, dy)``: one layer's random fp32 arrays, ``H x H`` images (``dims=2``) or ``H x H x H``
    volumes (``dims=3``)."""
    rng = numpy.random.default_rng(seed)
    Ho = (H + 2 * padding - K) // stride + 1
    x = rng.standard_normal((batch, C) + (H,) * dims, dtype=numpy.float32)
    w = rng.standard_normal((F, C) + (K,) * dims, dtype=numpy.float32)
    dy = rng.standard_normal((batch, F) + (Ho,) * dims, dtype=numpy.float32)
    return x, w, dy


def refconv_passes(x, w, dy, g, dims=2):
    """``{pass: fn}``: refconv's three passes (``refconv.reference.conv{dims}d_*``) on these arrays."""
    forward, backward_data, backward_filter = (getattr(ref, f"conv{dims}d_{p}")
                                               for p in ("forward", "backward_data", "backward_filter"))
    return {"forward": lambda: forward(x, w, **g), "backward-data": lambda: backward_data(dy, w, x.shape, **g),
            "backward-filter": lambda: backward_filter(x, dy, w.shape, **g)}


def torch_passes(torch, x, w, dy, g, dims=2):
    """``{pass: fn}``: torch's three passes on the same arrays (``torch.nn.functional.conv{dims}d`` and
    its gradients, looked up when called: a stand-in for torch may lack them)."""
    xt, wt, dyt = (torch.from_numpy(a) for a in (x, w, dy))
    nd = f"conv{dims}d"
    return {"forward": lambda: getattr(torch.nn.functional, nd)(xt, wt, **g),
            "backward-data": lambda: getattr(torch.nn.grad, f"{nd}_input")(xt.shape, wt, dyt, **g),
            "backward-filter": lambda: getattr(torch.nn.grad, f"{nd}_weight")(xt, wt.shape, dyt, **g)}


def gemm_passes(x, w, dy, g, dims=2):
    """``{pass: fn}``: the GEMM of each of refconv's passes alone, on operands laid out as the numpy
    backend multiplies them, into results allocated once (the backend reuses its large buffers
    too): what any im2col formulation through numpy's BLAS costs at least."""
    F, C, K = w.shape[0], w.shape[1], w.shape[-1]
    Ho = dy.shape[2]
    if dims == 2:
        cols = ref_conv.conv2d_columns(x, w.shape, **g)[0]  # (C K K, N Ho Wo)
    else:  # vol2col's columns, laid out channel-major as backward-filter multiplies them: (C K K K, N Do Ho Wo)
        stride, padding = g["stride"], g["padding"]
        cols = ref.vol2col(x, (K,) * 3, (stride,) * 3, (padding,) * 3, (1,) * 3, (Ho,) * 3)
        cols = cols.transpose(1, 2, 3, 4, 0, 5, 6, 7).reshape(C * K ** 3, -1)
    w_2d = w.reshape(F, -1)
    dy_2d = numpy.ascontiguousarray(numpy.moveaxis(dy, 1, 0)).reshape(F, -1)  # (F, N Ho Wo ...)
    y_2d, dcols, dw_2d = numpy.empty_like(dy_2d), numpy.empty_like(cols), numpy.empty_like(w_2d)
    return {"forward": lambda: numpy.matmul(w_2d, cols, out=y_2d),
            "backward-data": lambda: numpy.matmul(w_2d.T, dy_2d, out=dcols),
            "backward-filter": lambda: numpy.matmul(dy_2d, cols.T, out=dw_2d)}


def pass_contenders(C, F, H, K, stride, padding, batch, torch, seed=0, dims=2):
    """``{"refconv": {pass: fn}, "torch": {pass: fn}, "GEMM": {pass: fn}}`` (and, in 2-D, ``"im2col"``)
    on one layer's random fp32 arrays (:func:`layer_arrays`)."""
    x, w, dy = layer_arrays(C, F, H, K, stride, padding, batch, seed, dims)
    g = dict(stride=stride, padding=padding)
    # "im2col": refconv's pass with the rule sending every shape to im2col (2-D only; the 3-D passes have one path)
    contenders = {
        "refconv": refconv_passes(x, w, dy, g, dims),
        "torch": torch_passes(torch, x, w, dy, g, dims),
        "GEMM": gemm_passes(x, w, dy, g, dims),
    }
    if dims == 2:
        contenders["im2col"] = {p: _im2col_only(fn) for p, fn in contenders["refconv"].items()}
    return contenders


def _im2col_only(fn):
    """``fn`` with the tap path's rule off (``conv_taps.takes_taps``): the im2col side of the rule."""
    def run():
        rule = conv_taps.takes_taps
        conv_taps.takes_taps = lambda *args: False
        try:
            return fn()
        finally:
            conv_taps.takes_taps = rule
    return run


def _shapes(args):
    if args.what == "passes3d":
        return QUICK_SHAPES3D if args.quick else {n: SHAPES3D[n] for n in (args.shapes or SHAPES3D)}
    if args.quick:
        return QUICK_SHAPES
    if not args.shapes:
        return SHAPES
    known = {**SHAPES, **EXTRA_SHAPES}
    unknown = sorted(set(args.shapes) - set(known))
    if unknown:
        raise SystemExit(f"--shapes: unknown {unknown}; expected some of {sorted(known)}")
    return {name: known[name] for name in args.shapes}


def run_passes(args):
    torch = import_torch()
    ratios = {p: [] for p in PASSES}
    dims = 3 if args.what == "passes3d" else 2
    print(f"{'shape':<11}{'pass':<17}{'refconv ms':>24}{'GFLOP/s':>9}{'torch ms':>24}{'GFLOP/s':>9}{'vs torch':>20}"
          f"{'GEMM ms':>24}{'refconv / GEMM':>20}"
          + (f"{'im2col ms':>24}{'im2col / refconv':>20}" if dims == 2 else ""))
    for name, (C, F, H, K, stride, padding) in _shapes(args).items():
        Ho = (H + 2 * padding - K) // stride + 1
        gflop = 2 * args.batch * F * Ho ** dims * C * K ** dims / 1e9  # each pass does the same arithmetic
        fns = pass_contenders(C, F, H, K, stride, padding, args.batch, torch, dims=dims)
        for p in PASSES:
            contenders = {who: fns[who][p] for who in fns}
            outputs = {who: contenders[who]() for who in contenders if who != "GEMM"}  # GEMM's is not the answer
            length = {"forward": C * K ** dims, "backward-data": F * K ** dims,
                      "backward-filter": args.batch * H ** dims}[p]
            # fp32 sums of `length` O(1) terms: error ~ eps * sqrt(length) relative to the largest value
            scale = float(numpy.abs(numpy.asarray(outputs["torch"])).max())
            timing.check(outputs, "torch", atol=1e-6 * math.sqrt(length) * scale, rtol=1e-5)
            spans = timing.compare(contenders, rounds=args.rounds, warmup=1, clock=_clock(args))
            r = timing.ratio(spans, "torch", "refconv")
            ratios[p].append(r.median)
            print(f"{name:<11}{p:<17}{spans['refconv'].format():>24}{gflop / spans['refconv'].median:>9.1f}"
                  f"{spans['torch'].format():>24}{gflop / spans['torch'].median:>9.1f}{r.format(1, '', 2):>20}"
                  f"{spans['GEMM'].format():>24}{timing.ratio(spans, 'refconv', 'GEMM').format(1, '', 2):>20}"
                  + (f"{spans['im2col'].format():>24}{timing.ratio(spans, 'im2col', 'refconv').format(1, '', 2):>20}"
                     if "im2col" in spans else ""))
    for p in PASSES:
        print(f"geometric mean vs torch, {p}: {_geomean(ratios[p]):.2f}")
    return 0


CPU_TIMED = ("step", "passes", "passes3d")  # what --cpu-time may time: one process's own work


def _clock(args):
    """``--cpu-time``: this process's CPU seconds (robust to other jobs, blind to waiting); else wall seconds."""
    return time.process_time if args.cpu_time else time.perf_counter


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ------------------------------------------- the same model in torch (built in model_pair.py), timed


def run_step(args, comm):
    torch = import_torch()
    rank0 = comm.Get_rank() == 0
    names = args.model or list(MODELS)
    for name in names:
        batch = args.batch or MODELS[name][2]
        contenders, (ours, theirs) = step_contenders(name, batch, comm, torch)  # checked: the first losses agree
        if comm.Get_size() == 1:  # the same step with every convolution through im2col (the tap rule off)
            contenders["refconv im2col"] = _im2col_only(contenders["refconv"])
        spans = timing.compare(contenders, rounds=args.rounds, warmup=1, sync=lambda: collectives.barrier(comm),
                               clock=_clock(args))
        r = timing.ratio(spans, "torch", "refconv")
        if rank0:
            what = f"{name} batch {batch}" + (f" on {comm.Get_size()} ranks (DDP, gloo)" if comm.Get_size() > 1 else "")
            print(f"{what}: first loss refconv {ours:.5f} torch {theirs:.5f}; step refconv {spans['refconv']}, "
                  f"torch {spans['torch']}; vs torch {r.format(1, '', 2)}"
                  + ("; CPU seconds" if args.cpu_time else ""))
            if "refconv im2col" in spans:
                print(f"  refconv im2col {spans['refconv im2col']}; im2col / refconv "
                      f"{timing.ratio(spans, 'refconv im2col', 'refconv').format(1, 'x', 2)}; im2col vs torch "
                      f"{timing.ratio(spans, 'torch', 'refconv im2col').format(1, '', 2)}")
            if "refconv blocking" in spans:  # ddp: the overlap on ("refconv") and off, and DDP, side by side
                print(f"  refconv blocking {spans['refconv blocking']}; overlapped / blocking speedup "
                      f"{timing.ratio(spans, 'refconv blocking', 'refconv').format(1, 'x', 2)}; blocking vs torch "
                      f"{timing.ratio(spans, 'torch', 'refconv blocking').format(1, '', 2)}")
    return 0




# ------------------------------------------------------------------- columns kept or recomputed


def run_columns(args):
    """Forward + backward-filter with the columns recomputed in each pass, against computed once
    and kept (``cols=``), on the pass shapes; prints the time saved and the memory it holds."""
    shapes = _shapes(args)
    print(f"{'shape':<11}{'recomputed ms':>24}{'kept ms':>24}{'kept vs recomputed':>22}{'held MiB':>10}")
    for name, (C, F, H, K, stride, padding) in shapes.items():
        rng = numpy.random.default_rng(0)
        Ho = (H + 2 * padding - K) // stride + 1
        x = rng.standard_normal((args.batch, C, H, H), dtype=numpy.float32)
        w = rng.standard_normal((F, C, K, K), dtype=numpy.float32)
        dy = rng.standard_normal((args.batch, F, Ho, Ho), dtype=numpy.float32)
        g = dict(stride=stride, padding=padding)

        def recomputed():
            return ref.conv2d_forward(x, w, **g), ref.conv2d_backward_filter(x, dy, w.shape, **g)

        def kept():
            cols = ref_conv.conv2d_columns(x, w.shape, **g)
            return ref.conv2d_forward(x, w, cols=cols, **g), ref.conv2d_backward_filter(x, dy, w.shape, cols=cols, **g)

        timing.check({"recomputed": recomputed(), "kept": kept()}, "recomputed", reduction_length=args.batch * Ho * Ho)
        spans = timing.compare({"recomputed": recomputed, "kept": kept}, rounds=args.rounds, warmup=1)
        held = numpy.prod(ref_conv.conv2d_columns_shape(x.shape, w.shape, **g)) * 4 / 2 ** 20
        print(f"{name:<11}{spans['recomputed'].format():>24}{spans['kept'].format():>24}"
              f"{timing.ratio(spans, 'recomputed', 'kept').format(1, '', 2):>22}{held:>10.1f}")
    return 0


# ------------------------------------------------------------------------------ peak memory


def run_memory(args, comm):
    """Peak memory of one DistConv2d forward and backward (sample-parallel on ``comm``),
    from tracemalloc: the arrays alive before the passes (x_loc, the weight) plus the
    passes' own peak, against the layer's x, y, w and dw together."""
    C, F, H, K, stride, padding = MEMORY_LAYER
    batch = args.batch or 8
    grid = ProcessGrid(comm, sample=comm.Get_size())
    layer = DistConv2d(C, F, K, stride=stride, padding=padding, grid=grid, backend="numpy",
                       input_shape=(batch, C, H, H))
    rng = numpy.random.default_rng(0)
    x_loc = rng.standard_normal(layer.input_distribution.local_shape(grid.rank), dtype=numpy.float32)
    dy_loc = rng.standard_normal(layer.output_distribution.local_shape(grid.rank), dtype=numpy.float32)
    tracemalloc.start()
    try:
        y_loc = layer.forward(x_loc)
        del y_loc
        layer.backward(dy_loc)
        _, passes_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    grid.close()
    w_bytes = layer.weight.nbytes + (layer.bias.nbytes if layer.has_bias else 0)
    live = x_loc.nbytes + w_bytes  # held before the passes (tracemalloc did not see them)
    tensors = x_loc.nbytes + dy_loc.nbytes + 2 * w_bytes  # x, y, w, dw of this rank
    peak = live + passes_peak
    if comm.Get_rank() == 0:
        mib = 2 ** 20
        print(f"layer C={C} F={F} {H}x{H} K={K} batch {batch} on {comm.Get_size()} rank(s): peak {peak / mib:.1f} MiB "
              f"= {live / mib:.1f} held + {passes_peak / mib:.1f} in forward+backward; x+y+w+dw {tensors / mib:.1f} MiB; "
              f"ratio {peak / tensors:.2f}")
    return 0


MEMORY_LAYER = (1024, 1024, 7, 3, 1, 1)  # C, F, H=W, K, stride, padding: issue 10's memory target


# ----------------------------------------------------------------------------------------- main


def run_profile(args, comm):
    """Where refconv's step goes (one rank, torch not needed), in CPU seconds: each layer's
    forward and backward and each convolution pass (``_part_times``), then cProfile over
    ``--rounds`` steps after one warm-up: the functions that take the most time of their own."""
    if comm.Get_size() > 1:
        raise SystemExit("profile: one rank")
    for name in args.model or ["digits-cnn"]:
        step, model, _, _ = refconv_step_of(name, args.batch or MODELS[name][2], comm)
        step()
        parts, per_step = _part_times(model, step, args.rounds)
        print(f"{name}: {per_step * 1e3:.1f} ms of CPU a step (mean of {args.rounds}); by part:")
        for part, seconds in parts.items():
            print(f"  {seconds / args.rounds * 1e3:7.2f} ms {seconds / args.rounds / per_step:6.1%}  {part}")
        model.close()
        profile = cProfile.Profile(time.process_time)
        profile.runcall(lambda: [step() for _ in range(args.rounds)])
        stats = pstats.Stats(profile)
        per_step = stats.total_tt / args.rounds
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:PROFILE_ROWS]  # by own time
        print(f"{name}: {per_step * 1e3:.1f} ms of CPU a step under cProfile; own time:")
        for (path, line, function), (_, calls, own, _, _) in rows:
            where = f"{os.path.basename(path)}:{line}({function})" if line else function
            print(f"  {own / args.rounds * 1e3:7.2f} ms {own / args.rounds / per_step:6.1%}  "
                  f"{calls // args.rounds:>4} calls  {where}")
    return 0


CONV_PASSES = {"conv2d_forward": "forward", "conv2d_backward_data": "backward-data",
               "conv2d_backward_filter": "backward-filter"}


def _part_times(model, step, rounds):
    """``({part: CPU seconds over rounds}, CPU seconds a step)``: ``rounds`` steps with every
    layer's forward and backward, and each convolution pass of the backend inside them, timed by
    ``time.process_time``.  A part is named by the layer's qualified name and kind (a pass
    indented under its layer); "rest" is the loss, the optimizer, the data and what containers
    do themselves (a residual block's sum): the step less its layers."""
    totals, inside = {}, []  # inside: the layers whose call is running, innermost last

    def timed(owner, attribute, part_of):
        fn = getattr(owner, attribute)

        def run(*args, **kwargs):
            part = part_of()
            inside.append(part)
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[part] = totals.get(part, 0.0) + time.process_time() - start
                inside.pop()
        setattr(owner, attribute, run)  # an instance attribute: it shadows the method until popped

    named = model.named_layers()  # the leaves, by qualified name ("4.body.0" inside a block)
    layers = [layer for _, layer in named]
    backends = {id(layer.backend): layer.backend for layer in layers}.values()
    for name, layer in named:
        for attribute in ("forward", "backward"):
            timed(layer, attribute, lambda label=f"layer {name} {type(layer).__name__} {attribute}": label)
    for backend in backends:
        for method, label in CONV_PASSES.items():
            timed(backend, method, lambda label=label: f"{inside[-1]}:  {label}")
    start = time.process_time()
    try:
        for _ in range(rounds):
            step()
    finally:
        for owner in layers + list(backends):
            for attribute in ("forward", "backward") + tuple(CONV_PASSES):
                owner.__dict__.pop(attribute, None)
    total = time.process_time() - start
    totals["rest (loss, optimizer, data)"] = total - sum(s for part, s in totals.items() if ":" not in part)
    return totals, total / rounds


PROFILE_ROWS = 15


def _blas_kernels():
    """OpenBLAS's kernel set (``OPENBLAS_CORETYPE`` overrides what it detects): it changes GEMM speed."""
    found = [f"{p['internal_api']} {p.get('version')} {p.get('architecture')}" for p in threadpool_info()
             if p["user_api"] == "blas" and "numpy" in p["filepath"]]
    return ", ".join(found) or "unknown"


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.torch_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("passes", "passes3d", "step", "ddp", "memory", "columns", "profile"))
    parser.add_argument("--model", choices=sorted(MODELS), nargs="+", help="step/ddp: models (default: all)")
    parser.add_argument("--batch", type=int, help="global batch (passes: 8; step: per model)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds (default 7)")
    train_config.add_option(parser, "threads")
    parser.add_argument("--cpu-time", action="store_true",
                        help="step, passes, passes3d: time by this process's CPU seconds, not wall seconds (one rank; a shared machine)")
    parser.add_argument("--shapes", nargs="+", help=f"passes/columns: shape names (default: {' '.join(SHAPES)}; "
                                                     f"also {' '.join(EXTRA_SHAPES)}; passes3d: {' '.join(SHAPES3D)})")
    parser.add_argument("--quick", action="store_true", help="passes/columns: tiny shapes, as a smoke test")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.cpu_time and (args.what not in CPU_TIMED or comm.Get_size() > 1):
        # another rank's work and the waits for it are not this process's CPU seconds
        sys.exit(failure.exit_on_shared_error(f"--cpu-time: only with {', '.join(CPU_TIMED)} on one rank, not "
                                              f"{args.what} on {comm.Get_size()}: drop it, or run without mpiexec"))
    choice = threads.configure(comm, args.threads)
    if args.what == "memory":
        return run_memory(args, comm)
    if args.what == "columns":
        args.batch = args.batch or (2 if args.quick else 8)
        return run_columns(args)
    if args.what == "profile":
        return run_profile(args, comm)
    torch = import_torch()
    torch.set_num_threads(choice.threads)
    if comm.Get_rank() == 0:
        print(f"torch {torch.__version__}; numpy's BLAS {_blas_kernels()}; {choice.describe()}; "
              f"median (min-max) of {args.rounds} rounds")
    if args.what in ("passes", "passes3d"):
        args.batch = args.batch or (2 if args.quick else 8 if args.what == "passes" else 4)
        return run_passes(args)
    if args.what == "ddp":
        if comm.Get_size() < 2:
            raise SystemExit("ddp: run under mpiexec -n 2 (or more)")
        init_torch_distributed(comm, torch)
    elif comm.Get_size() > 1:
        raise SystemExit("step: one rank (use ddp for several)")
    return run_step(args, comm)


if __name__ == "__main__":
    sys.exit(main())
