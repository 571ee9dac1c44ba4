"""run(fn, K, schedules="all") (refconv.simulated.schedules): every match order of the wildcard
receives, depth first, so that a message race shows on every run, not by luck of timing."""

import itertools
import re

import numpy
import pytest
from mpi4py import MPI

from refconv import simulated
from refconv.simulated import Deadlock, MessageRace, schedules


def explore(fn, ranks, **kw):
    return simulated.run(fn, ranks, schedules="all", timeout=60, **kw)


def gather_in_arrival_order(comm, seen=None):
    """Rank 0 receives one message from every other rank from ANY_SOURCE: the order is a race."""
    if comm.rank != 0:
        comm.Send(numpy.array([float(comm.rank)]), dest=0, tag=7)
        return None
    got = []
    for _ in range(comm.size - 1):
        buf = numpy.empty(1)
        comm.Recv(buf, source=MPI.ANY_SOURCE, tag=7)   # the wildcard receive
        got.append(int(buf[0]))
    if seen is not None:
        seen.append(tuple(got))
    return got


def count_of_messages(comm, seen=None):
    """The same receives, but the result (how many arrived) does not depend on their order."""
    got = gather_in_arrival_order(comm, seen)
    return None if got is None else len(got)


# -- a race is found on every run -----------------------------------------------------------------------------
def test_a_two_sender_race_is_found_on_every_run_naming_the_receive_and_both_outcomes():
    line = gather_in_arrival_order.__code__.co_firstlineno + 8        # the wildcard Recv's line
    for _ in range(3):                                                 # not by luck: every time
        with pytest.raises(MessageRace) as caught:
            explore(gather_in_arrival_order, 3)
        text = str(caught.value)
        assert re.search(rf"the match of rank 0's Recv from any rank tag 7 on communicator 'world' at "
                         rf"test_schedules.py:{line} changes the outcome \(schedules='all' explored 2 schedules "
                         rf"on 3 ranks\)", text), text
        assert "taking rank 1's message: rank 0 returned [1, 2]" in text
        assert "taking rank 2's message: rank 0 returned [2, 1]" in text
    assert isinstance(caught.value, simulated.SimulatedError)


def test_an_assert_that_fails_in_one_order_only_is_a_race_with_the_assert_as_its_cause():
    def body(comm):
        got = gather_in_arrival_order(comm)
        assert got is None or got == [1, 2], f"rank 0 assumed rank 1's message first, got {got}"

    with pytest.raises(MessageRace) as caught:
        explore(body, 3)
    text = str(caught.value)
    assert "taking rank 1's message: rank 0 returned None, rank 1 returned None, rank 2 returned None" in text
    assert "taking rank 2's message: raised AssertionError: rank 0 assumed rank 1's message first, got [2, 1]" in text
    assert isinstance(caught.value.__cause__, AssertionError)


def test_an_error_in_every_order_is_raised_as_itself():
    def body(comm):
        got = gather_in_arrival_order(comm)
        if got is not None:
            raise ValueError("rank 0 fails whatever the order")

    with pytest.raises(ValueError, match="whatever the order") as caught:
        explore(body, 3)
    assert "raised in schedule 1 of those explored" in caught.value.__notes__[-1]


def test_without_schedules_a_stepped_run_hides_the_race():
    """What schedules='all' is for: stepped, the order is the same on every run, and no error."""
    runs = [simulated.run(gather_in_arrival_order, 3, stepped=True, timeout=60)[0] for _ in range(3)]
    assert runs[0] == runs[1] == runs[2] and sorted(runs[0]) == [1, 2]


