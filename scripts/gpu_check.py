"""The one-shot device check: in one run on one GPU, what the CPU cannot prove.

    bash scripts/gpu_check.sh [--dry-run]         # the wrapper: picks the Python, makes refconv importable
    python scripts/gpu_check.py --out DIR [--dry-run] [--only STEP ...]

Steps, each with its own time limit.  A step that fails, or cannot run here,
says so in one line, and the others still run:

  env      the GPU, the libraries, the MPI library and whether it is CUDA-aware
  compile  the compile proof: every kernel through NVVM (refconv.kernels.resources)
  tests    the GPU tests on the device, without the simulator: the kernels, the
           stream order, the cuda backend's layers and algorithms on 2 ranks
  kernels  every convolution kernel, both versions, the three passes, on the six
           ResNet-50 shapes: checked against refconv.reference, timed with CUDA
           events against cuDNN (torch, TF32 off) and cuBLAS SGEMM (CuPy) on the
           pass's own GEMM
  ranks    2 ranks on one GPU: allreduce, allgather and reduce-scatter of device
           buffers, CUDA-aware or staged through the host, bytes and time per call
  train    4 ranks: a few steps of the digits CNN on the cuda backend and on the
           numpy backend (float64), the losses compared step by step

Writes DIR/summary.json (every figure) and DIR/summary.md.  ``--dry-run``
rehearses every step on a CPU: the CUDA simulator, tiny shapes, wall-clock
timers, no cuDNN or cuBLAS (each said in its line); CI runs it
(tests/test_gpu_check.py).  Exit status: 0 when every step that ran passed.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = ("env", "compile", "tests", "kernels", "ranks", "train")
LIMITS_S = {"env": 60, "compile": 120, "tests": 240, "kernels": 150, "ranks": 60, "train": 150}  # < 8 min in all
PASSES = ("forward", "backward-data", "backward-filter")
GPU_TESTS = ["tests/test_kernels.py", "tests/test_streams.py", "tests/mpi/test_distconv_cuda.py",
             "tests/mpi/test_layers_cuda.py", "tests/mpi/test_device.py"]


def python_env(simulator):
    """The environment of a child: the simulator on or off, one BLAS thread per rank."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1" if simulator else "0", OMP_NUM_THREADS="1")
    env.setdefault("REFCONV_OVERSUBSCRIBE_GPUS", "1")  # one GPU for up to 4 ranks
    return env


