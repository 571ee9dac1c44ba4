"""The one-shot device check: in one run on one GPU, what the CPU cannot prove.

    bash scripts/gpu_check.sh [--dry-run]         # the wrapper: picks the Python, makes refconv importable
    python scripts/gpu_check.py --out DIR [--dry-run] [--only STEP ...] [--jobs N]

Steps, each with its own time limit; the limits add up to 500 s, under the 600 s a
device machine gives one command (``--only`` runs a part, e.g. ``--only env compile
tests`` then ``--only kernels ranks train``).  A step that fails, or cannot run here,
says so in one line, and the others still run:

  env      the preflight (every module each step imports; the wheels to carry for any that is
           missing), the GPU, the libraries, the MPI library and whether it is CUDA-aware, and
           the first device action: a tiny launch on CuPy's null stream and one on a side stream,
           each checked against the host (scripts/gpu_check_jobs.py: first_launch)
  compile  the compile proof: every kernel through NVVM (refconv.kernels.resources)
  tests    the GPU tests on the device, without the simulator: the kernels, the stream order,
           and the multi-rank CUDA tests (tests/mpiexec/launched/test_{distconv_cuda,layers_cuda,device}.py)
           through their launcher, tests/mpiexec/test_mpi.py; the node ids it collected are in the summary
  kernels  every convolution kernel, versions 1-3, the three passes, on the six ResNet-50
           shapes (batch 32) and three CosmoFlow shapes (batch 4), one row at a time: checked against refconv.reference, timed with CUDA events
           against cuDNN (torch, TF32 off) and cuBLAS SGEMM (CuPy) on the pass's own GEMM
  ranks    2 ranks on one GPU: allreduce, allgather and reduce-scatter of device buffers,
           CUDA-aware or staged through the host, bytes and time per call
  train    4 ranks: a few steps of the digits CNN on the cuda backend and on the numpy
           backend (float64), the losses compared step by step

Writes DIR/summary.json (every figure) and DIR/summary.md after every step, so a run cut
short still says what it found.  ``--dry-run`` rehearses every step on a CPU: the CUDA
simulator, tiny shapes, wall-clock timers, no cuDNN or cuBLAS (each said in its line), and
in the tests step every test collected but only a few run; ``make gpu-dry-run`` runs it
and checks its summary (tests/cuda_kernels/test_gpu_check.py, whose other tests ``make test`` runs).  Exit status: 0 when every step ran and passed.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
JOBS_SCRIPT = HERE / "gpu_check_jobs.py"
STEPS = ("env", "compile", "tests", "kernels", "ranks", "train")
LIMITS_S = {"env": 40, "compile": 60, "tests": 200, "kernels": 120, "ranks": 30, "train": 50}  # 500 s in all
GPU_TEST_FILES = ["tests/cuda_kernels/test_kernels.py", "tests/cuda_kernels/test_kernels3d.py", "tests/cuda_kernels/test_streams.py"]
# The multi-rank CUDA tests: tests/mpiexec/launched/test_<name>.py, which only tests/mpiexec/test_mpi.py's launcher runs
# (tests/mpiexec/launched/conftest.py ignores them for pytest itself).  Their node ids are test_mpi[<name>::<test>-<ranks>].
MPI_CUDA_FILES = ("distconv_cuda", "layers_cuda", "device")
# A dry run collects every test above but runs only these (the simulator takes minutes over the rest):
DRY_RUN_TESTS = re.compile(r"(test_streams\.py|test_kernels\.py::.*stream|\[distconv_cuda::test_cuda_spatial"
                           r"|\[device::.*-2\])")
# The modules whose absence the preflight turns into wheels to carry: the module (or its top-level name)
# -> the wheel.
WHEELS = {"yaml": "pyyaml", "threadpoolctl": "threadpoolctl", "numpy": "numpy", "numba": "numba-cuda",
          "mpi4py": "mpi4py", "pytest": "pytest", "hypothesis": "hypothesis", "xdist": "pytest-xdist",
          "cupy": "cupy-cuda12x", "nvidia.cuda_nvcc": "nvidia-cuda-nvcc-cu12", "nvidia.cu13": "nvidia-cuda-nvdisasm",
          "mpich": "mpich", "refconv": "refconv"}


def wheel(missing):
    """The wheel that brings the ``missing`` module: by its full name, else by its top-level name."""
    return WHEELS.get(missing) or WHEELS.get(missing.split(".")[0], missing.split(".")[0])


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

    ``simulator``: whether the child runs kernels under Numba's simulator (default: in a dry run).
    The child leads a process group of its own, and a timeout (or an interrupt of this check) kills
    that whole group: the compile step's pool workers and mpiexec's ranks are its children, and a
    kill of the child alone left them running, orphaned."""
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(command, cwd=ROOT, env=python_env(args.dry_run if simulator is None else simulator),
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            kill_group(child)
    return status, time.perf_counter() - started


def kill_group(child):
    """SIGKILL the process group that ``child`` leads (what is left of it), and reap the child."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended: every member has exited
        pass
    child.wait()


def tail(path, lines=15):
    return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])


def job_command(job, args, ranks=None):
    command = [sys.executable, str(JOBS_SCRIPT), job, "--out", str(args.out)] + (["--dry-run"] if args.dry_run else [])
    if ranks:
        command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py"] + command[1:]
    return command


def job_result(job, args, status, log):
    """The JSON a job wrote, or ``None`` with why: a job cut at its limit may have written part of it."""
    path = args.out / f"{job}.json"
    found = json.loads(path.read_text()) if path.exists() else None
    if status != 0:
        return found, f"status {status}: {tail(log, 4)}"
    return found, None if found else f"wrote no {path.name}: {tail(log, 4)}"


# ------------------------------------------------------------------------- preflight
def carry_lines(missing, python_version):
    """How to bring the missing wheels: download them where there is a network, install them here."""
    wheels = sorted({wheel(name) for rows in missing.values() for _, name, _ in rows})
    required = requirements()
    specs = [required.get(w, w) for w in wheels]
    platform = sysconfig.get_platform().replace("linux", "manylinux2014").replace("-", "_")
    return [f"missing: {', '.join(wheels)} (the steps that need them: {', '.join(sorted(missing))})",
            f"  on a machine with a network: python{python_version} -m pip download --only-binary=:all: "
            f"--python-version {python_version} --platform {platform} -d wheels " + " ".join(f'"{s}"' for s in specs),
            f"  here: {sys.executable} -m pip install --no-index --find-links wheels {' '.join(wheels)}"]


def requirements():
    """``{wheel name: requirement}`` from pyproject.toml (its dependencies and extras): one source of the pins."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the bare names
        return {}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = {}
    for spec in project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]:
        name = re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0].lower()
        found.setdefault(name, spec.split(";")[0].strip())
    return found


