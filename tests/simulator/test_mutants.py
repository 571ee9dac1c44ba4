"""refconv.testing.mutants: a planted bug is reported as caught, a correct layer is not (one rank)."""

import numpy
import pytest
from mpi4py import MPI

import refconv
from refconv.testing.mutants import expect_mismatch, mismatched_tensors
from refconv.testing.strategies import ConvProblem

PROBLEM = ConvProblem(N=2, C=3, F=2, H=5, W=4, Kh=3, Kw=3, padding=(1, 1))


class ForgetsBias(refconv.DistConv2d):
    """A mutant: the bias is never added, so y is off by b and nothing else is."""

    def set_global_parameters(self, w, b=None):
        super().set_global_parameters(w, None if b is None else 0 * b)


def layer(cls=refconv.DistConv2d):
    grid = refconv.ProcessGrid(MPI.COMM_SELF)
    return cls(PROBLEM.C, PROBLEM.F, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64)


def test_a_planted_bug_is_caught_for_the_tensor_it_breaks():
    assert expect_mismatch(layer(ForgetsBias), PROBLEM) == {"y"}
    assert expect_mismatch(layer(ForgetsBias), PROBLEM, tensors={"y"}) == {"y"}


def test_a_correct_layer_is_not_caught():
    with pytest.raises(AssertionError, match="found no mismatch; the planted bug went unseen"):
        expect_mismatch(layer(), PROBLEM)


def test_caught_for_the_wrong_tensor_is_not_caught():
    with pytest.raises(AssertionError, match=r"expected \['dx'\] to differ, but check_layer reported \['y'\]"):
        expect_mismatch(layer(ForgetsBias), PROBLEM, tensors={"dx"})


def test_tensors_must_be_results_of_a_layer():
    with pytest.raises(ValueError, match="tensors: expected a subset of"):
        expect_mismatch(layer(ForgetsBias), PROBLEM, tensors={"w"})


def test_mismatched_tensors_reads_the_names_at_line_starts():
    message = "failed on rank 0 of 1:\nL on P:\ndb: 2 of 2 elements differ\n  (0,): actual 1\ny: 1 of 9"
    assert mismatched_tensors(message) == {"db", "y"}
