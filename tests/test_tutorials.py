"""The tutorials' MPI scripts run on 4 ranks and report their own checks.

The ```python blocks of tutorials/*.md run in tests/test_docs.py; this file runs
the companion scripts under mpiexec and checks that the excerpts the pages quote
(```python-noexec blocks) are still in the scripts.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from refconv.testing.mpirun import find_mpiexec

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"

# script -> lines its output must contain (each printed only after a real comparison)
SCRIPTS = {
    "distconv_four_ranks.py": [
        "stationary-x on channel=4: stationary-x",
        "stationary-y on channel=4: stationary-y",
        "stationary-w on channel=4, filter_groups=2: stationary-w",
        "OK: y, dx, dw, db match the reference; buffer sizes match ALGORITHMS.md section 4",
        "all strategies match the reference",
    ],
    "halos.py": [
        "OK: every rank's window equals the zero-padded global x; halo bytes match the plan",
        "OK: y, dx, dw, db match the reference",
    ],
}
# page -> the script its ```python-noexec excerpts come from
EXCERPTS = {
    "02_distconv_on_four_ranks.md": "distconv_four_ranks.py",
    "03_halos.md": "halos.py",
}
NOEXEC = re.compile(r"^```python-noexec\n(.*?)^```", re.S | re.M)


def _env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    return env


@pytest.mark.mpi
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_tutorial_script_runs_on_four_ranks(script):
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("no mpiexec next to sys.executable or on PATH: install the mpich wheel (refconv[test])")
    cmd = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", str(TUTORIALS / script)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} did not finish in 120 s:\n{e.stdout}\n{e.stderr}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} exited with {proc.returncode}:\n{output}"
    missing = [line for line in SCRIPTS[script] if line not in proc.stdout]
    assert not missing, f"{script}: output lacks {missing}:\n{output}"


@pytest.mark.mpi
def test_tutorial_04_trains_and_matches_the_serial_run():
    """tutorials/04: the mixed-strategy model trains on 4 ranks and --check-serial agrees."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("no mpiexec next to sys.executable or on PATH: install the mpich wheel (refconv[test])")
    cmd = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", "-m", "refconv.cli", "train",
           "--model", str(TUTORIALS / "mixed_strategies.yaml"), "--epochs", "1", "--max-steps", "3",
           "--check-serial", "3", "--dtype", "float64", "--backend", "numpy", "--no-progress"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"refconv train did not finish in 120 s:\n{e.stdout}\n{e.stderr}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"refconv train exited with {proc.returncode}:\n{output}"
    assert "check-serial: OK" in proc.stdout, output
    for kind in ("halo", "alltoallv", "reduce_scatter", "allgather", "allreduce"):
        assert f"  {kind} " in proc.stdout, f"no {kind} line in the summary:\n{output}"


def _stripped_lines(text):
    return [line.strip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize("page", sorted(EXCERPTS))
def test_quoted_excerpts_are_in_the_script(page):
    """Each ```python-noexec block of the page appears, line for line (indentation aside), in its script."""
    blocks = NOEXEC.findall((TUTORIALS / page).read_text())
    assert blocks, f"{page} quotes no excerpt"
    script = _stripped_lines((TUTORIALS / EXCERPTS[page]).read_text())
    for block in blocks:
        quoted = _stripped_lines(block)
        found = any(script[i:i + len(quoted)] == quoted for i in range(len(script) - len(quoted) + 1))
        assert found, f"{page}: this excerpt is no longer in {EXCERPTS[page]}:\n{block}"