# ------------------------------------------------------------------------- steps
def step_env(args):
    log = args.out / "env.log"
    status, seconds = run(job_command("env", args) + ["--steps", *args.steps], args, LIMITS_S["env"], log)
    found, problem = job_result("env", args, status, log)
    if found is None:
        return "failed", f"could not read the environment ({problem})", {}, seconds
    args.missing = found.get("missing", {})
    if args.missing:
        lines = carry_lines(args.missing, ".".join(map(str, sys.version_info[:2])))
        print("\n".join("   " + line for line in lines), flush=True)
        found["carry"] = lines
    return found.pop("status"), found.pop("detail") + (f" ({problem})" if problem else ""), found, seconds


DRY_RUN_KERNELS = ("conv_forward.forward_tiled", "conv_forward.forward_register_tiled")


def step_compile(args):
    log = args.out / "compile.log"
    # NVVM needs no device, so a dry run compiles for real too, but the forward tiled kernels (versions 2 and 3)
    # for sm_90 float32 only (the whole proof runs in CI on its own: tests/cuda_kernels/test_kernel_compile.py).
    subset = ["--cc", "90", "--dtype", "float32", "--kernels", *DRY_RUN_KERNELS] if args.dry_run else []
    status, seconds = run([sys.executable, "-m", "refconv.kernels.resources", "--quiet", "--jobs", str(args.jobs),
                           *subset, "--json", str(args.out / "resources.json")], args, LIMITS_S["compile"], log,
                          simulator=False)
    if status != 0:
        return "failed", f"status {status}: {tail(log, 3)}", {}, seconds
    found = json.loads((args.out / "resources.json").read_text())
    return "ok", f"{len(found['kernels'])} compilations, ptxas {found['ptxas']}", found, seconds


