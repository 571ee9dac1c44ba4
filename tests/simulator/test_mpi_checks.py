"""What the simulated ranks check as MUST would (issue 42): requests left pending, receive buffers read
before their Wait, counts, datatypes and type signatures, MPI's special values, and readable names."""

import re

import numpy
import pytest
from mpi4py import MPI

import refconv
from refconv import collectives, simulated
from refconv.simulated import (BufferReused, CollectiveMismatch, InvalidParameter, PendingRequests, TypeMismatch,
                               poisoned)
from refconv.testing.asserts import CollectiveAssertionError
from refconv.testing.check import check_layer
from refconv.testing.strategies import ConvProblem


def run(fn, ranks, **kw):
    return simulated.run(fn, ranks, timeout=60, **kw)


# -- request lifecycle ----------------------------------------------------------------------------------
def test_a_request_never_waited_is_named_with_its_call_and_line():
    def body(comm):
        x = numpy.ones(3)
        collectives.iallreduce_(comm, x)                     # started and forgotten
        if comm.rank == 1:
            comm.Isend(numpy.ones(1), 0, tag=5)              # never completed either
        else:
            comm.Irecv(numpy.zeros(1), 1, tag=5).Wait()
    with pytest.raises(PendingRequests) as caught:
        run(body, 2, stepped=True)
    text = str(caught.value)
    line = body.__code__.co_firstlineno
    assert re.search(rf"rank 0: its function returned with 1 request never completed", text), text
    assert f"started by Iallreduce at {__file__}:{line + 2}" in text, text      # the user's line, not refconv's
    rank1 = [n for n in caught.value.__notes__ if "rank 1" in n]
    assert rank1 and "raised PendingRequests" in rank1[0]


def test_a_waitall_that_leaves_one_out_is_reported():
    def body(comm):
        peer = 1 - comm.rank
        got = [numpy.zeros(1), numpy.zeros(1)]
        recvs = [comm.Irecv(got[i], peer, tag=i) for i in range(2)]
        sends = [comm.Isend(numpy.full(1, float(i)), peer, tag=i) for i in range(2)]
        simulated.comm.Request.Waitall(recvs + sends[:1])
    with pytest.raises(PendingRequests, match=r"Isend to rank 1 tag 1 on communicator 'world': started by Isend at "):
        run(body, 2, stepped=True)


def test_a_buffer_changed_after_its_wait_is_not_buffer_reused_by_a_later_waitall():
    def body(comm):
        x = numpy.full(2, comm.rank + 1.0)
        request = comm.Iallreduce(MPI.IN_PLACE, x)
        request.Wait()
        total = x.copy()
        x[...] = -1.0                                        # the buffer is the rank's again
        simulated.comm.Request.Waitall([request])            # a final Waitall over the completed request
        return total
    assert [t.tolist() for t in run(body, 2)] == [[3.0, 3.0]] * 2


# -- poison -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, poison", [("float64", "nan"), ("int32", str(numpy.iinfo(numpy.int32).min)),
                                           ("uint8", "255")])
def test_a_receive_buffer_read_before_its_wait_holds_poison(dtype, poison):
    def body(comm):
        peer = 1 - comm.rank
        got = numpy.zeros(4, dtype)
        request = comm.Irecv(got, peer, 0)
        comm.Send(numpy.full(4, 7, dtype), peer, 0) if comm.rank == 0 else None
        early = got.copy()                                   # read before the Wait: poison, on every schedule
        if comm.rank == 1:
            comm.Send(numpy.full(4, 7, dtype), peer, 0)
        request.Wait()
        return early, got
    results = run(body, 2)
    assert [g.tolist() for _, g in results] == [[7] * 4] * 2
    text = poisoned(results)
    assert "a receive buffer read before its Wait" in text and "rank 0's result[0]: 4 of 4" in text, text
    assert poison in text
    assert poisoned([g for _, g in results]) == ""


