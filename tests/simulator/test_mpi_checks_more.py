"""More of what simulated ranks check as MPI (issue 42, the zoo's last misses): a blocking collective never
matches a nonblocking one, Dup never matches Split, a call never touches the buffer of a pending request of
its rank, the wrappers' ops are checked, Probe and Iprobe, and a user op never freed is a leak."""

import re
import warnings

import numpy
import pytest
from mpi4py import MPI

from refconv import collectives, simulated
from refconv.checks import ArgumentError
from refconv.simulated import BufferReused, CollectiveMismatch, MessageRace, ResourceLeak, TypeMismatch


def run(fn, ranks, **kw):
    return simulated.run(fn, ranks, timeout=60, stepped=True, **kw)


# -- call matching ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("guilty", [0, 1, 2])
def test_a_blocking_allreduce_never_matches_an_iallreduce(guilty):
    def body(comm):
        x = numpy.ones(2)
        if comm.rank == guilty:
            comm.Iallreduce(MPI.IN_PLACE, x).Wait()
        else:
            comm.Allreduce(MPI.IN_PLACE, x)
        return x
    with pytest.raises(CollectiveMismatch, match=rf"rank {guilty} called Iallreduce"):
        run(body, 3)


def test_dup_never_matches_split_and_dup_with_dup_still_works():
    def mixed(comm):
        new = comm.Dup() if comm.rank == 1 else comm.Split(0, comm.rank)
        new.Free()
    with pytest.raises(CollectiveMismatch, match=r"rank 1 called Dup"):
        run(mixed, 2)

    def dups(comm):
        new = comm.Dup()
        size = new.size
        new.Free()
        return size
    assert run(dups, 3) == [3, 3, 3]


# -- buffers of pending requests ----------------------------------------------------------------------------
def test_two_pending_receives_into_one_buffer_name_the_rank_and_both_calls():
    def body(comm):
        if comm.rank == 1:
            comm.Send(numpy.ones(2), 0, tag=1)
            comm.Send(numpy.ones(2), 0, tag=2)
        else:
            y = numpy.zeros(4)
            first = comm.Irecv(y[0:2], 1, tag=1)
            second = comm.Irecv(y[1:3], 1, tag=2)      # overlaps the first by one element
            MPI.Request.Waitall([first, second])
    with pytest.raises(BufferReused) as caught:
        run(body, 2)
    text = str(caught.value)
    line = body.__code__.co_firstlineno
    assert text.startswith("rank 0: Irecv at "), text
    assert f"{__file__}:{line + 7}" in text and f"{__file__}:{line + 6}" in text, text


def test_disjoint_slices_interleaved_views_and_two_pending_sends_of_one_buffer_are_fine():
    def body(comm):
        if comm.rank == 1:
            x = numpy.arange(4.0)
            MPI.Request.Waitall([comm.Isend(x, 0, tag=1), comm.Isend(x, 0, tag=2)])   # two reads of x: allowed
            return None
        y = numpy.zeros((2, 4))
        MPI.Request.Waitall([comm.Irecv(y[0], 1, tag=1), comm.Irecv(y[1], 1, tag=2)])
        return y
    assert run(body, 2)[0].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_a_send_of_a_buffer_a_pending_receive_writes_and_a_collective_into_it_are_errors():
    def send_from_it(comm):
        y = numpy.zeros(2)
        request = comm.Irecv(y, (comm.rank + 1) % 2, tag=1)
        comm.Send(y, (comm.rank + 1) % 2, tag=1)
        request.Wait()
    with pytest.raises(BufferReused, match=r"rank 0: Send at .* reads memory that Irecv at .* writes"):
        run(send_from_it, 2)

    def reduce_into_it(comm):
        y = numpy.zeros(2)
        request = comm.Irecv(y, (comm.rank + 1) % 2, tag=1) if comm.rank == 0 else \
            comm.Isend(numpy.ones(2), 0, tag=1)
        comm.Allreduce(numpy.ones(2), y)
        request.Wait()
    with pytest.raises(BufferReused, match=r"rank 0: Allreduce at .* writes memory that Irecv"):
        run(reduce_into_it, 2)


# -- the wrappers' arguments --------------------------------------------------------------------------------
def test_an_unknown_op_of_the_wrappers_names_the_op_the_rank_and_the_allowed_ones():
    def body(comm):
        return collectives.allreduce(comm, numpy.ones(2), op="mean" if comm.rank == 1 else "sum")
    with pytest.raises(ArgumentError, match=r"allreduce on rank 1: op must be one of \('sum', 'prod', 'max', "
                                            r"'min'\), got 'mean'"):
        run(body, 2)
    assert issubclass(ArgumentError, ValueError)


# -- probe ------------------------------------------------------------------------------------------------
def test_probe_fills_the_status_and_receives_nothing_and_iprobe_says_whether():
    def body(comm):
        if comm.rank == 1:
            comm.Send(numpy.arange(3.0), 0, tag=4)
            return None
        status = MPI.Status()
        comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        seen = (status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE))
        again = MPI.Status()
        assert comm.Iprobe(1, 4, again) and again.Get_count(MPI.DOUBLE) == 3      # still there: not received
        assert not comm.Iprobe(1, 5)
        y = numpy.zeros(seen[2])
        comm.Recv(y, seen[0], seen[1])
        assert not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        return seen, y.tolist()
    assert run(body, 2)[0] == ((1, 4, 3), [0.0, 1.0, 2.0])


def test_a_wildcard_receive_after_a_probe_may_take_the_other_message():
    def body(comm, wrong):
        if comm.rank:
            comm.Send(numpy.ones(comm.rank), 0, tag=1)       # rank 2's message is longer
            return None
        status = MPI.Status()
        comm.Probe(MPI.ANY_SOURCE, 1, status)
        y = numpy.zeros(status.Get_count(MPI.DOUBLE))
        comm.Recv(y, MPI.ANY_SOURCE if wrong else status.Get_source(), 1)
        comm.Recv(numpy.zeros(3 - y.size), MPI.ANY_SOURCE, 1)
        return y.size
    with pytest.raises(TypeMismatch, match=r"larger than the receive buffer of rank 0"):
        simulated.run(body, 3, schedules="all", timeout=60, args=(True,))
    try:
        results = simulated.run(body, 3, schedules="all", timeout=60, args=(False,))
    except MessageRace as race:                    # the probe is not a choice: the same message every schedule
        pytest.fail(f"a probe followed by a receive from its source raced: {race}")
    assert results[0] in (1, 2)


def test_a_probe_no_message_answers_is_a_deadlock():
    def body(comm):
        if comm.rank == 0:
            comm.Probe(1, 9)
    with pytest.raises(simulated.Deadlock, match=r"Probe for a message from rank 1 tag 9"):
        run(body, 2)


# -- leaks ------------------------------------------------------------------------------------------------
def test_a_user_op_made_and_never_freed_is_a_leak_and_a_freed_one_is_not():
    def body(comm, free):
        op = MPI.Op.Create(lambda a, b, datatype: None, commute=True)
        assert isinstance(op, MPI.Op)
        if free or comm.rank == 0:
            op.Free()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(body, 2, args=(False,))
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceLeak)]
    assert len(leaks) == 1 and re.search(r"rank 1: op \(Op.Create\), made at .*test_mpi_checks_more.py:\d+", leaks[0])
    assert "rank 0" not in leaks[0].split("\n", 1)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceLeak)
        run(body, 2, args=(True,))
    assert MPI.Op is simulated.standins.REAL["Op"]          # mpi4py's own again once the run ended
