"""The device check's children: what runs in a fresh process (``scripts/gpu_check.py`` launches them).

    python scripts/gpu_check_jobs.py JOB --out DIR [--dry-run]             # env, kernels
    mpiexec -n R python -m mpi4py scripts/gpu_check_jobs.py JOB --out DIR   # ranks, train

Each job writes ``DIR/JOB.json`` ({"status", "detail", ...figures}); the kernel job
rewrites it after every row, so a run cut at its time limit still returns the rows it
finished.  Only the standard library is imported at the top: the env job is also the
preflight, and must say which module is missing rather than die of it.
"""

import argparse
import importlib
import json
import os
import pathlib
import sys
import time

# What each step of the check imports, in the child that runs it (its own imports, then the ones of
# the tests it runs): the preflight imports all of them, so a missing wheel is named before any step
# starts.  ``cupy`` is needed on a GPU only (under the simulator the device arrays are NumPy's).
NEEDS = {
    "env": ("numpy", "numba", "refconv", "refconv.commands.info", "refconv.collectives", "mpi4py.MPI"),
    "compile": ("numba", "refconv.kernels.resources", "nvidia.cuda_nvcc", "nvidia.cu13"),  # ptxas, nvdisasm
    "tests": ("pytest", "hypothesis", "xdist", "refconv.kernels", "refconv.testing.mpirun",
              "refconv.testing.strategies", "refconv.backend", "refconv.layers", "mpi4py.MPI"),
    "kernels": ("refconv.kernels", "refconv.reference", "refconv.reference.shapes", "refconv.testing.asserts"),
    "ranks": ("mpi4py.MPI", "refconv.collectives", "refconv.device"),
    "train": ("mpi4py.MPI", "refconv.model", "refconv.optim", "refconv.train", "refconv.datasets"),
}
ON_A_GPU = ("cupy",)


def missing_modules(steps, on_gpu):
    """``{step: [(module, the module that is missing (it, or one it imports), error), ...]}`` for every step that cannot import
    what it needs.  An import that fails for another reason (a broken install) is reported with its error."""
    found = {}
    for step in steps:
        for module in NEEDS[step] + (ON_A_GPU if on_gpu else ()):
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as error:  # names the missing module
                found.setdefault(step, []).append((module, error.name or module, str(error)))
            except Exception as error:  # noqa: BLE001 (mpi4py without its MPI library, or a broken install)
                name = "mpich" if module == "mpi4py.MPI" else module
                found.setdefault(step, []).append((module, name, f"{type(error).__name__}: {error}"))
    return found


