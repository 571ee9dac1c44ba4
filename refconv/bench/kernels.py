"""``refconv bench kernels``: the convolution passes (forward, backward-data,
backward-filter) of one process, on named layer shapes (ResNet-50-like by default).

- On a GPU: every version of ``refconv.kernels`` (1 direct, 2 tiled, 3 register-tiled; batch 32
  by default), timed with the device synchronized after a warm-up launch (which also compiles), against cuDNN
  on the same shapes: through PyTorch when it is importable (TF32 off), else
  through CuPy's cuDNN bindings when they load.
- On the CPU: the numpy backend (``refconv.reference``'s vectorised
  im2col + matmul; batch 8 by default) against ``torch.nn.functional.conv2d``
  and its gradients when torch is importable.

Before timing a pass, every contender's output is checked against refconv's
(``refconv.bench.timing.check``); then the contenders alternate in rounds
(``timing.compare``).  Prints a table (median time, GFLOP/s, the median of the
per-round ratios to the comparison library) and returns one results line per
(shape, implementation).  ``--quick`` runs tiny
shapes once, as a smoke test.
"""

import platform

import numpy

from refconv import arrays, threads
from refconv import reference as ref
from refconv.bench import timing
from refconv.bench.common import SHAPE_KEYS, BenchError, option, parse_shape, pause_for, record, reject

DEFAULT_SHAPES = ("conv2", "conv3", "conv4", "conv5", "conv1")
QUICK_SHAPES = ("quick3x3", "quick7x7s2")
PASSES = ("forward", "backward-data", "backward-filter")


def flops(N, C, F, H, K, stride, padding):
    """Multiply-adds x 2 of one pass (the three passes do the same arithmetic)."""
    Ho = (H + 2 * padding - K) // stride + 1
    return 2 * N * F * Ho * Ho * C * K * K


def problem_arrays(N, C, F, H, K, stride, padding, seed=0, dtype=numpy.float32):
    rng = numpy.random.default_rng(seed)
    Ho = (H + 2 * padding - K) // stride + 1
    x = rng.standard_normal((N, C, H, H), dtype=dtype)
    w = rng.standard_normal((F, C, K, K), dtype=dtype)
    dy = rng.standard_normal((N, F, Ho, Ho), dtype=dtype)
    return x, w, dy


# ------------------------------------------------------------- what gets timed


def ours_gpu(version, x, w, dy, stride, padding):
    from refconv import kernels

    g = dict(stride=stride, padding=padding, version=version)
    return {
        "forward": lambda: kernels.conv2d_forward(x, w, **g),
        "backward-data": lambda: kernels.conv2d_backward_data(dy, w, x.shape, **g),
        "backward-filter": lambda: kernels.conv2d_backward_filter(x, dy, w.shape, **g),
    }


def ours_cpu(x, w, dy, stride, padding):
    g = dict(stride=stride, padding=padding)
    return {
        "forward": lambda: ref.conv2d_forward(x, w, **g),
        "backward-data": lambda: ref.conv2d_backward_data(dy, w, x.shape, **g),
        "backward-filter": lambda: ref.conv2d_backward_filter(x, dy, w.shape, **g),
    }


def torch_passes(x, w, dy, stride, padding, device):
    """torch's conv2d and its two gradients, or None when torch (or its CUDA) is missing."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    threads.match(torch)  # the same threads as refconv's contender
    if device == "cuda":
        if not torch.cuda.is_available():
            return None, "torch is installed without CUDA"
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True  # cuDNN's fastest algorithm for each shape
    xt, wt, dyt = (torch.as_tensor(numpy.asarray(arrays.to_host(a)), device=device) for a in (x, w, dy))
    conv = torch.nn.functional.conv2d
    return {
        "forward": lambda: conv(xt, wt, stride=stride, padding=padding),
        "backward-data": lambda: torch.nn.grad.conv2d_input(xt.shape, wt, dyt, stride=stride, padding=padding),
        "backward-filter": lambda: torch.nn.grad.conv2d_weight(xt, wt.shape, dyt, stride=stride, padding=padding),
    }, f"torch {torch.__version__}" + (" (cuDNN)" if device == "cuda" else "")


def cupy_cudnn_passes(x, w, dy, stride, padding):
    """cuDNN through CuPy's bindings (no tensor cores: plain fp32), or None when they do not load."""
    try:
        from cupy import cudnn  # needs the cuDNN libraries next to CuPy

        cp = arrays.device_module()
        y = cp.empty(dy.shape, dtype=x.dtype)
        dx = cp.empty(x.shape, dtype=x.dtype)
        dw = cp.empty(w.shape, dtype=x.dtype)
        pad, st, dil = (padding, padding), (stride, stride), (1, 1)
        passes = {
            "forward": lambda: (cudnn.convolution_forward(
                x, w, None, y, pad, st, dil, 1, auto_tune=True, tensor_core="never"), y)[1],
            "backward-data": lambda: (cudnn.convolution_backward_data(
                w, dy, None, dx, pad, st, dil, 1, deterministic=False, auto_tune=True, tensor_core="never"), dx)[1],
            "backward-filter": lambda: (cudnn.convolution_backward_filter(
                x, dy, dw, pad, st, dil, 1, deterministic=False, auto_tune=True, tensor_core="never"), dw)[1],
        }
        passes["forward"]()  # fail here, not in the middle of the table
        return passes, "cuDNN via CuPy"
    except Exception as error:  # noqa: BLE001 (any failure means: no comparison)
        return None, f"CuPy's cuDNN bindings are unavailable ({type(error).__name__}: {error})"


