"""Benchmarks: ``python -m refconv.bench <subcommand>``.

``kernels``: the convolution passes (forward, backward-data, backward-filter) on
ResNet-50-like layer shapes, float32.

- On a GPU: both versions of ``refconv.kernels`` (batch 32 by default), timed
  with CUDA events after a warm-up launch (which also compiles), against cuDNN
  on the same shapes: through PyTorch when it is importable (TF32 off), else
  through CuPy's cuDNN bindings when they load.
- On the CPU: the numpy backend (``refconv.reference``'s vectorised
  im2col + matmul; batch 8 by default) against ``torch.nn.functional.conv2d``
  and its gradients when torch is importable.

Prints a table (time, GFLOP/s, ratio to the comparison library); ``--json PATH``
also writes the rows.  ``--quick`` runs tiny shapes once, as a smoke test.
"""

import argparse
import json
import math
import platform
import statistics
import sys
import time

import numpy

from refconv import arrays
from refconv import reference as ref

# name: (C, F, H=W, K, stride, padding)
SHAPES = {
    "conv2": (64, 64, 56, 3, 1, 1),
    "conv3": (128, 128, 28, 3, 1, 1),
    "conv4": (256, 256, 14, 3, 1, 1),
    "conv5": (512, 512, 7, 3, 1, 1),
    "conv1": (3, 64, 224, 7, 2, 3),
}
# Selectable with --shapes but not run by default: the layer the foundation issue
# measures the CPU path on (use --batch 32).
EXTRA_SHAPES = {
    "foundation": (64, 64, 32, 3, 1, 1),
}
QUICK_SHAPES = {
    "quick3x3": (8, 8, 8, 3, 1, 1),
    "quick7x7s2": (3, 8, 16, 7, 2, 3),
}
PASSES = ("forward", "backward-data", "backward-filter")


def flops(N, C, F, H, K, stride, padding):
    """Multiply-adds x 2 of one pass (the three passes do the same arithmetic)."""
    Ho = (H + 2 * padding - K) // stride + 1
    return 2 * N * F * Ho * Ho * C * K * K


def problem_arrays(N, C, F, H, K, stride, padding, seed=0):
    rng = numpy.random.default_rng(seed)
    Ho = (H + 2 * padding - K) // stride + 1
    x = rng.standard_normal((N, C, H, H), dtype=numpy.float32)
    w = rng.standard_normal((F, C, K, K), dtype=numpy.float32)
    dy = rng.standard_normal((N, F, Ho, Ho), dtype=numpy.float32)
    return x, w, dy


# ----------------------------------------------------------------- timing helpers


def time_cpu(fn, repeat):
    """Median wall time (s) of ``fn()`` over ``repeat`` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_gpu(fn, repeat):
    """Median device time (s) of ``fn()``, measured with CUDA events on the current stream."""
    cp = arrays.device_module()
    fn()  # warm-up: compiles the kernel, picks cuDNN's algorithm
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


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
            "forward": lambda: cudnn.convolution_forward(
                x, w, None, y, pad, st, dil, 1, auto_tune=True, tensor_core="never"),
            "backward-data": lambda: cudnn.convolution_backward_data(
                w, dy, None, dx, pad, st, dil, 1, deterministic=False, auto_tune=True, tensor_core="never"),
            "backward-filter": lambda: cudnn.convolution_backward_filter(
                x, dy, dw, pad, st, dil, 1, deterministic=False, auto_tune=True, tensor_core="never"),
        }
        passes["forward"]()  # fail here, not in the middle of the table
        return passes, "cuDNN via CuPy"
    except Exception as error:  # noqa: BLE001 (any failure means: no comparison)
        return None, f"CuPy's cuDNN bindings are unavailable ({type(error).__name__}: {error})"


# --------------------------------------------------------------------- the run


def run_kernels(args):
    on_gpu = arrays.gpu_available()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        known = shapes if args.quick else {**SHAPES, **EXTRA_SHAPES}
        unknown = sorted(set(args.shapes) - set(known))
        if unknown:
            raise SystemExit(f"--shapes: unknown {unknown}; expected some of {sorted(known)}")
        shapes = {name: known[name] for name in args.shapes}
    batch = args.batch or (2 if args.quick else (32 if on_gpu else 8))
    repeat = args.repeat or (1 if args.quick else (20 if on_gpu else 3))
    rows, notes = [], []
    where = describe_device(on_gpu)
    print(f"refconv.bench kernels: {where}; float32, batch {batch}, median of {repeat}")
    if not on_gpu:
        print("ran on the CPU: timing the numpy backend (refconv.reference, im2col + matmul)")
    for name, (C, F, H, K, stride, padding) in shapes.items():
        x, w, dy = problem_arrays(batch, C, F, H, K, stride, padding)
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
            timer = time_gpu
        else:
            contenders["refconv numpy"] = ours_cpu(x, w, dy, stride, padding)
            baseline, label = torch_passes(x, w, dy, stride, padding, "cpu")
            timer = time_cpu
        if baseline is None:
            note = f"no comparison library: {label}"
        else:
            contenders[label] = baseline
            note = None
        if note and note not in notes:
            notes.append(note)
        for pass_ in PASSES:
            base_time = timer(baseline[pass_], repeat) if baseline is not None else None
            for who, passes in contenders.items():
                if who == label:
                    seconds = base_time
                else:
                    seconds = timer(passes[pass_], repeat)
                rows.append(dict(
                    shape=name, C=C, F=F, H=H, K=K, stride=stride, padding=padding, batch=batch,
                    pass_=pass_, impl=who, ms=seconds * 1e3, gflops=gflop / seconds,
                    ratio=(base_time / seconds) if base_time else None,
                ))
    print_table(rows)
    for note in notes:
        print(note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=where, on_gpu=on_gpu, batch=batch, repeat=repeat, dtype="float32",
                           notes=notes, rows=rows), f, indent=1)
        print(f"wrote {args.json}")
    return 0


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
        print(f"{r['shape']:<11}{r['pass_']:<17}{r['impl'][:25]:<26}{r['ms']:>10.3f}{r['gflops']:>10.1f}{ratio:>9}")
    print("(vs base: the comparison library's time divided by this row's; 1.00 = as fast)")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m refconv.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels", help="convolution kernels vs cuDNN (GPU) or torch (CPU)")
    k.add_argument("--quick", action="store_true", help="tiny shapes, one repetition (a smoke test)")
    k.add_argument("--batch", type=int, help="batch size N (default 32 on a GPU, 8 on the CPU, 2 with --quick)")
    k.add_argument("--shapes", nargs="+", metavar="NAME", help=f"a subset of {list(SHAPES) + list(EXTRA_SHAPES)} (or of the quick shapes)")
    k.add_argument("--versions", type=int, nargs="+", default=[1, 2], choices=[1, 2], help="kernel versions (GPU)")
    k.add_argument("--repeat", type=int, help="timed repetitions (median reported)")
    k.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    k.set_defaults(run=run_kernels)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
