"""Local Concurrency: the guilty rank touches a buffer that a call of its own still uses: it writes a send
buffer, or reads or writes a receive buffer, between the nonblocking call and its completion (Isend,
Irecv, Iallreduce; refconv.collectives' iallreduce_, iallgather, ireduce_scatter, iexchange, whose x
"must stay untouched until wait()"); it hands one buffer to two calls in flight; it reads the target of
an RMA Get before the epoch ends.  MPI leaves the outcome undefined (MUST and ITAC report the
conflicting access).  The twin touches the buffer only after completion; where it changes a completed
buffer and then waits for the request again (a null request), that is correct too."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import fence_epoch, full, one_message, pair, ring, waitall
from zoo_registry import expect, pattern


@pattern("Local Concurrency", ranks=(2, 4), via="raw")
def isend_buffer_written_before_wait(comm, z):
    x = full(2, 3.0)

    def send(peer):
        request = comm.Isend(x, peer, tag=1)
        if z.wrong:
            x[0] = -1.0
        request.Wait()
        x[1] = -1.0                 # after the Wait: the buffer is the program's again
        waitall([request])          # a request already completed: nothing to wait for

    def receive(peer):
        comm.Recv(x, peer, tag=1)
        expect((x == 3.0).all(), f"rank {comm.rank}: received {x}, sent 3.0")
    one_message(comm, z, send, receive)
    return x


@pattern("Local Concurrency", ranks=(2, 4), via="raw",
         variants={"read": {"touch": lambda y: y.copy()}, "written": {"touch": lambda y: y.fill(9.0)}})
def irecv_buffer_touched_before_wait(comm, z, touch):
    y = full(2, 0.0)
    seen = []                       # what the guilty rank saw in y: before the Wait, or (the twin) after it

    def receive(peer):
        request = comm.Irecv(y, peer, tag=1)
        if z.wrong:
            seen.append(touch(y))
        request.Wait()
        if not z.wrong:
            seen.append(touch(y))
    one_message(comm, z, lambda peer: comm.Send(full(2, 5.0), peer, tag=1), receive, from_guilty=False)
    return seen[0] if seen and seen[0] is not None else y


@pattern("Local Concurrency", ranks=(2, 3), via="raw",
         variants={"send buffer written": {"send": True}, "receive buffer read": {"send": False}})
def iallreduce_buffer_touched_before_wait(comm, z, send):
    x, y = full(2, 1.0), full(2, 0.0)
    request = comm.Iallreduce(x, y)
    seen = None
    if z.mine(comm):
        if send:
            x[:] = 7.0
        else:
            seen = y.copy()
    request.Wait()
    return seen if seen is not None else y


WRAPPERS = {
    "iallreduce_": {"start": lambda comm, x: collectives.iallreduce_(comm, x)},
    "iallgather": {"start": lambda comm, x: collectives.iallgather(comm, x, [x.size] * comm.size)},
    "ireduce_scatter": {"start": lambda comm, x: collectives.ireduce_scatter(comm, x, [x.size // comm.size] * comm.size)},
    "iexchange": {"start": lambda comm, x: collectives.iexchange(comm, {ring(comm)[0]: x}, {ring(comm)[1]: x.shape},
                                                                 x.dtype)},
}


@pattern("Local Concurrency", ranks=(2, 4), via="collectives", variants=WRAPPERS)
def wrapper_buffer_written_before_wait(comm, z, start):
    x = full(2 * comm.size, float(comm.rank + 1))
    request = start(comm, x)
    if z.mine(comm):
        x[:] = -1.0
    result = request.wait()
    x[:] = 0.0                      # after the wait: x is the program's again
    return result


@pattern("Local Concurrency", ranks=(2, 4), via="raw")
def isend_and_irecv_share_a_buffer(comm, z):
    right, left = ring(comm)
    x = full(2, float(comm.rank))
    y = x if z.mine(comm) else full(2, -1.0)
    waitall([comm.Isend(x, right, tag=1), comm.Irecv(y, left, tag=1)])
    return y


@pattern("Local Concurrency", ranks=(2, 3), via="raw")
def two_irecvs_into_one_buffer(comm, z):
    guilty, other, role = pair(comm, z)
    if role == "partner":
        waitall([comm.Isend(full(2, 1.0), guilty, tag=1), comm.Isend(full(2, 2.0), guilty, tag=2)])
    elif role == "guilty":
        y1 = full(2, 0.0)
        y2 = y1 if z.wrong else full(2, 0.0)
        waitall([comm.Irecv(y1, other, tag=1), comm.Irecv(y2, other, tag=2)])
        return y1 + y2


@pattern("Local Concurrency", ranks=(2, 4), via="raw", feature="RMA")
def rma_get_read_before_fence(comm, z):
    got, seen = full(2, -1.0), []

    def access(window, memory):
        if comm.rank == z.guilty:
            window.Get(got, (comm.rank + 1) % comm.size, target=(0, 2, MPI.DOUBLE))
            if z.wrong:
                seen.append(got.copy())   # before the closing Fence: the Get may not have landed
    fence_epoch(comm, access)
    return seen[0] if seen else got