def mpiexec():
    """``mpiexec`` next to this Python (a venv with the mpich wheel), else on PATH, else None."""
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def run(command, args, limit, log, simulator=None):
    """Run a child; returns (exit status or 'timeout', seconds).  Its output goes to ``log``.

    ``simulator``: whether the child runs kernels under Numba's simulator (default: in a dry run)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        try:
            status = subprocess.run(command, cwd=ROOT, env=python_env(args.dry_run if simulator is None else simulator),
                                    stdout=out,
                                    stderr=subprocess.STDOUT, timeout=limit, check=False).returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    return status, time.perf_counter() - started


def tail(path, lines=15):
    return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])


# ------------------------------------------------------------------------- steps
def step_env(args):
    code = ("import json, platform, numpy, numba; from refconv import arrays, info; from mpi4py import MPI\n"
            "v = info.versions(); v['python'] = platform.python_version()\n"
            "v['gpu'] = None\n"
            "if arrays.gpu_available():\n"
            "    cp = arrays.device_module(); p = cp.cuda.runtime.getDeviceProperties(0)\n"
            "    v['gpu'] = p['name'].decode(); v['gpu_memory_gib'] = p['totalGlobalMem'] / 2**30\n"
            "from refconv import collectives\n"
            "v['mpi_library'] = MPI.Get_library_version().splitlines()[0]; v['cuda_aware'] = collectives.cuda_aware()\n"
            "print(json.dumps(v))")
    log = args.out / "env.log"
    status, seconds = run([sys.executable, "-c", code], args, LIMITS_S["env"], log)
    if status != 0:
        return "failed", f"could not read the environment (status {status}): {tail(log, 3)}", {}, seconds
    found = json.loads(pathlib.Path(log).read_text().splitlines()[-1])
    if found["gpu"] is None and not args.dry_run:
        return "failed", "no GPU answers (cupy.cuda.is_available() is False)", found, seconds
    where = found["gpu"] or "no GPU (dry run: the simulator)"
    return "ok", f"{where}; MPI {found['mpi_library'][:40]}; CUDA-aware: {found['cuda_aware']}", found, seconds


DRY_RUN_KERNELS = ("conv_forward.forward_tiled", "conv_backward_data.backward_data_tiled",
                   "conv_backward_filter.backward_filter_tiled")


def step_compile(args):
    log = args.out / "compile.log"
    # NVVM needs no device, so a dry run compiles for real too, but the three 2-D tiled kernels for
    # sm_90 float32 only (the whole proof runs in CI on its own: tests/test_kernel_compile.py).
    subset = ["--cc", "90", "--dtype", "float32", "--kernels", *DRY_RUN_KERNELS] if args.dry_run else []
    status, seconds = run([sys.executable, "-m", "refconv.kernels.resources", "--quiet", *subset,
                           "--json", str(args.out / "resources.json")], args, LIMITS_S["compile"], log,
                          simulator=False)
    if status != 0:
        return "failed", f"status {status}: {tail(log, 3)}", {}, seconds
    found = json.loads((args.out / "resources.json").read_text())
    return "ok", f"{len(found['kernels'])} compilations, ptxas {found['ptxas']}", found, seconds


def step_tests(args):
    log = args.out / "tests.log"
    selected = ["-m", "slow or not extended"] if not args.dry_run else ["-m", "not slow and not extended", "-k", "stream"]
    command = [sys.executable, "-m", "pytest", "-q", "-ra", *selected, *GPU_TESTS]
    status, seconds = run(command, args, LIMITS_S["tests"], log)
    summary = tail(log, 1)
    where = "under the simulator (dry run: the stream tests only)" if args.dry_run else "on the device"
    return ("ok" if status == 0 else "failed"), f"{where}: {summary}", {"summary": summary}, seconds


def step_rank_job(args, job):
    launcher = mpiexec()
    if launcher is None:
        return "could not", "no mpiexec: install the MPI library (the mpich wheel: pip install mpich)", {}, 0.0
    ranks = {"ranks": 2, "train": 4}[job]
    log = args.out / f"{job}.log"
    command = [launcher, "-n", str(ranks), sys.executable, "-m", "mpi4py", str(pathlib.Path(__file__).resolve()),
               "--rank-job", job, "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
    status, seconds = run(command, args, LIMITS_S[job], log)
    result = args.out / f"{job}.json"
    if status != 0 or not result.exists():
        return "failed", f"status {status}: {tail(log, 4)}", {}, seconds
    found = json.loads(result.read_text())
    return found.pop("status"), found.pop("detail"), found, seconds


def step_kernels(args):
    """In this process: the simulator switch must precede numba's import, so it runs as a child."""
    log = args.out / "kernels.log"
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--rank-job", "kernels",
               "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
    status, seconds = run(command, args, LIMITS_S["kernels"], log)
    result = args.out / "kernels.json"
    if status != 0 or not result.exists():
        return "failed", f"status {status}: {tail(log, 4)}", {}, seconds
    found = json.loads(result.read_text())
    return found.pop("status"), found.pop("detail"), found, seconds