# -- counting the orders ------------------------------------------------------------------------------------------
def test_a_deterministic_program_explores_exactly_one_schedule():
    def body(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        got = numpy.empty(1)
        MPI.Request.Waitall([comm.Isend(numpy.array([float(comm.rank)]), right), comm.Irecv(got, left)])
        total = numpy.empty(1)
        MPI.COMM_WORLD.Allreduce(got, total)
        return got[0], total[0]

    results = explore(body, 4)
    assert results.schedules == 1
    assert list(results) == [(3, 6), (0, 6), (1, 6), (2, 6)]


def test_a_wildcard_receive_with_one_possible_sender_explores_one_schedule():
    def body(comm):
        if comm.rank == 1:
            comm.Send(numpy.ones(1), dest=0)
        if comm.rank == 0:
            buf = numpy.zeros(1)
            comm.Recv(buf, source=MPI.ANY_SOURCE)
            return buf[0]

    assert explore(body, 3).schedules == 1


@pytest.mark.parametrize("ranks, orders", [(2, 1), (3, 2), (4, 6)])
def test_senders_to_one_wildcard_receiver_explore_every_arrival_order_once(ranks, orders):
    seen = []
    results = explore(count_of_messages, ranks, args=(seen,))
    assert results.schedules == orders == len(seen)
    assert sorted(seen) == sorted(itertools.permutations(range(1, ranks)))   # each order once
    assert results[0] == ranks - 1


def test_any_tag_from_a_named_source_has_no_choice():
    """Messages from one rank do not overtake each other: the oldest one that matches is taken."""
    def body(comm):
        if comm.rank == 1:
            MPI.Request.Waitall([comm.Isend(numpy.array([float(t)]), dest=0, tag=t) for t in (3, 4)])
        elif comm.rank == 0:
            got = []
            for _ in range(2):
                buf = numpy.empty(1)
                comm.Recv(buf, source=1, tag=MPI.ANY_TAG)
                got.append(buf[0])
            return got

    results = explore(body, 2)
    assert results.schedules == 1 and results[0] == [3.0, 4.0]


def test_a_receive_behind_a_wildcard_takes_the_message_the_wildcard_left():
    """Rank 0: Irecv(ANY_SOURCE), then Irecv(source=1); rank 1 sends twice, rank 2 once.  Taking
    rank 2's message, the named receive takes rank 1's first; taking rank 1's first, it takes rank
    1's second and rank 2's message is never received: a deadlock, found in the first schedule."""
    def body(comm):
        if comm.rank == 0:
            a, b = numpy.zeros(1), numpy.zeros(1)
            MPI.Request.Waitall([comm.Irecv(a, source=MPI.ANY_SOURCE), comm.Irecv(b, source=1)])
            return a[0], b[0]
        sends = [numpy.array([10.0 * comm.rank + i]) for i in range(3 - comm.rank)]   # rank 1: 10, 11; rank 2: 20
        MPI.Request.Waitall([comm.Isend(s, dest=0) for s in sends])

    with pytest.raises(Deadlock, match="rank 2: waits in Isend to rank 0") as caught:
        explore(body, 3)
    assert "raised in schedule 1 of those explored, where rank 0's Irecv from any rank any tag on communicator " \
           "'world' at test_schedules.py:" in caught.value.__notes__[-1]
    assert "took rank 1's message (of ranks [1, 2])" in caught.value.__notes__[-1]


def test_a_wildcard_receive_on_a_split_communicator_is_explored():
    def body(comm, seen):
        half = comm.Split(comm.rank // 2 if comm.rank < 3 else 1, comm.rank)   # {0, 1}, {2, 3}
        if half.rank == 0:
            buf = numpy.empty(1)
            half.Recv(buf, source=MPI.ANY_SOURCE)
            seen.append((comm.rank, buf[0]))
        else:
            half.Send(numpy.array([float(comm.rank)]), dest=0)
        size = half.size
        half.Free()
        return size

    seen = []
    results = explore(body, 4, args=(seen,))
    assert results.schedules == 1 and list(results) == [2, 2, 2, 2] and sorted(seen) == [(0, 1.0), (2, 3.0)]


# -- limits --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [5, 8, 0, 2.0])
def test_more_than_four_ranks_is_a_value_error_naming_the_limit(ranks):
    with pytest.raises(ValueError, match=rf"schedules='all' explores worlds of at most 4 ranks .* must be an int in "
                                         rf"\[1, 4\], got {ranks!r}"):
        explore(count_of_messages, ranks)


def test_a_rank_polling_wildcard_receives_with_test_is_answered_in_every_order():
    """A Test that finds nothing while every other rank waits is a fence, as a Wait is."""
    def body(comm):
        if comm.rank != 0:
            comm.Send(numpy.array([float(comm.rank)]), dest=0)
            return None
        got = []
        for _ in range(comm.size - 1):
            buf = numpy.empty(1)
            request = comm.Irecv(buf, source=MPI.ANY_SOURCE)
            while not request.Test():
                pass
            got.append(int(buf[0]))
        return sorted(got)

    results = explore(body, 3)
    assert results.schedules == 2 and results[0] == [1, 2]


def test_an_unknown_schedules_value_is_named():
    with pytest.raises(ValueError, match=r"schedules must be None or 'all', got 'some'"):
        simulated.run(count_of_messages, 2, schedules="some")


def test_the_exploration_is_bounded_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(schedules, "MAX_SCHEDULES", 4)
    with pytest.raises(RuntimeError, match=r"schedules='all' explored 4 schedules .*MAX_SCHEDULES.*, all with the "
                                           r"same outcome, and more remain"):
        explore(count_of_messages, 4)                                  # 6 orders


@pytest.mark.parametrize("a, b, equal", [
    (numpy.array([1.0, numpy.nan]), numpy.array([1.0, numpy.nan]), True),
    (numpy.array([1.0, 2.0]), numpy.array([2.0, 1.0]), False),
    (numpy.zeros(2, numpy.float32), numpy.zeros(2), False),
    ([numpy.ones(2), {"a": 1}], [numpy.ones(2), {"a": 1}], True),
    ([numpy.ones(2), {"a": 1}], [numpy.ones(2), {"a": 2}], False),
    ((1, 2), [1, 2], False),
    (float("nan"), float("nan"), True),
])
def test_results_compare_numpy_aware(a, b, equal):
    assert schedules.same(a, b) is equal
