"""Under mpiexec, a check_layer failure that every rank raises alike is printed once, by the lowest
failed rank; the others say one line each (issue 41, point 5).  One mpiexec launch of 3 ranks."""

import os
import pathlib
import subprocess
import sys

import pytest

from refconv.testing import mpirun

FIXTURE = pathlib.Path(__file__).parent / "harness_fixtures" / "wrong_slot_on_rank2.py"


@pytest.mark.mpi
def test_a_report_every_rank_raises_is_printed_once():
    path = str(FIXTURE)
    tests = mpirun.list_tests([path])[path]
    out = mpirun.run_file(path, 3, tests)["test_wrong_slot_on_rank_2"]
    assert not out.passed
    text = out.output
    assert text.count("elements differ") == 1, text
    assert text.count("lie in rank 2's block") == 1, text
    assert "failed on every rank of 3 (the same report)" in text, text
    assert "FAIL test_wrong_slot_on_rank_2 rank 0\n" in text, text
    for rank in (1, 2):     # if they got their line out before rank 0's abort ended the job
        if f"FAIL test_wrong_slot_on_rank_2 rank {rank}" in text:
            assert f"FAIL test_wrong_slot_on_rank_2 rank {rank} (the same report as rank 0)" in text, text
    assert max(len(line) for line in text.splitlines()) < 500, text


SCRIPT = """
import sys
sys.path.insert(0, {folder!r})
from wrong_slot_on_rank2 import WrongSlotOnRank2, PROBLEM
import numpy, refconv
from mpi4py import MPI
from refconv.testing.check import check_layer
grid = refconv.ProcessGrid(MPI.COMM_WORLD, channel=3)
layer = WrongSlotOnRank2(PROBLEM.C, PROBLEM.F, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64,
                         algorithm="stationary-x")
check_layer(layer, PROBLEM)
"""


@pytest.mark.mpi
def test_a_plain_script_prints_the_shared_report_once(tmp_path):
    """The same failure in a plain script (the abort hook, not the harness): only the reporting rank's
    line carries the report; another rank that gets its line out says whose report it is, briefly."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(folder=str(FIXTURE.parent)))
    done = subprocess.run([str(pathlib.Path(sys.executable).parent / "mpiexec"), "-n", "3", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "uncaught" in line]
    reports = [line for line in lines if "lie in rank 2's block" in line]
    assert len(reports) == 1 and reports[0].startswith("[rank 0]"), lines
    others = [line for line in lines if line not in reports]
    assert all("(the same report as rank 0's)" in line and len(line) < 400 for line in others), others