# -------------------------------------------------------------- jobs in children
def job_kernels(args):
    """Every conv kernel, both versions, three passes: checked, then timed against cuDNN and SGEMM."""
    import numpy

    from refconv import arrays, kernels, reference
    from refconv.bench.torch_step import QUICK_SHAPES, SHAPES
    from refconv.kernels.resources import gemm_dims
    from refconv.testing.asserts import assert_close

    on_gpu = arrays.gpu_available()
    xp = arrays.device_module()
    # a dry run: one tiny shape, and the checked call is the timed one (the simulator is slow; it compiles nothing)
    shapes, batch, rounds = ({"quick3x3": QUICK_SHAPES["quick3x3"]}, 2, 1) if args.dry_run else (SHAPES, 32, 10)
    notes = []
    torch = cudnn_note = None
    if on_gpu:
        try:
            import torch

            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.benchmark = True
        except ImportError:
            torch, cudnn_note = None, "cuDNN: torch is not installed"
    else:
        cudnn_note = "cuDNN and cuBLAS: no GPU (dry run), so only refconv's kernels ran, timed by the wall clock"
    if cudnn_note:
        notes.append(cudnn_note)

    def timer(fn, events):
        fn()  # warm-up (compiles on the first call)
        times = []
        for _ in range(rounds):
            if events is None:
                arrays.synchronize()
                t0 = time.perf_counter()
                fn()
                arrays.synchronize()
                times.append(time.perf_counter() - t0)
            else:
                start, end = events()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 if hasattr(start, "elapsed_time")
                             else xp.cuda.get_elapsed_time(start, end) / 1e3)
        return sorted(times)[len(times) // 2]

    cupy_events = (lambda: (xp.cuda.Event(), xp.cuda.Event())) if on_gpu else None
    torch_events = (lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))) \
        if torch is not None else None
    rows, worst = [], 0.0
    for name, (C, F, H, K, stride, padding) in shapes.items():
        rng = numpy.random.default_rng(0)
        Ho = (H + 2 * padding - K) // stride + 1
        x = rng.standard_normal((batch, C, H, H), dtype=numpy.float32)
        w = rng.standard_normal((F, C, K, K), dtype=numpy.float32)
        dy = rng.standard_normal((batch, F, Ho, Ho), dtype=numpy.float32)
        g = dict(stride=stride, padding=padding)
        expected = {"forward": reference.conv2d_forward(x, w, **g),
                    "backward-data": reference.conv2d_backward_data(dy, w, x.shape, **g),
                    "backward-filter": reference.conv2d_backward_filter(x, dy, w.shape, **g)}
        reduction = {"forward": C * K * K, "backward-data": F * K * K, "backward-filter": batch * Ho * Ho}
        xd, wd, dyd = (xp.asarray(a) for a in (x, w, dy))
        for pass_ in PASSES:
            flops = 2.0 * batch * F * Ho * Ho * C * K * K
            row = {"shape": name, "pass": pass_, "gflop": flops / 1e9}
            for version in (1, 2):
                call = {"forward": lambda: kernels.conv2d_forward(xd, wd, version=version, **g),
                        "backward-data": lambda: kernels.conv2d_backward_data(dyd, wd, x.shape, version=version, **g),
                        "backward-filter": lambda: kernels.conv2d_backward_filter(xd, dyd, w.shape, version=version,
                                                                                  **g)}[pass_]
                arrays.synchronize()
                t0 = time.perf_counter()
                got = call()
                arrays.synchronize()
                checked_s = time.perf_counter() - t0
                got = arrays.to_host(got)
                assert_close(got, expected[pass_], reduction_length=reduction[pass_])
                worst = max(worst, float(numpy.max(numpy.abs(got - expected[pass_]))))
                row[f"v{version}_ms"] = (checked_s if args.dry_run else timer(call, cupy_events)) * 1e3
            if torch is not None:
                xt, wt, dyt = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
                conv = torch.nn.functional.conv2d
                base = {"forward": lambda: conv(xt, wt, **g),
                        "backward-data": lambda: torch.nn.grad.conv2d_input(xt.shape, wt, dyt, **g),
                        "backward-filter": lambda: torch.nn.grad.conv2d_weight(xt, wt.shape, dyt, **g)}[pass_]
                row["cudnn_ms"] = timer(base, torch_events) * 1e3
            if on_gpu:
                M, Ng, depth = gemm_dims(pass_, batch, C, F, H, K, stride, padding)
                a = xp.asarray(rng.standard_normal((M, depth), dtype=numpy.float32))
                b = xp.asarray(rng.standard_normal((depth, Ng), dtype=numpy.float32))
                row["sgemm_ms"] = timer(lambda: xp.matmul(a, b), cupy_events) * 1e3
                row["v2_of_sgemm"] = row["sgemm_ms"] / row["v2_ms"]
            if "cudnn_ms" in row:
                row["v2_of_cudnn"] = row["cudnn_ms"] / row["v2_ms"]
            rows.append(row)
    detail = f"{len(rows)} (shape, pass) pairs x 2 versions agree with the reference (worst |error| {worst:.2g})"
    if on_gpu and rows:
        fractions = sorted(r["v2_of_sgemm"] for r in rows)
        detail += f"; tiled v2 at {fractions[len(fractions) // 2]:.0%} of SGEMM's speed (median; goal 70%)"
    return {"status": "ok", "detail": "; ".join([detail] + notes), "rows": rows, "batch": batch,
            "timer": "CUDA events" if on_gpu else "wall clock (dry run)"}