def selected_tests(collected, dry_run):
    """``(to run, the multi-rank CUDA node ids, what is missing)`` from the collected node ids."""
    mpi = [n for n in collected if n.startswith("tests/mpiexec/test_mpi.py::")]
    cuda = [n for n in mpi if any(f"[{name}::" in n for name in MPI_CUDA_FILES)]
    absent = [f"tests/mpiexec/launched/test_{name}.py" for name in MPI_CUDA_FILES if not any(f"[{name}::" in n for n in cuda)]
    chosen = [n for n in collected if n not in mpi] + cuda
    if dry_run:
        chosen = [n for n in chosen if DRY_RUN_TESTS.search(n)]
    return chosen, cuda, absent


def step_tests(args):
    log = args.out / "tests.log"
    marks = ["-m", "not slow and not extended"] if args.dry_run else ["-m", "slow or not extended"]
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    status, seconds = run(pytest + ["--collect-only", "-q", *marks, *GPU_TEST_FILES, "tests/mpiexec/test_mpi.py"], args,
                          LIMITS_S["tests"] // 4, log)
    collected = [line.strip() for line in pathlib.Path(log).read_text().splitlines() if "::" in line]
    if status != 0:
        return "failed", f"collecting the tests, status {status}: {tail(log, 3)}", {}, seconds
    chosen, cuda, absent = selected_tests(collected, args.dry_run)
    figures = {"collected": len(collected), "mpi_cuda_node_ids": cuda, "ran": chosen}
    if absent:
        return "failed", f"collected no test of {', '.join(absent)}", figures, seconds
    # A dry run's few tests run in one process: xdist workers would each import and collect everything again
    # for a handful of tests (make test runs these files on its own workers).
    workers = ["-n", str(min(args.jobs, 8)), "--dist", "loadgroup"] if args.jobs > 1 and not args.dry_run else []
    status, more = run(pytest + ["-q", "-ra", *workers, *chosen], args, LIMITS_S["tests"] - seconds, log)
    seconds += more
    summary = tail(log, 1)
    figures["summary"] = summary
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    figures["counts"] = counts
    where = "under the simulator (dry run: these run, the rest are collected only)" if args.dry_run \
        else "on the device"
    detail = f"{where}: {summary}; {len(chosen)} of {len(collected)} collected ran, {len(cuda)} multi-rank CUDA " \
             f"node ids among those collected (e.g. {cuda[0]})"
    ok = status == 0 and counts.get("passed", 0) + counts.get("skipped", 0) == len(chosen)
    return ("ok" if ok else "failed"), detail, figures, seconds


def step_job(args, job, ranks=None):
    """A job in a child (the simulator switch must precede numba's import): kernels alone, ranks and train
    under ``mpiexec``."""
    if ranks and mpiexec() is None:
        return "could not", "no mpiexec: install the MPI library (the mpich wheel: pip install mpich)", {}, 0.0
    log = args.out / f"{job}.log"
    status, seconds = run(job_command(job, args, ranks), args, LIMITS_S[job], log)
    found, problem = job_result(job, args, status, log)
    if found is None:
        return "failed", problem, {}, seconds
    status_, detail = found.pop("status"), found.pop("detail")
    if problem:  # cut at its limit, or died after writing part of its result
        status_, detail = "failed", f"{problem}; rows written before: {len(found.get('rows', []))}"
    return status_, detail, found, seconds


STEP_FUNCTIONS = {"env": step_env, "compile": step_compile, "tests": step_tests,
                  "kernels": lambda a: step_job(a, "kernels"), "ranks": lambda a: step_job(a, "ranks", 2),
                  "train": lambda a: step_job(a, "train", 4)}


# ---------------------------------------------------------------------- the run
def markdown(summary):
    lines = [f"# refconv device check, {summary['date']}", "",
             f"{'Dry run on a CPU (the simulator)' if summary['dry_run'] else 'On the device'}; "
             f"{summary['seconds']:.0f} s in all.", "", "| step | status | seconds | detail |", "| --- | --- | --- | --- |"]
    for s in summary["steps"]:
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']:.1f} | {s['detail'].replace('|', '/')} |")
    for name in summary["still_to_run"]:
        lines.append(f"| {name} | not yet run | - | - |")
    kernels = next((s for s in summary["steps"] if s["step"] == "kernels"), None)
    if kernels and kernels.get("figures", {}).get("rows"):
        lines += ["", f"Kernels ({kernels['figures']['timer']}, float32), ms:", "",
                  "| shape | batch | pass | v1 | v2 | v3 | cuDNN | SGEMM | v2 / SGEMM speed | v3 / SGEMM speed "
                  "| v3 / cuDNN speed | error |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in kernels["figures"]["rows"]:
            cell = lambda key, fmt="{:.3f}": fmt.format(r[key]) if key in r else "-"  # noqa: E731
            lines.append(f"| {r['shape']} | {r.get('batch', '-')} | {r['pass']} | {cell('v1_ms')} | {cell('v2_ms')} | "
                         f"{cell('v3_ms')} | {cell('cudnn_ms')} | {cell('sgemm_ms')} | "
                         f"{cell('v2_of_sgemm', '{:.0%}')} | {cell('v3_of_sgemm', '{:.0%}')} | "
                         f"{cell('v3_of_cudnn', '{:.0%}')} | {r.get('error', '-')[:120]} |")
    return "\n".join(lines) + "\n"


def write_summary(args, steps, started, still_to_run):
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dry_run": args.dry_run,
               "seconds": time.perf_counter() - started, "jobs": args.jobs, "steps": steps,
               "still_to_run": list(still_to_run)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text(markdown(summary))


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gpu_out"), help="where the results go")
    p.add_argument("--dry-run", action="store_true", help="rehearse on a CPU: the simulator, tiny shapes")
    p.add_argument("--only", nargs="+", choices=STEPS, help="run these steps only (env always runs first)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes for the compile proof and pytest workers (default: the core count)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.steps = [s for s in STEPS if s == "env" or not args.only or s in args.only]
    args.missing = {}
    started = time.perf_counter()
    steps = []
    for k, name in enumerate(args.steps):
        print(f"== {name} (limit {LIMITS_S[name]} s)", flush=True)
        if name in args.missing and name != "env":
            modules = ", ".join(sorted({m for m, _, _ in args.missing[name]}))
            status, detail, figures, seconds = "could not", f"cannot import {modules}: see env's carry lines", {}, 0.0
        else:
            try:
                status, detail, figures, seconds = STEP_FUNCTIONS[name](args)
            except Exception as error:  # noqa: BLE001 (a step's own bug is a finding, not the end of the check)
                status, detail, figures, seconds = "failed", f"{type(error).__name__}: {error}", {}, 0.0
        print(f"   {status}: {detail}", flush=True)
        steps.append({"step": name, "status": status, "detail": detail, "seconds": seconds, "figures": figures})
        write_summary(args, steps, started, args.steps[k + 1:])
    print(f"wrote {args.out / 'summary.json'} and summary.md")
    return 0 if all(s["status"] == "ok" for s in steps) else 1


def end_on_sigterm(signum, frame):
    """SIGTERM (a test's or a machine's limit) as an exit, so that the running step's group is killed too."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, end_on_sigterm)
    sys.exit(main())
