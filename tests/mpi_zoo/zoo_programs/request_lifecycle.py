"""Request Lifecycle: a request that the guilty rank never completes (no successful Wait or Test, no
Free) before its end: an Isend or an Irecv, a nonblocking collective (Iallreduce, Iallgather, Ibarrier,
and refconv.collectives' iallreduce_, iallgather, ireduce_scatter, iexchange), a Waitall that leaves one
out, a Test whose False is ignored; a persistent request waited without its Start.  MPI_Finalize with a
request pending is erroneous, and the data of an uncompleted receive is undefined (MUST: "request not
completed" at the end, with the call that made it).  The twin completes every request."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, one_message, pair, ring, waitall
from zoo_registry import expect, pattern


@pattern("Request Lifecycle", ranks=(2, 4), via="raw",
         variants={"Isend": {"guilty_sends": True}, "Irecv": {"guilty_sends": False}})
def p2p_never_waited(comm, z, guilty_sends):
    """The guilty rank's Isend or Irecv is never waited; its partner's blocking Recv or Send completes."""
    sent, y = full(2, 4.0), full(2, 0.0)

    def nonblocking(start):
        request = start()
        if not z.wrong:
            request.Wait()

    def send(peer):
        nonblocking(lambda: comm.Isend(sent, peer, tag=1)) if guilty_sends else comm.Send(sent, peer, tag=1)

    def receive(peer):
        comm.Recv(y, peer, tag=1) if guilty_sends else nonblocking(lambda: comm.Irecv(y, peer, tag=1))
        expect(z.wrong or (y == 4.0).all(), f"rank {comm.rank}: received {y}, sent 4.0")
    one_message(comm, z, send, receive, from_guilty=guilty_sends)
    return y


RAW_COLLECTIVES = {
    "Iallreduce": {"start": lambda comm, x: comm.Iallreduce(MPI.IN_PLACE, x)},
    "Iallgather": {"start": lambda comm, x: comm.Iallgather(x, full(2 * comm.size, 0.0))},
    "Ibarrier": {"start": lambda comm, x: comm.Ibarrier()},
}


@pattern("Request Lifecycle", ranks=(2, 4), via="raw", variants=RAW_COLLECTIVES)
def collective_never_waited(comm, z, start):
    x = full(2, 1.0)
    request = start(comm, x)
    if not z.mine(comm):
        request.Wait()
    return x


WRAPPERS = {
    "iallreduce_": {"start": lambda comm, x: collectives.iallreduce_(comm, x)},
    "iallgather": {"start": lambda comm, x: collectives.iallgather(comm, x, [2] * comm.size)},
    "ireduce_scatter": {"start": lambda comm, x: collectives.ireduce_scatter(comm, full(2 * comm.size, 1.0),
                                                                             [2] * comm.size)},
    "iexchange": {"start": lambda comm, x: collectives.iexchange(comm, {ring(comm)[0]: x}, {ring(comm)[1]: (2,)},
                                                                 x.dtype)},
}


@pattern("Request Lifecycle", ranks=(2, 4), via="collectives", variants=WRAPPERS)
def wrapper_never_waited(comm, z, start):
    request = start(comm, full(2, float(comm.rank)))
    return None if z.mine(comm) else request.wait()


@pattern("Request Lifecycle", ranks=(2, 4), via="raw")
def waitall_leaves_one_out(comm, z):
    right, left = ring(comm)
    x, y1, y2 = full(2, float(comm.rank)), full(2, -1.0), full(2, -1.0)
    requests = [comm.Irecv(y1, left, tag=1), comm.Irecv(y2, left, tag=2),
                comm.Isend(x, right, tag=1), comm.Isend(x, right, tag=2)]
    waitall([r for k, r in enumerate(requests) if not (z.mine(comm) and k == 1)])
    return y1


@pattern("Request Lifecycle", ranks=(2, 3), via="raw")
def test_false_ignored(comm, z):
    guilty, other, role = pair(comm, z)
    y = full(2, 0.0)
    if role == "guilty":
        request = comm.Irecv(y, other, tag=1)
        request.Test()                  # False: the partner sends only after the Barrier
    comm.Barrier()
    if role == "partner":
        comm.Send(full(2, 6.0), guilty, tag=1)
    elif not z.wrong and role == "guilty":
        request.Wait()
    return y


@pattern("Request Lifecycle", ranks=(2, 4), via="raw", feature="persistent",
         variants={"Send_init not waited": {"start": True, "wait": False},
                   "Recv_init waited without Start": {"start": False, "wait": True}})
def persistent_request(comm, z, start, wait):
    guilty, other, role = pair(comm, z)
    y = full(2, 0.0)
    if role == "guilty":
        request = comm.Recv_init(y, other, tag=1) if not start else comm.Send_init(full(2, 2.0), other, tag=1)
        if start or not z.wrong:
            request.Start()
        if wait or not z.wrong:
            request.Wait()
        if wait or not z.wrong:          # the started send neither waited nor freed: still pending at the end
            request.Free()
    elif role == "partner":
        comm.Send(full(2, 2.0), guilty, tag=1) if not start else comm.Recv(y, guilty, tag=1)
    return y