def job_ranks(args):
    """2 ranks: the three collectives on device buffers, with the bytes the stats count."""
    import numpy
    from mpi4py import MPI

    from refconv import arrays, collectives, device

    comm = MPI.COMM_WORLD
    device.bind(comm, "auto", oversubscribe=True, warn=False)
    xp = arrays.device_module()
    rows = []
    sizes = (1 << 12,) if args.dry_run else (1 << 20, 1 << 24)
    for nbytes in sizes:
        n = nbytes // 4
        x = xp.ones((2, n // 2), dtype=numpy.float32) * (comm.Get_rank() + 1)
        calls = {"allreduce": lambda: collectives.allreduce(comm, x),
                 "allgather": lambda: collectives.allgather(comm, x, [2, 2], axis=0),
                 "reduce_scatter": lambda: collectives.reduce_scatter(comm, x, [1, 1], axis=0)}
        for kind, call in calls.items():
            call()
            collectives.stats.reset()
            arrays.synchronize()
            comm.Barrier()
            t0 = time.perf_counter()
            out = call()
            arrays.synchronize()
            seconds = time.perf_counter() - t0
            recorded = collectives.stats.summary()[kind]
            host = arrays.to_host(out)
            expected = {"allreduce": [3.0, 3.0], "allgather": [1.0, 1.0, 2.0, 2.0], "reduce_scatter": [3.0]}[kind]
            assert numpy.all(host[:, 0] == expected) and numpy.all(host == host[:, :1]), (kind, host[:, :2])
            rows.append({"op": kind, "buffer_bytes": nbytes, "recorded_bytes": recorded["bytes"],
                         "calls": recorded["calls"], "ms": seconds * 1e3})
    path = "CUDA-aware (device buffers to MPI)" if collectives.cuda_aware() else "host staging"
    on = "device" if arrays.gpu_available() else "host (dry run)"
    return {"status": "ok", "detail": f"{path}, buffers on the {on}; {len(rows)} calls checked", "rows": rows,
            "cuda_aware": collectives.cuda_aware()}


def job_train(args):
    """4 ranks, sample=2 x channel=2: the same steps on the cuda and the numpy backend."""
    import numpy
    from mpi4py import MPI

    from refconv import arrays, datasets, device
    from refconv.model import Model
    from refconv.optim import SGD
    from refconv.train import step

    comm = MPI.COMM_WORLD
    device.bind(comm, "auto", oversubscribe=True, warn=False)
    # The simulator runs each thread in Python (a block's syncthreads costs far more): the dry run
    # trains a two-conv cut of the digits CNN (same layer kinds, 2 channels: one per channel rank,
    # and the batch norm's per-channel sums, a 256-thread block per channel, stay few) on 8x8 digits,
    # batch 4 (the first conv's grid folds the channel ranks into samples: one sample per rank).
    x, y, _, _ = datasets.load_digits(upsample=1 if args.dry_run else 2, dtype=numpy.float64)
    batch, steps = (4, 1) if args.dry_run else (64, 5)
    spec = TINY_DIGITS_CNN if args.dry_run else "digits-cnn"
    losses, params = {}, {}
    for backend in ("cuda", "numpy"):
        model = Model.from_spec(spec, comm=comm, backend=backend, dtype=numpy.float64, seed=0,
                                defaults={"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x"})
        assert model.body.layers[0].backend.name == backend, (backend, model.body.layers[0].backend)
        optimizer = SGD(model, 0.05, momentum=0.9)
        batches = datasets.batches(x, y, batch, seed=0, epoch=0, drop_last=True)
        losses[backend] = [step(model, optimizer, xb, yb) for (xb, yb), _ in zip(batches, range(steps))]
        # the parameters after the steps: the backward passes and the update, not only the forward
        params[backend] = [numpy.asarray(arrays.to_host(getattr(layer, name)))
                           for _, layer, name in model.named_parameters()]
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses["cuda"], losses["numpy"]))
    moved = max(float(numpy.max(numpy.abs(a - b) / (numpy.abs(b) + 1e-12)))
                for a, b in zip(params["cuda"], params["numpy"]))
    worst_params = comm.allreduce(moved, op=MPI.MAX)
    ok = worst < 1e-9 and worst_params < 1e-6
    name = spec if isinstance(spec, str) else spec["name"]
    return {"status": "ok" if ok else "failed", "losses": losses, "worst_relative_difference": worst,
            "worst_parameter_difference": worst_params,
            "detail": f"{steps} step(s) of {name}, batch {batch}, on sample=2 x channel=2: cuda and numpy losses "
                      f"agree to {worst:.1e}, parameters after the steps to {worst_params:.1e} (float64)"}