def test_an_iallreduce_buffer_read_before_its_wait_is_poison_and_right_after():
    def body(comm):
        x = numpy.full(3, comm.rank + 1.0)
        request = collectives.iallreduce_(comm, x)
        early = float(x.sum())                               # a learner's mistake: the sum before the wait
        return early, request.wait()
    results = run(body, 3)
    assert all(numpy.isnan(early) and total.tolist() == [6.0] * 3 for early, total in results)
    assert "rank 2's result[0]" in poisoned(results)


def test_a_short_message_leaves_the_rest_of_the_receive_buffer_as_it_was():
    def body(comm):
        got = numpy.arange(4.0)
        if comm.rank == 0:
            comm.Send(numpy.full(2, 9.0), 1, 0)
            return None
        status = MPI.Status()
        request = comm.Irecv(got, 0, 0)
        request.Wait(status)
        return got.tolist(), status.Get_count(MPI.DOUBLE)
    assert run(body, 2)[1] == ([9.0, 9.0, 2.0, 3.0], 2)


class ReadsTheGradientBeforeItsWait(refconv.DistConv2d):
    """Stationary-X whose forward starts an allreduce of a copy of y_loc and adds it in before the wait."""

    def forward(self, x_loc):
        y_loc = super().forward(x_loc)
        partial = numpy.array(y_loc, copy=True)
        request = collectives.iallreduce_(self.grid.comm, partial)
        y_loc = y_loc + 0.0 * partial                       # reads partial before request.wait()
        request.wait()
        return y_loc


def test_check_layer_names_poison_as_a_receive_buffer_read_before_its_wait():
    problem = ConvProblem(N=2, C=4, F=4, H=5, W=4, Kh=3, Kw=3, padding=(1, 1))

    def body(comm):
        grid = refconv.ProcessGrid(comm, channel=comm.size)
        layer = ReadsTheGradientBeforeItsWait(4, 4, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64,
                                              algorithm="stationary-x")
        try:
            return check_layer(layer, problem)
        finally:
            grid.free()
    with pytest.raises(CollectiveAssertionError, match="a receive buffer read before its Wait"):
        run(body, 2)


# -- counts, datatypes and type signatures ------------------------------------------------------------------------
def test_counts_and_datatypes_are_honoured():
    def body(comm):
        x = numpy.arange(6.0) if comm.rank == 0 else numpy.zeros(6)
        raw = numpy.arange(8, dtype=numpy.uint8) if comm.rank == 0 else numpy.zeros(8, numpy.uint8)
        if comm.rank == 0:
            comm.Send([x, 2, MPI.DOUBLE], 1, 0)              # the first 2 doubles
            comm.Send([raw, 3, MPI.BYTE], 1, 1)              # the first 3 bytes
            comm.Send([x, MPI.DOUBLE], 1, 2)                 # all 6
        else:
            status = MPI.Status()
            comm.Recv([x, MPI.DOUBLE], 0, 0, status)
            first = x.tolist(), status.Get_count(MPI.DOUBLE)
            comm.Recv([raw, 8, MPI.BYTE], 0, 1, status)
            second = raw.tolist(), status.Get_count(MPI.BYTE)
            comm.Recv([x, 6, MPI.DOUBLE], 0, 2)
            return first, second, x.tolist()
    _, got = run(body, 2)
    assert got == (([0.0, 1.0, 0, 0, 0, 0], 2), ([0, 1, 2, 0, 0, 0, 0, 0], 3), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])


def test_a_type_signature_mismatch_names_both_ranks():
    def body(comm):
        if comm.rank == 2:
            comm.Send(numpy.ones(2, numpy.float64), 0, 0)
        elif comm.rank == 0:
            comm.Recv(numpy.zeros(4, numpy.int32), 2, 0)
    with pytest.raises(TypeMismatch, match=r"rank 2 sends 2 x MPI_DOUBLE .* but rank 0 receives MPI_INT"):
        run(body, 3)


def test_a_message_longer_than_its_receive_is_a_truncation_naming_both_ranks():
    def body(comm):
        if comm.rank == 0:
            comm.Send([numpy.ones(4), 3, MPI.DOUBLE], 1, 0)
        else:
            comm.Recv([numpy.zeros(4), 2, MPI.DOUBLE], 0, 0)
    with pytest.raises(TypeMismatch, match=r"message of rank 0 .* larger than the receive buffer of rank 1"):
        run(body, 2)


