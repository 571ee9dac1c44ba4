"""refconv.testing's checks on simulated ranks: a mutant planted on every rank or on one rank is
caught by check_layer (expect_mismatch), and check_records holds a layer to its records()."""

import numpy
import pytest

import refconv
from refconv import simulated
from refconv.testing.check import check_records
from refconv.testing.mutants import expect_mismatch
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem

PROBLEM = ConvProblem(N=3, C=4, F=5, H=5, W=4, Kh=3, Kw=3, padding=(1, 1))


class ForgetsBias(refconv.DistConv2d):
    """A mutant: the bias is never added, so y is off by b and nothing else is."""

    def set_global_parameters(self, w, b=None):
        super().set_global_parameters(w, None if b is None else 0 * b)


class OneRankOff(refconv.DistConv2d):
    """A mutant of one rank only: the last rank's block of y is scaled by 1.5."""

    def forward(self, x_loc):
        y_loc = super().forward(x_loc)
        return y_loc * 1.5 if self.grid.rank == self.grid.size - 1 else y_loc


def layer(comm, cls, algorithm="stationary-x"):
    grid = refconv.ProcessGrid(comm, sample=1 if comm.size % 2 else 2, channel=comm.size // (1 if comm.size % 2 else 2))
    return cls(PROBLEM.C, PROBLEM.F, 3, padding=1, grid=grid, algorithm=algorithm, backend="numpy",
               dtype=numpy.float64, input_shape=PROBLEM.x_shape)


@on_ranks(1, 2, 3, 4)
def test_a_mutant_on_every_rank_is_caught_on_every_rank(comm):
    mutant = layer(comm, ForgetsBias)
    with mutant.grid:
        assert expect_mismatch(mutant, PROBLEM, tensors={"y"}) == {"y"}


@on_ranks(2, 3, 4)
def test_a_mutant_of_one_rank_is_caught_on_every_rank(comm):
    mutant = layer(comm, OneRankOff)
    with mutant.grid:
        assert "y" in expect_mismatch(mutant, PROBLEM, tensors={"y"})


@on_ranks(2, 4)
def test_a_correct_layer_is_not_caught(comm):
    correct = layer(comm, refconv.DistConv2d)
    with correct.grid, pytest.raises(AssertionError, match="found no mismatch; the planted bug went unseen"):
        expect_mismatch(correct, PROBLEM)


@on_ranks(1, 2, 3, 4)
def test_check_records_holds_each_algorithm_to_its_records(comm):
    for algorithm in ("stationary-x", "stationary-y", "stationary-w"):
        conv = layer(comm, refconv.DistConv2d, algorithm)
        x_loc = numpy.ones(conv.input_distribution.local_shape(conv.grid.rank))
        dy_loc = numpy.ones(conv.output_distribution.local_shape(conv.grid.rank))
        check_records(comm, lambda: (conv.forward(x_loc), conv.backward(dy_loc)), conv.records(), algorithm)
        conv.grid.close()


def test_check_records_catches_a_call_the_records_leave_out():
    def body(comm):
        conv = layer(comm, refconv.DistConv2d, "stationary-y")
        x_loc = numpy.ones(conv.input_distribution.local_shape(conv.grid.rank))
        dy_loc = numpy.ones(conv.output_distribution.local_shape(conv.grid.rank))
        check_records(comm, lambda: (conv.forward(x_loc), conv.backward(dy_loc)), conv.records()[1:], "short")
    with pytest.raises(AssertionError, match="short: the calls made differ from the records from call 0"):
        simulated.run(body, 4)