def gpu_present():
    """Whether CuPy finds a GPU, without importing refconv (whose own imports may be missing)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import cupy

        return cupy.cuda.is_available()
    except ImportError:
        return None  # unknown: the preflight reports cupy as missing


def job_env(args):
    """The preflight, the versions and MPI library, and the first device action (:func:`first_launch`)."""
    on_gpu = gpu_present()
    missing = missing_modules(args.steps, on_gpu is not False)
    result = {"missing": missing, "gpu": None}
    if "env" in missing:
        return dict(result, status="could not", detail="the environment step's own imports are missing")
    import platform

    from mpi4py import MPI

    from refconv import arrays, collectives
    from refconv.commands import info

    versions = info.versions()
    versions["python"] = platform.python_version()
    result.update(versions=versions, mpi_library=MPI.Get_library_version().splitlines()[0],
                  cuda_aware=collectives.cuda_aware())
    if arrays.gpu_available():
        properties = arrays.device_module().cuda.runtime.getDeviceProperties(0)
        result.update(gpu=properties["name"].decode(), gpu_memory_gib=properties["totalGlobalMem"] / 2**30)
    elif not args.dry_run:
        return dict(result, status="failed", detail="no GPU answers (cupy.cuda.is_available() is False)")
    launches = first_launch()
    result["first_launch"] = launches
    where = result["gpu"] or "no GPU (dry run: the simulator)"
    bad = [f"{k}: {v['error']}" for k, v in launches.items() if not v["ok"]]
    detail = (f"{where}; MPI {result['mpi_library'][:40]}; CUDA-aware: {result['cuda_aware']}; first launches: "
              + ", ".join(f"{k} {v['how']}" for k, v in launches.items()))
    return dict(result, status="failed" if bad else "ok", detail=detail + ("; " + "; ".join(bad) if bad else ""))


def first_launch():
    """One tiny kernel (ReLU of 7 numbers) on CuPy's null stream, one on a side stream, each checked against the host.

    numba-cuda 0.30 takes CuPy arrays through DLPack, whose ``__dlpack__(stream=0)`` is forbidden for CUDA:
    CuPy's null stream has handle 0, so ``kernels/geometry.stream`` passes it by the legacy default stream's
    handle (the same stream by another name).  If the library's launch is refused all the same, it is retried
    directly on the legacy default stream's handle, and the row says so, with the refusal.  Under the
    simulator the streams are ignored: both rows run.
    """
    import numpy
    from numba import cuda

    from refconv import arrays, kernels
    from refconv.kernels import elementwise
    from refconv.kernels.geometry import grid_1d

    xp = arrays.device_module()
    host = numpy.linspace(-3.0, 3.0, 7, dtype=numpy.float32)
    expected = numpy.maximum(host, 0)
    rows = {}

    def checked(run, how):
        try:
            got = arrays.to_host(run())
        except Exception as error:  # noqa: BLE001 (the refusal is the finding)
            return {"ok": False, "how": how, "error": f"{type(error).__name__}: {error}"[:300]}
        same = bool(numpy.array_equal(got, expected))
        return {"ok": same, "how": how, **({} if same else {"error": f"got {got.tolist()}, expected {expected.tolist()}"})}

    def legacy():
        x = xp.asarray(host)
        y = xp.empty_like(x)
        blocks, threads = grid_1d(x.size)
        elementwise.relu_forward_kernel[blocks, threads, cuda.legacy_default_stream()](x, y)
        arrays.synchronize()
        return y

    rows["null stream"] = checked(lambda: kernels.relu_forward(xp.asarray(host)),
                                  "CuPy's null stream, launched as refconv does (kernels/geometry.stream)")
    if not rows["null stream"]["ok"] and arrays.gpu_available():
        refused = rows["null stream"]["error"]
        rows["null stream"] = checked(legacy, "refused on handle 0; ran on the legacy default stream's handle")
        rows["null stream"]["refused"] = refused
    if arrays.gpu_available():
        with xp.cuda.Stream(non_blocking=True):
            rows["side stream"] = checked(lambda: kernels.relu_forward(xp.asarray(host)), "a non-blocking CuPy stream")
    else:
        rows["side stream"] = checked(lambda: kernels.relu_forward(xp.asarray(host)), "ignored by the simulator")
    return rows


def job_kernels(args):
    """Every conv kernel, every version, three passes, one row at a time: checked, then timed against
    cuDNN and SGEMM.  A failing row records its error and the next row runs."""
    import numpy

    from refconv import arrays
    from refconv.reference.shapes import SHAPES, SHAPES3D
    from kernel_rows import KernelRows

    # (name, shape, dims, batch): the six ResNet-50 shapes at batch 32 and three CosmoFlow shapes at batch 4;
    # a dry run: one tiny image and one tiny volume, and the checked call is the timed one (the simulator is slow)
    if args.dry_run:
        shapes, batch, rounds = [("tiny2d", TINY2D, 2, 2), ("tiny3d", TINY3D, 3, 1)], 2, 1
    else:
        shapes = [(n, s, 2, 32) for n, s in SHAPES.items()] + [(n, SHAPES3D[n], 3, 4) for n in COSMOFLOW_MEASURED]
        batch, rounds = 32, 10
    table = KernelRows(arrays, batch, rounds, timed=not args.dry_run)
    result = {"status": "running", "detail": "", "rows": [], "batch": batch, "notes": table.notes,
              "timer": "CUDA events" if table.on_gpu else "wall clock (dry run)"}
    for name, shape, dims, n in shapes:
        for row in table.rows(name, shape, dims, n):
            result["rows"].append(row)
            write(args, "kernels", result)  # what is done so far survives a cut
    failed = [f"{r['shape']} {r['pass']}: {r['error']}" for r in result["rows"] if "error" in r]
    worst = max((r.get("worst_error", 0.0) for r in result["rows"]), default=0.0)
    ok_rows = len(result["rows"]) - len(failed)
    detail = f"{ok_rows} of {len(result['rows'])} (shape, pass) rows agree with the reference, every version " \
             f"(worst |error| {worst:.2g})"
    for version, name in ((2, "tiled v2"), (3, "register-tiled v3")):
        fractions = sorted(r[f"v{version}_of_sgemm"] for r in result["rows"] if f"v{version}_of_sgemm" in r)
        if fractions:
            detail += f"; {name} at {fractions[len(fractions) // 2]:.0%} of SGEMM's speed (median" + \
                      ("; goal 70% on the large shapes)" if version == 3 else ")")
    result.update(status="failed" if failed or not result["rows"] else "ok",
                  detail="; ".join([detail] + failed[:3] + table.notes))
    return result


COSMOFLOW_MEASURED = ("cosmo1", "cosmo2", "cosmo3")  # the three with the most work per layer
# C, F, H (=W, =D), K, stride, padding: under the simulator, one block per launch and few stages (a rehearsal)
TINY2D = (2, 2, 6, 3, 1, 1)
TINY3D = (2, 2, 4, 3, 1, 1)


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
        model.close()
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

JOBS = {"env": job_env, "kernels": job_kernels, "ranks": job_ranks, "train": job_train}
RANK_JOBS = ("ranks", "train")  # under mpiexec: rank 0 writes the result


def write(args, job, result):
    (args.out / f"{job}.json").write_text(json.dumps(result, indent=1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job", choices=sorted(JOBS))
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--steps", nargs="+", default=list(NEEDS), help="env: the steps whose imports to check")
    args = p.parse_args(argv)
    result = JOBS[args.job](args)
    rank = 0
    if args.job in RANK_JOBS:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        write(args, args.job, result)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))  # kernel_rows.py beside this file
    main()