def test_collective_type_and_count_mismatches_name_the_ranks():
    def scatter(comm):
        recv = numpy.zeros(2, numpy.int64 if comm.rank == 1 else numpy.float64)
        send = [numpy.zeros(4), ([2, 2], [0, 2])] if comm.rank == 0 else None
        comm.Scatterv(send, recv, root=0)
    with pytest.raises(TypeMismatch, match=r"rank 0 sends 2 x MPI_DOUBLE .* to rank 1, which receives 2 x MPI_LONG"):
        run(scatter, 2)

    def alltoallv(comm):
        counts = [2, 2] if comm.rank == 0 else [2, 1]
        comm.Alltoallv([numpy.zeros(4), (counts, [0, 2])], [numpy.zeros(4), ([2, 2], [0, 2])])
    with pytest.raises(TypeMismatch, match=r"rank 1 sends 1 x MPI_DOUBLE \(float64\) \(8 bytes\) to rank 1, which receives "):
        run(alltoallv, 2)


def test_ops_and_datatypes_are_named_in_a_mismatch():
    def body(comm):
        comm.Allreduce(MPI.IN_PLACE, numpy.ones(2), op=MPI.SUM if comm.rank == 0 else MPI.MAX)
    with pytest.raises(CollectiveMismatch) as caught:
        run(body, 2)
    text = str(caught.value)
    assert "rank 0 called Allreduce ('2 x MPI_DOUBLE (float64)', 'SUM')" in text, text
    assert "'MAX'" in text and "object at 0x" not in text


# -- MPI's special values ----------------------------------------------------------------------------------------------
def test_proc_null_peers_complete_at_once_and_leave_the_buffer_alone():
    """A non-periodic halo exchange as MPI codes write it: the boundary ranks talk to PROC_NULL."""
    def body(comm):
        left = comm.rank - 1 if comm.rank > 0 else MPI.PROC_NULL
        right = comm.rank + 1 if comm.rank < comm.size - 1 else MPI.PROC_NULL
        from_left, from_right = numpy.full(1, -5.0), numpy.full(1, -5.0)
        requests = [comm.Irecv(from_left, left, 0), comm.Irecv(from_right, right, 0),
                    comm.Isend(numpy.full(1, float(comm.rank)), left, 0),
                    comm.Isend(numpy.full(1, float(comm.rank)), right, 0)]
        statuses = []
        simulated.comm.Request.Waitall(requests, statuses)
        return from_left[0], from_right[0], statuses[0].Get_source(), statuses[0].Get_count()
    got = run(body, 3, stepped=True)
    assert got[0] == (-5.0, 1.0, MPI.PROC_NULL, 0)
    assert got[1][:3] == (0.0, 2.0, 0) and got[2][:2] == (1.0, -5.0)


def test_any_source_and_any_tag_fill_the_status():
    def body(comm):
        if comm.rank == 0:
            seen = []
            for _ in range(comm.size - 1):
                got, status = numpy.zeros(3), MPI.Status()
                comm.Recv(got, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                seen.append((status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE), got[0]))
            return sorted(seen)
        comm.Send(numpy.full(comm.rank, float(comm.rank)), 0, tag=10 + comm.rank)
    assert run(body, 3)[0] == [(1, 11, 1, 1.0), (2, 12, 2, 2.0)]


def test_undefined_colour_gives_comm_null_and_tag_ub_is_an_attribute():
    def body(comm):
        sub = comm.Split(MPI.UNDEFINED if comm.rank == 1 else 0, key=comm.rank)
        size = None if sub == MPI.COMM_NULL else sub.Get_size()
        if sub != MPI.COMM_NULL:
            sub.Free()
        return sub == MPI.COMM_NULL, size, comm.Get_attr(MPI.TAG_UB)
    got = run(body, 3)
    assert [g[:2] for g in got] == [(False, 2), (True, None), (False, 2)]
    assert got[0][2] >= 32767