TINY_DIGITS_CNN = {"name": "digits-cnn cut to 2 channels (dry run)", "in_channels": 1, "layers": [
    {"type": "conv", "out": 2, "kernel": 3, "padding": 1, "grid": "no-channel"}, {"type": "batchnorm"},
    {"type": "relu"}, {"type": "conv", "out": 2, "kernel": 3, "padding": 1}, {"type": "batchnorm"},
    {"type": "relu"}, {"type": "maxpool", "kernel": 2}, {"type": "gap"}, {"type": "linear", "out": 10}]}


JOBS = {"kernels": job_kernels, "ranks": job_ranks, "train": job_train}


def rank_job(args):
    from mpi4py import MPI

    result = JOBS[args.rank_job](args)
    if MPI.COMM_WORLD.Get_rank() == 0:
        (args.out / f"{args.rank_job}.json").write_text(json.dumps(result, indent=1))


# ---------------------------------------------------------------------- the run
STEP_FUNCTIONS = {"env": step_env, "compile": step_compile, "tests": step_tests, "kernels": step_kernels,
                  "ranks": lambda a: step_rank_job(a, "ranks"), "train": lambda a: step_rank_job(a, "train")}


def markdown(summary):
    lines = [f"# refconv device check, {summary['date']}", "",
             f"{'Dry run on a CPU (the simulator)' if summary['dry_run'] else 'On the device'}; "
             f"{summary['seconds']:.0f} s in all.", "", "| step | status | seconds | detail |", "| --- | --- | --- | --- |"]
    for s in summary["steps"]:
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {s['detail'].replace('|', '/')} |")
    kernels = next((s for s in summary["steps"] if s["step"] == "kernels"), None)
    if kernels and kernels.get("figures", {}).get("rows"):
        lines += ["", f"Kernels ({kernels['figures']['timer']}, batch {kernels['figures']['batch']}, float32), ms:", "",
                  "| shape | pass | v1 | v2 | cuDNN | SGEMM | v2 / SGEMM speed |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in kernels["figures"]["rows"]:
            cell = lambda key, fmt="{:.3f}": fmt.format(r[key]) if key in r else "-"  # noqa: E731
            lines.append(f"| {r['shape']} | {r['pass']} | {cell('v1_ms')} | {cell('v2_ms')} | {cell('cudnn_ms')} | "
                         f"{cell('sgemm_ms')} | {cell('v2_of_sgemm', '{:.0%}')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gpu_out"), help="where the results go")
    p.add_argument("--dry-run", action="store_true", help="rehearse on a CPU: the simulator, tiny shapes")
    p.add_argument("--only", nargs="+", choices=STEPS, help="run these steps only")
    p.add_argument("--rank-job", choices=sorted(JOBS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rank_job:
        return rank_job(args)
    started = time.perf_counter()
    steps = []
    for name in args.only or STEPS:
        print(f"== {name} (limit {LIMITS_S[name]} s)", flush=True)
        try:
            status, detail, figures, seconds = STEP_FUNCTIONS[name](args)
        except Exception as error:  # noqa: BLE001 (a step's own bug is a finding, not the end of the check)
            status, detail, figures, seconds = "failed", f"{type(error).__name__}: {error}", {}, 0.0
        print(f"   {status}: {detail}", flush=True)
        steps.append({"step": name, "status": status, "detail": detail, "seconds": seconds, "figures": figures})
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": args.dry_run,
               "seconds": time.perf_counter() - started, "steps": steps}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text(markdown(summary))
    print(f"wrote {args.out / 'summary.json'} and summary.md")
    return 0 if all(s["status"] in ("ok", "could not") for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
