"""The one-shot device check, rehearsed on the CPU (``scripts/gpu_check.sh --dry-run``).

No GPU is lent to CI, so the check runs with the simulator and tiny shapes: every
step must run and pass, and the results must land where the device run puts them.
The pieces that make it unable to hide a failure are checked one by one below: the
multi-rank CUDA tests collected through their launcher, the preflight, the summary
after every step, the step limits, the per-row kernel results.
"""

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys

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
    """On an image without pyyaml (``import refconv`` needs it), every step says it could not run, the
    exit status says the check failed, and the carry lines name the wheel with pyproject.toml's pin."""
    hidden = tmp_path / "hide"
    (hidden / "yaml").mkdir(parents=True)
    (hidden / "yaml" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'yaml'\", name='yaml')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--dry-run", "--out", str(tmp_path / "out"),
                           "--only", "ranks"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(s["step"], s["status"]) for s in summary["steps"]] == [("env", "could not"), ("ranks", "could not")]
    carry = summary["steps"][0]["figures"]["carry"]
    assert carry[0].startswith("missing: pyyaml ") and '"pyyaml>=6"' in carry[1] and "--no-index" in carry[2]


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
