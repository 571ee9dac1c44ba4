"""check_layer attributes a difference to the rank that owns it (issue 41, point 5).

A wrong slot planted on rank 2 only: the gathered y differs on every rank, so every rank fails, but
the report says once that the wrong elements lie in rank 2's block.  A crash on every rank prints
one traceback, not one per rank per rank."""

import importlib.util
import pathlib
import traceback

import numpy
import pytest

import refconv
from refconv import simulated
from refconv.testing.asserts import CollectiveAssertionError, assert_all_ranks
from refconv.testing.check import blame, check_layer


def _harness_fixture(name):
    """A module of tests/mpiexec/harness_fixtures/ (which pytest does not collect), by its path."""
    path = pathlib.Path(__file__).parents[1] / "mpiexec" / "harness_fixtures" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"harness_fixture_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the planted mistake and the problem of the same check under mpiexec (tests/mpiexec/test_mpi_blame.py), one definition
_WRONG_SLOT = _harness_fixture("wrong_slot_on_rank2")
WrongSlotOnRank2, PROBLEM = _WRONG_SLOT.WrongSlotOnRank2, _WRONG_SLOT.PROBLEM


class Float32Forward(refconv.DistConv2d):
    """A dtype mistake on every rank: forward hands back float32 where the layer is float64."""

    def forward(self, x_loc):
        return super().forward(x_loc).astype(numpy.float32)

    def backward(self, dy_loc):
        return super().backward(dy_loc.astype(numpy.float32))


def _check(cls):
    def body(comm):
        grid = refconv.ProcessGrid(comm, channel=comm.size)
        layer = cls(PROBLEM.C, PROBLEM.F, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64,
                    algorithm="stationary-x")
        try:
            return check_layer(layer, PROBLEM)
        finally:
            grid.close()
    return body


def _text(error):
    return str(error) + "\n".join(getattr(error, "__notes__", []))


def test_a_wrong_slot_on_rank_2_is_blamed_on_rank_2_once():
    with pytest.raises(AssertionError) as caught:
        simulated.run(_check(WrongSlotOnRank2), 3)
    text = str(caught.value)      # rank 0's report; the notes list how each rank ended
    assert "failed on every rank of 3 (the same report)" in text, text
    assert "lie in rank 2's block" in text, text
    assert "first local index (0, 0, 0, 0)" in text, text
    assert text.count("elements differ") == 1, text
    assert isinstance(caught.value, CollectiveAssertionError) and caught.value.reporter == 0


def test_a_crash_on_every_rank_prints_one_traceback_per_rank_that_raised():
    with pytest.raises(AssertionError) as caught:
        simulated.run(_check(Float32Forward), 3)
    text = str(caught.value)
    assert "raised" in text, text
    assert text.count("Traceback (most recent call last)") == 1, text


def test_different_tracebacks_are_each_given_in_full_only_where_they_were_raised():
    def body(comm):
        try:
            (1 / 0) if comm.rank == 1 else [][comm.rank]
        except Exception as exc:
            message = f"raised {exc!r}\n{traceback.format_exc()}"
        try:
            assert_all_ranks(comm, False, message)
        except CollectiveAssertionError as exc:
            return str(exc), exc.reporter

    texts = simulated.run(body, 3)
    for rank, (text, reporter) in enumerate(texts):
        assert reporter == 0
        assert text.startswith("failed on every rank of 3:"), text
        assert "ranks 0, 2: raised IndexError" in text and "rank 1: raised ZeroDivisionError" in text, text
        own = 1 if rank == 1 else 0
        # each rank's text: its own traceback and rank 0's (the reporter's), once each
        assert text.count("Traceback (most recent call last)") == len({own, 0}), text
    assert "(its traceback is in rank 1's report)" in texts[0][0]


def test_blame_names_the_ranks_of_a_replicated_block_together():
    grid_shape, shape = (1, 2, 1, 1), (2, 4, 3, 3)
    dist = refconv.Distribution(grid_shape, shape, (None, "channel", None, None))
    ours, ref = numpy.zeros(shape), numpy.zeros(shape)
    ours[1, 3, 2, 0] = 5.0
    line = blame("y", ours, ref, dist, rtol=1e-9, atol=1e-9)
    assert line.startswith("the wrong elements of y lie in rank 1's block (global [:, 2:4, :, :]): 1 of its 36"), line
    assert "first local index (1, 1, 2, 0): yours 5.0, reference 0.0" in line, line
    replicated = refconv.Distribution((2, 1, 1, 1), shape, (None, None, None, None))
    assert blame("y", ours, ref, replicated, rtol=1e-9, atol=1e-9) is None       # every block: no one to blame
    split = refconv.Distribution((2, 2, 1, 1), shape, (None, "channel", None, None))
    assert "lie in the block of ranks 1, 3 (global" in blame("y", ours, ref, split, rtol=1e-9, atol=1e-9)
