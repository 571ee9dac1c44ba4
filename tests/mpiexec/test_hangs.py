"""Hangs under real MPI explained (issue 43): planted bugs run under mpiexec at 3 and 4 ranks, each
rank writes its call record (refconv.collectives.flight), and ``refconv diagnose`` must name the
planted line (marked ``# BUG`` in tests/mpiexec/hangs/).  A correct run killed by SIGTERM must show
no divergence and where each rank was; a run that ends well leaves no record behind."""

import argparse
import io
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from refconv.collectives import flight
from refconv.commands import diagnose
from refconv.testing.mpirun import find_mpiexec

HANGS = pathlib.Path(__file__).parent / "hangs"
HANG_GUARD_S = 60       # a job that runs longer has hung: the test fails (not a timing assertion)


def _env(record_dir, timeout="2"):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", REFCONV_RECORD_DIR=str(record_dir))
    env.pop("REFCONV_FAULT", None)
    env.pop("REFCONV_RUN_ID", None)
    if timeout is None:
        env.pop("REFCONV_TIMEOUT", None)
    else:
        env["REFCONV_TIMEOUT"] = timeout
    return env


def _bug_line(script):
    lines = (HANGS / script).read_text().splitlines()
    return f"{script}:{next(i + 1 for i, line in enumerate(lines) if '# BUG' in line)}"


def _diagnose(record_dir):
    out = io.StringIO()
    status = diagnose.run(argparse.Namespace(dir=str(record_dir), trace=None, window=20), out)
    return status, out.getvalue()


def _first_divergence(report):
    """The lines of the first-divergence block (up to the next heading)."""
    block, inside = [], False
    for line in report.splitlines():
        if line.startswith("first divergence"):
            inside = True
        elif inside and not line.startswith("  "):
            break
        if inside:
            block.append(line)
    return "\n".join(block)


@pytest.mark.parametrize("ranks", [3, 4])
@pytest.mark.parametrize("script", ["skip.py", "wrong_peer.py", "root.py"])
def test_diagnose_names_the_planted_line(tmp_path, script, ranks):
    job = subprocess.run([find_mpiexec(), "-n", str(ranks), sys.executable, str(HANGS / script)],
                         env=_env(tmp_path), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert job.returncode != 0, job.stdout + job.stderr
    assert "refconv: collective timeout" in job.stderr, job.stderr
    files = sorted(p.name for p in tmp_path.glob("calls.*.json"))
    assert files == [f"calls.local.rank{r}.json" for r in range(ranks)], (files, job.stderr)
    status, report = _diagnose(tmp_path)
    first = _first_divergence(report)
    assert status == 1, report
    assert _bug_line(script) in first, report
    assert f"{ranks} of {ranks} ranks' records" in report
    assert (tmp_path / "diagnose.trace.json").is_file()


@pytest.mark.parametrize("ranks", [3, 4])
def test_a_correct_run_killed_by_a_signal_shows_no_divergence(tmp_path, ranks):
    proc = subprocess.Popen([find_mpiexec(), "-n", str(ranks), sys.executable, str(HANGS / "loop.py")],
                            env=_env(tmp_path, timeout=None), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if "looping" in line:
                break
        proc.send_signal(signal.SIGTERM)
        proc.wait(HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = [flight.load(p) for p in sorted(tmp_path.glob("calls.*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(ranks))
    assert {r["reason"] for r in records} == {"signal"}, [(r["rank"], r["reason"]) for r in records]
    status, report = _diagnose(tmp_path)
    assert status == 0, report
    assert "no divergence" in report
    where = report.split("where each rank was at the end:\n")[1].splitlines()
    assert [line.split()[:2] for line in where[:ranks]] == [["rank", str(r)] for r in range(ranks)], report
    assert all("loop.py:" in line for line in where[:ranks]), report


def test_a_run_that_ends_well_leaves_no_record(tmp_path):
    folder = tmp_path / "calls"
    code = ("from mpi4py import MPI; import numpy; from refconv import collectives; "
            "collectives.allreduce(MPI.COMM_WORLD, numpy.ones(4)); print(collectives.get_timeout())")
    job = subprocess.run([find_mpiexec(), "-n", "3", sys.executable, "-c", code], env=_env(folder, timeout=None),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert job.returncode == 0, job.stderr
    assert re.findall(r"300\.0|None", job.stdout) == ["300.0"] * 3   # the default deadline (ranks' lines may run together)
    assert not folder.exists(), list(folder.iterdir())


def test_refconv_timeout_none_opts_out_of_the_default_deadline(tmp_path):
    """(REFCONV_TIMEOUT=0 is read by the same code: test_faults checks both in one process.)"""
    code = "from refconv import collectives; print(collectives.get_timeout())"
    job = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-c", code], env=_env(tmp_path, "none"),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert re.findall(r"300\.0|None", job.stdout) == ["None", "None"], (job.stdout, job.stderr)