# --------------------------------------------------------------------- the run


def run(args, comm, env):
    """Time every pass of every shape; returns one results line per (shape, implementation)."""
    reject(args, ("grid", "algorithm", "filter-groups", "model"),
           "bench kernels times one process's convolution on the whole layer; bench layer and bench step take it")
    if comm.Get_size() != 1:
        raise BenchError(f"bench kernels: runs on one rank, {comm.Get_size()} were started; run it without mpiexec")
    on_gpu = arrays.gpu_available()
    shapes = args.shape or [parse_shape(name) for name in (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)]
    batch = option(args, "batch", 2 if args.quick else (32 if on_gpu else 8))
    repeat = option(args, "repeat", 1 if args.quick else (20 if on_gpu else 3))
    warmup = option(args, "warmup", 1, minimum=0)
    dtype = numpy.dtype(args.dtype)
    rows, notes, lines = [], [], []
    where = describe_device(on_gpu)
    print(f"refconv bench kernels: {where}; {dtype.name}, batch {batch}, median of {repeat}")
    if not on_gpu:
        print("ran on the CPU: timing the numpy backend (refconv.reference, im2col + matmul)")
    for shape in shapes:
        name = shape["name"]
        C, F, H, K, stride, padding = (shape[k] for k in SHAPE_KEYS)
        x, w, dy = problem_arrays(batch, C, F, H, K, stride, padding, dtype=dtype)
        gflop = flops(batch, C, F, H, K, stride, padding) / 1e9
        contenders = {}
        if on_gpu:
            xd, wd, dyd = (arrays.device_module().asarray(a) for a in (x, w, dy))
            for version in args.versions:
                contenders[f"refconv v{version}"] = ours_gpu(version, xd, wd, dyd, stride, padding)
            baseline, label = torch_passes(x, w, dy, stride, padding, "cuda")
            if baseline is None:
                baseline, cupy_label = cupy_cudnn_passes(xd, wd, dyd, stride, padding)
                label = cupy_label if baseline is not None else f"{label}; {cupy_label}"
        else:
            contenders["refconv numpy"] = ours_cpu(x, w, dy, stride, padding)
            baseline, label = torch_passes(x, w, dy, stride, padding, "cpu")
        if baseline is None:
            note = f"no comparison library: {label}"
        else:
            contenders[label] = baseline
            note = None
        if note and note not in notes:
            notes.append(note)
        times = {who: {} for who in contenders}
        reduction = {"forward": C * K * K, "backward-data": F * K * K,
                     "backward-filter": batch * ((H + 2 * padding - K) // stride + 1) ** 2}
        for pass_ in PASSES:
            calls = {who: passes[pass_] for who, passes in contenders.items()}
            reference = next(iter(calls))  # refconv's first version
            timing.check({who: host(fn()) for who, fn in calls.items()}, reference,
                          reduction_length=reduction[pass_])  # a fast wrong answer is an error, not a figure
            spans = timing.compare(calls, rounds=repeat, warmup=warmup, pause=pause_for(env),
                                   sync=arrays.synchronize)
            for who in calls:
                times[who][pass_] = list(spans[who].values)
                seconds = spans[who].median
                base = timing.ratio(spans, label, who).median if baseline is not None else None
                rows.append(dict(shape=name, pass_=pass_, impl=who, ms=seconds * 1e3, gflops=gflop / seconds,
                                 ratio=base))
        config = {"ranks": 1, "shape": shape, "batch": batch, "dtype": dtype.name, "repeat": repeat,
                  "warmup": warmup, "device": where}
        for who in contenders:
            lines.append(record("kernels", f"{name} {who}", env, dict(config, implementation=who), times[who],
                                extra={"gflop_per_pass": gflop, "notes": notes}))
    print_table(rows)
    for note in notes:
        print(note)
    return lines


def host(out):
    """A NumPy copy of a pass's output: a NumPy, CuPy or torch array."""
    if hasattr(out, "detach"):
        return out.detach().cpu().numpy()
    return arrays.to_host(out)


def describe_device(on_gpu):
    if on_gpu:
        cp = arrays.device_module()
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        return f"GPU {props['name'].decode()}"
    return f"CPU {platform.processor() or platform.machine()}"


def print_table(rows):
    header = f"{'shape':<11}{'pass':<17}{'implementation':<26}{'ms':>10}{'GFLOP/s':>10}{'vs base':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"{r['shape'][:10]:<11}{r['pass_']:<17}{r['impl'][:25]:<26}{r['ms']:>10.3f}{r['gflops']:>10.1f}{ratio:>9}")
    print("(vs base: the comparison library's time divided by this row's; 1.00 = as fast)")


def add_arguments(p):
    """Flags of bench kernels only (the shared ones come from refconv.bench.common)."""
    p.add_argument("--quick", action="store_true", help="tiny shapes, one repetition (a smoke test)")
    p.add_argument("--versions", type=int, nargs="+", default=[1, 2, 3], choices=[1, 2, 3],
                   help="kernel versions (GPU): 1 direct, 2 tiled, 3 register-tiled (float32; float64 runs 2)")
