"""The cause hints (tutorials/exercises/causes.py): each plants its common wrong answer into a reference
solution, checks only the part it breaks, and checks the line the checker adds, ``cause: ...``.  The
issue's own wrong answers are among them: exercise 6 without its reduction, exercise 13 without
``cuda.syncthreads()``, exercise 1 with a missing entry (no ``-1``)."""

import pytest

from exercise_checks import CI, planted, quiet


@pytest.fixture(autouse=True)
def _ci_profile(monkeypatch):
    monkeypatch.setenv("REFCONV_EXERCISES_PROFILE", CI)


PARTIAL = "a reduction over the channel group is missing"


def test_exercise_6_without_its_reduction_is_a_partial_sum():
    wrong = planted(6, "    dx_loc = collectives.reduce_scatter(comm, dx_part, layer.c_counts, axis=1)",
                    "    c0 = sum(layer.c_counts[:comm.rank])\n"
                    "    dx_loc = dx_part[:, c0:c0 + layer.c_counts[comm.rank]]")
    result = quiet(6, module=wrong, parts=["backward"])
    assert result.status["backward"] == "failed", result.report
    assert f"cause: your dx_loc equals one rank's partial sum: {PARTIAL}" in result.report, result.report


def test_exercise_5_without_its_reduce_scatter_is_a_partial_sum():
    wrong = planted(5, "    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)",
                    "    f0 = sum(layer.f_counts[:comm.rank])\n"
                    "    y_loc = y_part[:, f0:f0 + layer.f_counts[comm.rank]]")
    result = quiet(5, module=wrong, parts=["forward"])
    assert result.status["forward"] == "failed", result.report
    assert f"cause: your y_loc equals one rank's partial sum: {PARTIAL}" in result.report, result.report


def test_exercise_2_without_its_allreduce_is_one_ranks_samples():
    result = quiet(2, module=planted(2, "collectives.allreduce(comm, db_part)", "db_part"), parts=["backward_filter"])
    assert result.status["backward_filter"] == "failed", result.report
    assert ("cause: your db equals the gradient of one rank's own samples: a reduction over the samples is "
            "missing") in result.report, result.report


def test_exercise_3_with_ones_for_padding_is_the_halo():
    wrong = planted(3, "x_win = numpy.zeros((n, c, hi - lo)", "x_win = numpy.ones((n, c, hi - lo)")
    result = quiet(3, module=wrong, parts=["halo_exchange"])
    assert result.status["halo_exchange"] == "failed", result.report
    assert "cause: values differ only next to a block edge: the halo" in result.report, result.report


def test_exercise_13_without_syncthreads_is_a_race():
    result = quiet(13, module=planted(13, "    cuda.syncthreads()\n", ""), parts=["conv_tile_kernel"])
    assert result.status["conv_tile_kernel"] == "failed", result.report
    assert "conv_tile_kernel: FAILED on the smallest case found:" in result.report
    assert "cause: results change from run to run: a race; is a cuda.syncthreads() missing?" in result.report


def test_exercise_1_with_an_entry_missing_says_so_without_a_minus_one():
    result = quiet(1, module=planted(1, "if q != r and max(lo, h0) < min(hi, h1):",
                                     "if q != r and q != 0 and max(lo, h0) < min(hi, h1):"), parts=["rows_needed"])
    assert result.status["rows_needed"] == "failed", result.report
    assert "rank 1: your dict has no entry for 0 (the reference: (" in result.report, result.report
    assert "-1" not in result.report


def test_a_wrong_answer_of_no_known_shape_gets_no_cause():
    wrong = planted(5, "return y_loc + b_loc.reshape(1, -1, 1, 1)",
                    "return y_loc + (comm.rank + 1) * b_loc.reshape(1, -1, 1, 1)")
    result = quiet(5, module=wrong, parts=["forward"])
    assert result.status["forward"] == "failed", result.report
    assert "cause:" not in result.report, result.report


def test_a_kernel_wrong_in_the_same_way_every_run_is_not_called_a_race():
    # exercise 13 loads one weight too few: deterministic, so both one-thread-at-a-time runs agree
    result = quiet(13, module=planted(13, "if t < K * K:", "if t < K * K - 1:"), parts=["conv_tile_kernel"])
    assert result.status["conv_tile_kernel"] == "failed", result.report
    assert "a race" not in result.report, result.report
