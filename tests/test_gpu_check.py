"""The one-shot device check, rehearsed on the CPU (``scripts/gpu_check.sh --dry-run``).

No GPU is lent to CI, so the check runs with the simulator and tiny shapes: every
step must run and pass, and the results must land where the device run puts them.
"""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.mpi
def test_the_device_check_runs_end_to_end_as_a_dry_run(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # the check sets it per step
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == ["env", "compile", "tests", "kernels", "ranks", "train"]
    assert all(s["status"] == "ok" for s in steps.values()), {k: (s["status"], s["detail"]) for k, s in steps.items()}
    assert summary["dry_run"] is True
    # what each step proved, in figures
    compiled = steps["compile"]["figures"]["kernels"]  # a dry run: the 2-D tiled kernels, sm_90 float32
    assert {(r["kernel"], r["cc"], r["dtype"]) for r in compiled if "error" not in r} == {
        (k, "sm_90", "float32") for k in ("conv_forward.forward_tiled", "conv_backward_data.backward_data_tiled",
                                          "conv_backward_filter.backward_filter_tiled")}
    rows = steps["kernels"]["figures"]["rows"]
    assert {(r["shape"], r["pass"]) for r in rows} == {("quick3x3", p) for p in ("forward", "backward-data",
                                                                                 "backward-filter")}
    assert all(r["v1_ms"] > 0 and r["v2_ms"] > 0 for r in rows)
    calls = steps["ranks"]["figures"]["rows"]
    assert {c["op"] for c in calls} == {"allreduce", "allgather", "reduce_scatter"}
    assert all(c["calls"] == 1 and c["recorded_bytes"] > 0 for c in calls)
    losses = steps["train"]["figures"]["losses"]
    assert len(losses["cuda"]) == len(losses["numpy"]) >= 1
    assert steps["train"]["figures"]["worst_relative_difference"] < 1e-9
    assert steps["train"]["figures"]["worst_parameter_difference"] < 1e-6
    page = (tmp_path / "summary.md").read_text()
    assert "| kernels | ok |" in page and "Dry run on a CPU" in page