def test_a_tag_above_tag_ub_is_named():
    def body(comm):
        comm.Isend(numpy.ones(1), 1 - comm.rank, tag=comm.Get_attr(MPI.TAG_UB) + 1)
    with pytest.raises(InvalidParameter, match=r"Isend on rank 0 of 'world': tag must be in \[0, \d+\] \(MPI.TAG_UB\)"):
        run(body, 2)


def test_a_raw_bcast_to_a_root_past_the_end_or_negative_is_named():
    for root in (4, -1):
        with pytest.raises(InvalidParameter, match=rf"Bcast on rank 0 of 'world': root must be a rank in \[0, 4\) "
                                                   rf"of 'world', got {root}"):
            run(lambda comm: comm.Bcast(numpy.ones(2), root=root), 4)
    with pytest.raises(InvalidParameter, match=r"bcast on rank 0 of 'world': root must be"):
        run(lambda comm: collectives.bcast_object(comm, 1, root=-1), 2)


def test_buffer_reused_still_caught_for_a_write_before_the_wait():
    def body(comm):
        got = numpy.zeros(2)
        request = comm.Irecv(got, 1 - comm.rank, 0)
        comm.Send(numpy.ones(2), 1 - comm.rank, 0) if comm.rank == 0 else None
        if comm.rank == 1:
            got[0] = 3.0                                     # a write before the Wait
            comm.Send(numpy.ones(2), 0, 0)
        request.Wait()
    with pytest.raises(BufferReused, match="rank 1: the receive buffer"):
        run(body, 2)


def test_waitany_completes_one_request_at_a_time_with_its_status():
    def body(comm):
        if comm.rank == 0:
            got = [numpy.zeros(1) for _ in range(comm.size - 1)]
            requests = [comm.Irecv(got[i], i + 1, tag=3) for i in range(comm.size - 1)]
            order = []
            for _ in requests:
                status = MPI.Status()
                index = simulated.comm.Request.Waitany(requests, status)
                order.append((index, status.Get_source(), got[index][0]))
            after = simulated.comm.Request.Waitany(requests)              # none active: UNDEFINED
            return sorted(order), after, simulated.comm.Request.Testany(requests)
        comm.Send(numpy.full(1, 10.0 * comm.rank), 0, tag=3)
    order, after, tested = run(body, 3, stepped=True)[0]
    assert order == [(0, 1, 10.0), (1, 2, 20.0)]
    assert after == MPI.UNDEFINED and tested == (MPI.UNDEFINED, True)


def test_reduce_gather_scatter_alltoall_and_the_nonblocking_barrier_and_bcast():
    def body(comm):
        n, x = comm.size, numpy.full(2, comm.rank + 1.0)
        out = numpy.zeros(2) if comm.rank == 1 else None
        comm.Reduce(x, out, op=MPI.MAX, root=1)
        gathered = numpy.zeros(2 * n) if comm.rank == 0 else None
        comm.Gather(x, gathered, root=0)
        part = numpy.zeros(2)
        comm.Scatter(numpy.arange(2.0 * n) if comm.rank == 0 else None, part, root=0)
        swapped = numpy.zeros(n)
        comm.Alltoall(numpy.arange(n, dtype=float) + 10 * comm.rank, swapped)
        b = numpy.full(3, float(comm.rank))
        request = comm.Ibcast(b, root=2)
        early = b.copy()                                     # poison on the ranks that receive
        comm.Ibarrier().Wait()
        request.Wait()
        return out, gathered, part.tolist(), swapped.tolist(), early, b.tolist()
    results = run(body, 3)
    assert results[1][0].tolist() == [3.0, 3.0] and results[0][1].tolist() == [1, 1, 2, 2, 3, 3]
    assert [r[2] for r in results] == [[0, 1], [2, 3], [4, 5]]
    assert [r[3] for r in results] == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert all(r[5] == [2.0] * 3 for r in results)
    text = poisoned([r[4] for r in results])
    assert "rank 0's result" in text and "rank 1's result" in text and "rank 2's result" not in text
