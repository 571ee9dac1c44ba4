"""Message Race: the guilty rank receives with MPI.ANY_SOURCE (or ANY_TAG) and its outcome depends on
which of two senders' messages matches first, an order MPI does not define: it assumes an order, it
follows a wildcard with a receive from a named rank (a deadlock in one order), its floating-point sum
depends on the order, or a Probe and the Recv after it match different messages.  Tools find these by
exploring the match orders (ISP, MUST's DPOR mode; refconv: ``run(..., schedules="all")``, up to 4
ranks).  The twin names its sources, or reads the sender from the Status, or takes messages of one
sender, which MPI keeps in order.  Worlds of 3 and 4 ranks: the guilty rank and the two after it."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, trio, waitall
from zoo_registry import expect, pattern

RECEIVES = {"Recv": {"nonblocking": False}, "Irecv": {"nonblocking": True}}


def _two_from(comm, sources, nonblocking, tag=1):
    """Two messages of 2 elements from ``sources`` (ranks or ANY_SOURCE), in the order they match."""
    ys = [full(2, -1.0), full(2, -1.0)]
    if nonblocking:
        waitall([comm.Irecv(y, s, tag=tag) for y, s in zip(ys, sources)])
    else:
        for y, s in zip(ys, sources):
            comm.Recv(y, s, tag=tag)
    return ys


@pattern("Message Race", ranks=(3, 4), via="raw", races=True, variants=RECEIVES)
def any_source_order_assumed(comm, z, nonblocking):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(2, float(comm.rank)), guilty, tag=1)
    elif comm.rank == guilty:
        sources = [MPI.ANY_SOURCE] * 2 if z.wrong else [a, b]
        first, second = _two_from(comm, sources, nonblocking)
        expect(first[0] == a and second[0] == b, f"rank {comm.rank}: got {first[0]} then {second[0]}, "
                                                 f"assumed {a} then {b}")
        return first - second


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def any_source_then_a_named_source(comm, z):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(2, float(comm.rank)), guilty, tag=1)
    elif comm.rank == guilty:
        status = MPI.Status()
        first = full(2, -1.0)
        comm.Recv(first, MPI.ANY_SOURCE, tag=1, status=status)
        then = a if z.wrong else (b if status.Get_source() == a else a)   # a, whoever came first: a deadlock if a did
        second = full(2, -1.0)
        comm.Recv(second, then, tag=1)
        return sorted([first[0], second[0]])


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def any_tag_assumed(comm, z):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(2, float(comm.rank)), guilty, tag=1 if comm.rank == a else 2)
    elif comm.rank == guilty:
        first, second = full(2, -1.0), full(2, -1.0)
        comm.Recv(first, MPI.ANY_SOURCE, tag=MPI.ANY_TAG if z.wrong else 1)
        comm.Recv(second, MPI.ANY_SOURCE, tag=MPI.ANY_TAG if z.wrong else 2)
        expect(first[0] == a, f"rank {comm.rank}: the tag-1 message is rank {a}'s, got rank {first[0]:g}'s")
        return first


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def any_tag_from_two_senders(comm, z):
    guilty, a, b = trio(comm, z)
    sender = b if z.wrong else a               # the twin: both messages from a, which MPI keeps in order
    if comm.rank == a:
        comm.Send(full(2, 1.0), guilty, tag=1)
    if comm.rank == sender:
        comm.Send(full(2, 2.0), guilty, tag=2)
    if comm.rank == guilty:
        first, second = _two_from(comm, [MPI.ANY_SOURCE] * 2, False, tag=MPI.ANY_TAG)
        expect(first[0] == 1.0, f"rank {comm.rank}: the first message carries 1.0, got {first[0]}")
        return first


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def wildcard_across_a_barrier(comm, z):
    guilty, a, b = trio(comm, z)
    early = None
    if comm.rank == a:
        early = comm.Isend(full(2, 1.0), guilty, tag=1)        # posted before the Barrier
    if comm.rank == guilty:
        first = full(2, -1.0)
        early = comm.Irecv(first, MPI.ANY_SOURCE if z.wrong else a, tag=1)
    comm.Barrier()
    if comm.rank == b:
        comm.Send(full(2, 2.0), guilty, tag=1)                 # posted after it, yet it may match first
    if comm.rank == guilty:
        second = full(2, -1.0)
        comm.Recv(second, MPI.ANY_SOURCE if z.wrong else b, tag=1)
    if early is not None:
        early.Wait()
    if comm.rank == guilty:
        expect(first[0] == 1.0, f"rank {comm.rank}: the early message carries 1.0, got {first[0]}")
        return first


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def sum_in_arrival_order(comm, z):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(1, 1e16 if comm.rank == a else 1.0), guilty, tag=1)
    elif comm.rank == guilty:
        total = full(1, -1e16)
        for source in ([MPI.ANY_SOURCE] * 2 if z.wrong else [a, b]):
            y = full(1, 0.0)
            comm.Recv(y, source, tag=1)
            total += y                          # (-1e16 + 1e16) + 1 = 1, but (-1e16 + 1) + 1e16 = 0
        expect(total[0] == 1.0, f"rank {comm.rank}: the sum in rank order is 1.0, got {total[0]}")
        return total


@pattern("Message Race", ranks=(3, 4), via="collectives", races=True)
def wildcard_result_allreduced(comm, z):
    guilty, a, b = trio(comm, z)
    mine = full(2, 0.0)
    if comm.rank in (a, b):
        comm.Send(full(2, float(comm.rank)), guilty, tag=1)
    elif comm.rank == guilty:
        first, second = _two_from(comm, [MPI.ANY_SOURCE] * 2 if z.wrong else [a, b], True)
        mine = first - 2 * second               # depends on which came first
    return collectives.allreduce(comm, mine)


@pattern("Message Race", ranks=(3, 4), via="raw", races=True)
def probe_then_any_source(comm, z):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(1 + (comm.rank == b), 1.0), guilty, tag=1)   # b's message is longer
    elif comm.rank == guilty:
        status = MPI.Status()
        comm.Probe(MPI.ANY_SOURCE, tag=1, status=status)
        y = full(status.Get_count(MPI.DOUBLE), 0.0)
        comm.Recv(y, MPI.ANY_SOURCE if z.wrong else status.Get_source(), tag=1)   # may match the other message
        other = full(3 - y.size, 0.0)
        comm.Recv(other, MPI.ANY_SOURCE, tag=1)
        return y
