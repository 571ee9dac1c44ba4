"""Under mpiexec, a check_layer failure that every rank raises alike is printed once, by the lowest
failed rank; the others say one line each (issue 41, point 5).  One mpiexec launch of 3 ranks."""

import pathlib

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
