"""The one-shot device check (scripts/gpu_check.py), on the CPU.

``make test`` checks the script itself, piece by piece and cheaply: its step list and limits, the
order it runs the steps in and the report it writes after each (with stand-in steps), its refusals
(no mpiexec, a missing module, a missing multi-rank CUDA file), the kill of a step's whole process
group at its limit, the kernel table, and the real env and ranks steps end to end (a few seconds).

The whole rehearsal (``scripts/gpu_check.sh --dry-run``: every step under the simulator with tiny
shapes, about 150 s of one core, whose tests step re-runs tests that ``make test`` runs elsewhere) is
``make gpu-dry-run`` (marked ``gpu_dry_run`` and ``extended``, so ``make test-extended`` runs it too):
run it before spending device time.
"""

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import types

import numpy
import pytest

from refconv import arrays, kernels

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def load(name):
    """A module of scripts/ (not a package), as the check itself imports it."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


gpu_check = load("gpu_check")
jobs = load("gpu_check_jobs")


@pytest.mark.mpi
@pytest.mark.extended
@pytest.mark.gpu_dry_run
def test_the_device_check_runs_end_to_end_as_a_dry_run(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # the check sets it per step
    # a session of its own: the check ends its running step's process group on SIGTERM, and whatever
    # is left is killed, so a timeout here leaves no compile or mpiexec process running
    check = subprocess.Popen(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = check.communicate(timeout=900)
    finally:
        if check.poll() is None:
            check.terminate()
            try:
                check.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(check.pid, signal.SIGKILL)
                check.wait()
    assert check.returncode == 0, stdout[-4000:] + stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == ["env", "compile", "tests", "kernels", "ranks", "train"]
    assert all(s["status"] == "ok" for s in steps.values()), {k: (s["status"], s["detail"]) for k, s in steps.items()}
    assert summary["dry_run"] is True and summary["still_to_run"] == [] and summary["jobs"] == os.cpu_count()
    # the preflight found every module, and the first launches on both streams agreed with the host
    assert steps["env"]["figures"]["missing"] == {}
    assert {k: v["ok"] for k, v in steps["env"]["figures"]["first_launch"].items()} == {"null stream": True,
                                                                                        "side stream": True}
    # what each step proved, in figures
    # a dry run: the forward tiled kernels of versions 2 and 3, sm_90 float32 (the whole proof: test_kernel_compile)
    compiled = steps["compile"]["figures"]["kernels"]
    assert {(r["kernel"], r["cc"], r["dtype"]) for r in compiled if "error" not in r} == {
        ("conv_forward.forward_tiled", "sm_90", "float32"), ("conv_forward.forward_register_tiled", "sm_90", "float32")}
    # G1: the multi-rank CUDA tests are collected through their launcher, by node id, and some of them ran
    tests = steps["tests"]["figures"]
    for node in ("tests/mpiexec/test_mpi.py::test_mpi[distconv_cuda::test_cuda_stationary_x_and_y-2]",
                 "tests/mpiexec/test_mpi.py::test_mpi[distconv_cuda::test_cuda_stationary_w-4]",
                 "tests/mpiexec/test_mpi.py::test_mpi[layers_cuda::test_every_layer_on_the_cuda_backend_matches_numpy-2]",
                 "tests/mpiexec/test_mpi.py::test_mpi[device::test_local_rank_and_one_gpu_each-2]"):
        assert node in tests["mpi_cuda_node_ids"], tests["mpi_cuda_node_ids"]
    assert "tests/mpiexec/test_mpi.py::test_mpi[distconv_cuda::test_cuda_spatial_with_stride_and_dilation-2]" in tests["ran"]
    assert tests["counts"]["passed"] == len(tests["ran"]) and "failed" not in tests["counts"]
    rows = steps["kernels"]["figures"]["rows"]
    assert {(r["shape"], r["dims"], r["pass"]) for r in rows} == {
        (s, d, p) for s, d in (("tiny2d", 2), ("tiny3d", 3)) for p in ("forward", "backward-data", "backward-filter")}
    assert all(r["v1_ms"] > 0 and r["v2_ms"] > 0 and r["v3_ms"] > 0 and "error" not in r for r in rows)
    calls = steps["ranks"]["figures"]["rows"]
    assert {c["op"] for c in calls} == {"allreduce", "allgather", "reduce_scatter"}
    assert all(c["calls"] == 1 and c["recorded_bytes"] > 0 for c in calls)
    losses = steps["train"]["figures"]["losses"]
    assert len(losses["cuda"]) == len(losses["numpy"]) >= 1
    assert steps["train"]["figures"]["worst_relative_difference"] < 1e-9
    assert steps["train"]["figures"]["worst_parameter_difference"] < 1e-6
    page = (tmp_path / "summary.md").read_text()
    assert "| kernels | ok |" in page and "Dry run on a CPU" in page


def test_the_step_limits_fit_one_device_command():
    """A device machine stops a command at 600 s: the limits add up to 500 s, as the header says."""
    assert sum(gpu_check.LIMITS_S.values()) <= 500 and set(gpu_check.LIMITS_S) == set(gpu_check.STEPS)
    assert f"add up to {sum(gpu_check.LIMITS_S.values())} s" in " ".join(gpu_check.__doc__.split())
    assert "--jobs" in gpu_check.__doc__ and gpu_check.parser().parse_args([]).jobs == os.cpu_count()


def test_the_multi_rank_cuda_tests_are_selected_from_the_launchers_node_ids():
    collected = ["tests/cuda_kernels/test_streams.py::test_a", "tests/cuda_kernels/test_kernels.py::test_b[1]",
                 "tests/mpiexec/test_mpi.py::test_mpi[distconv_cuda::test_x-2]", "tests/mpiexec/test_mpi.py::test_mpi[grid::test_y-2]",
                 "tests/mpiexec/test_mpi.py::test_mpi[layers_cuda::test_z-2]", "tests/mpiexec/test_mpi.py::test_mpi[device::test_w-4]"]
    chosen, cuda, absent = gpu_check.selected_tests(collected, dry_run=False)
    assert cuda == [collected[2], collected[4], collected[5]] and absent == []
    assert chosen == collected[:2] + cuda  # not the CPU-only multi-rank tests
    _, _, absent = gpu_check.selected_tests(collected[:4], dry_run=False)
    assert absent == ["tests/mpiexec/launched/test_layers_cuda.py", "tests/mpiexec/launched/test_device.py"]  # the step then fails


def test_the_summary_is_written_after_every_step(tmp_path, monkeypatch):
    """A run cut during a step still leaves the summary of the steps before it."""
    def env(args):
        args.missing = {}
        return "ok", "fine", {}, 0.1

    def cut(args):
        raise KeyboardInterrupt  # what the device machine's limit does to the run

    monkeypatch.setattr(gpu_check, "STEP_FUNCTIONS", dict(gpu_check.STEP_FUNCTIONS, env=env, compile=cut))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--out", str(tmp_path), "--only", "compile", "tests"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["env"] and summary["still_to_run"] == ["compile", "tests"]
    assert "| compile | not yet run |" in (tmp_path / "summary.md").read_text()


def test_the_kernel_table_shows_version_3_against_sgemm_and_cudnn():
    """A device run's kernels step, rendered: each row's v3 time and its fractions of SGEMM's and cuDNN's speed."""
    row = {"shape": "conv3", "batch": 32, "pass": "forward", "v1_ms": 9.0, "v2_ms": 4.0, "v3_ms": 1.5,
           "cudnn_ms": 1.0, "sgemm_ms": 1.2, "v2_of_sgemm": 0.3, "v3_of_sgemm": 0.8, "v3_of_cudnn": 1.0 / 1.5}
    summary = {"date": "today", "dry_run": False, "seconds": 1.0, "still_to_run": [],
               "steps": [{"step": "kernels", "status": "ok", "seconds": 1.0, "detail": "",
                          "figures": {"timer": "CUDA events", "rows": [row]}}]}
    page = gpu_check.markdown(summary)
    assert "| v1 | v2 | v3 | cuDNN | SGEMM | v2 / SGEMM speed | v3 / SGEMM speed | v3 / cuDNN speed |" in page
    assert "| conv3 | 32 | forward | 9.000 | 4.000 | 1.500 | 1.000 | 1.200 | 30% | 80% | 67% | - |" in page


def test_the_preflight_names_the_wheel_to_carry_for_a_missing_module(tmp_path):
    """On an image without threadpoolctl (refconv.collectives, which both steps import, needs it), every step
    says it could not run, the exit status says the check failed, and the carry lines name the wheel with
    pyproject.toml's pin."""
    hidden = tmp_path / "hide"
    hidden.mkdir()
    (hidden / "threadpoolctl.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'threadpoolctl'\", name='threadpoolctl')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run", "--out", str(tmp_path / "out"),
                           "--only", "ranks"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [("env", "could not"), ("ranks", "could not")]
    carry = summary["steps"][0]["figures"]["carry"]
    assert carry[0].startswith("missing: threadpoolctl ") and '"threadpoolctl>=3.1"' in carry[1]
    assert "--no-index" in carry[2], carry


def test_the_wheel_pins_come_from_pyproject():
    pins = gpu_check.requirements()
    assert pins["pyyaml"] == "pyyaml>=6" and pins["pytest-xdist"].startswith("pytest-xdist>=")
    assert set(gpu_check.WHEELS.values()) - {"refconv", "mpich", "cupy-cuda12x"} <= set(pins), set(pins)
    needed = {m for modules in jobs.NEEDS.values() for m in modules} | set(jobs.ON_A_GPU)
    unknown = {m for m in needed if m not in gpu_check.WHEELS and m.split(".")[0] not in gpu_check.WHEELS}
    assert not unknown, unknown  # every module the preflight imports has its wheel
    assert gpu_check.wheel("nvidia.cu13") == "nvidia-cuda-nvdisasm" and gpu_check.wheel("yaml") == "pyyaml"
    assert gpu_check.wheel("mpi4py.MPI") == "mpi4py"


def test_one_failing_kernel_row_does_not_stop_the_others(monkeypatch):
    kernel_rows = load("kernel_rows")

    def broken(*args, **kwargs):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(kernels, "conv2d_forward", broken)
    table = kernel_rows.KernelRows(arrays, batch=1, rounds=1, timed=False)
    rows = list(table.rows("tiny", (1, 1, 3, 1, 1, 0)))  # C, F, H, K, stride, padding: a few threads each
    assert [r["pass"] for r in rows] == ["forward", "backward-data", "backward-filter"]
    assert rows[0]["error"] == "RuntimeError: launch failed"
    assert all("error" not in r and r["v2_ms"] > 0 for r in rows[1:]), rows
    assert max(r["worst_error"] for r in rows[1:]) < 1e-5 and numpy.isfinite(rows[1]["gflop"])


def test_the_first_launch_runs_on_both_streams_and_checks_the_result():
    launches = jobs.first_launch()
    assert set(launches) == {"null stream", "side stream"} and all(v["ok"] for v in launches.values()), launches


# ------------------------------------------------- the script's own pieces, cheaply (the rest: make gpu-dry-run)
def stand_in(status, detail="", figures=None):
    """A step function that returns at once what a step returns."""
    def step(args):
        return status, detail, dict(figures or {}), 0.5
    return step


def test_a_run_goes_through_every_step_in_order_and_reports_each(tmp_path, monkeypatch):
    """Every step runs, in STEPS' order; a failing step, or one that raises (a bug in the step), is a finding
    in its row and in the exit status, and the steps after it still run."""
    def broken(args):
        raise RuntimeError("the step's own bug")

    fakes = {name: stand_in("ok", f"{name} fine") for name in gpu_check.STEPS}
    fakes.update(kernels=broken, ranks=stand_in("failed", "allreduce | wrong"))
    monkeypatch.setattr(gpu_check, "STEP_FUNCTIONS", fakes)
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == list(gpu_check.STEPS) == \
        ["env", "compile", "tests", "kernels", "ranks", "train"]
    assert [s["status"] for s in summary["steps"]] == ["ok", "ok", "ok", "failed", "failed", "ok"]
    assert summary["steps"][3]["detail"] == "RuntimeError: the step's own bug"
    assert summary["dry_run"] is True and summary["still_to_run"] == []
    page = (tmp_path / "summary.md").read_text()
    assert page.startswith("# refconv device check, ") and "Dry run on a CPU (the simulator)" in page
    assert "| step | status | seconds | detail |" in page and "| train | ok | 0.5 | train fine |" in page
    assert "| ranks | failed | 0.5 | allreduce / wrong |" in page  # a bar in a detail cannot break the table
    # every step passing: exit status 0; --only runs env and the steps named, in STEPS' order
    monkeypatch.setattr(gpu_check, "STEP_FUNCTIONS", {name: stand_in("ok") for name in gpu_check.STEPS})
    assert gpu_check.main(["--out", str(tmp_path), "--only", "train", "compile"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["env", "compile", "train"] and summary["dry_run"] is False
    assert "On the device" in (tmp_path / "summary.md").read_text()


def test_the_refusals_name_what_is_missing(tmp_path, monkeypatch):
    """A step that cannot run says why in its line: no mpiexec; a module the preflight found missing; no test
    collected of a multi-rank CUDA file."""
    args = types.SimpleNamespace(dry_run=True, out=tmp_path, jobs=1)
    monkeypatch.setattr(gpu_check, "mpiexec", lambda: None)
    assert gpu_check.step_job(args, "ranks", 2) == (
        "could not", "no mpiexec: install the MPI library (the mpich wheel: pip install mpich)", {}, 0.0)

    def env(args):
        args.missing = {"kernels": [("cupy", "cupy", "No module named 'cupy'")]}  # (module, missing, error)
        return "failed", "cupy is missing", {}, 0.1

    ran = []
    monkeypatch.setattr(gpu_check, "STEP_FUNCTIONS", dict(
        {name: (lambda a, name=name: ran.append(name) or ("ok", "", {}, 0.1)) for name in gpu_check.STEPS}, env=env))
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--only", "kernels", "ranks"]) == 1
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert (steps[1]["step"], steps[1]["status"], steps[1]["detail"]) == (
        "kernels", "could not", "cannot import cupy: see env's carry lines")
    assert ran == ["ranks"]  # the step that can still run, runs
    _, _, absent = gpu_check.selected_tests(["tests/mpiexec/test_mpi.py::test_mpi[device::test_w-2]"], dry_run=True)
    assert absent == ["tests/mpiexec/launched/test_distconv_cuda.py", "tests/mpiexec/launched/test_layers_cuda.py"]


def alive(pid):
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_step_past_its_limit_is_cut_with_its_whole_process_group(tmp_path):
    """The step's child leads a process group, and at the limit the whole group is killed: a grandchild
    (a compile worker, an mpiexec rank) does not outlive the step."""
    pid_file = tmp_path / "grandchild.pid"
    fake_step = [sys.executable, "-c",
                 "import pathlib, subprocess, sys, time\n"
                 "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                 f"pathlib.Path({str(pid_file)!r}).write_text(str(grandchild.pid))\n"
                 "time.sleep(120)\n"]
    args = types.SimpleNamespace(dry_run=True)
    status, seconds = gpu_check.run(fake_step, args, 3, tmp_path / "fake.log")
    assert status == "timeout" and 3 <= seconds < 60, (status, seconds)
    grandchild = int(pid_file.read_text())
    for _ in range(100):  # SIGKILL is delivered at once; its reaping by init may lag a little
        if not alive(grandchild):
            break
        time.sleep(0.05)
    assert not alive(grandchild), f"the step's grandchild {grandchild} outlived the limit"
    # a step that ends in time gives its exit status, and its output goes to the log
    status, _ = gpu_check.run([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], args, 60,
                              tmp_path / "quick.log")
    assert status == 3 and (tmp_path / "quick.log").read_text() == "hello\n"


@pytest.mark.mpi
def test_the_env_and_ranks_steps_run_for_real_in_a_dry_run(tmp_path):
    """The real script, end to end on its cheap steps (seconds): the preflight and first launch, and 2 ranks'
    collectives under mpiexec, with the summary they write."""
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run", "--out", str(tmp_path), "--only", "ranks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == ["env", "ranks"] and all(s["status"] == "ok" for s in steps.values()), steps
    assert steps["env"]["figures"]["missing"] == {}
    assert all(v["ok"] for v in steps["env"]["figures"]["first_launch"].values())
    calls = steps["ranks"]["figures"]["rows"]
    assert {c["op"] for c in calls} == {"allreduce", "allgather", "reduce_scatter"}
    assert all(c["calls"] == 1 and c["recorded_bytes"] > 0 for c in calls)
    assert "| ranks | ok |" in (tmp_path / "summary.md").read_text()
