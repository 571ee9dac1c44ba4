"""Global Concurrency: two ranks' accesses to one memory location, at least one a write, that MPI leaves
unordered.  In MBI this class is one-sided communication (RMA): a Put and a Put, Get or Accumulate of
another op to one target location in one epoch, or the target's own store during the epoch, or two Puts
under shared locks (MPI-3.1 §11.7: "erroneous").  RMA may be refused by name (issue 42), so these run
only where the simulated world offers MPI.Win.  The message-passing kind is here too: two messages,
from two ranks, or a message and a collective's result, written into one receive buffer (or overlapping
slices of it) while both are in flight; MPI does not say which write lands last (MBI would file it under
Local Concurrency, as the buffer is the receiver's: the zoo files it here for the two remote writers).
The twin uses another location, an ordered epoch, or a second buffer."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import fence_epoch, full, pair, trio, waitall
from zoo_registry import pattern


@pattern("Global Concurrency", ranks=(3, 4), via="raw", feature="RMA",
         variants={"Put and Put": {"access": "Put"}, "Put and Get": {"access": "Get"},
                   "Put and Accumulate": {"access": "Accumulate"}})
def rma_conflict_in_a_fence_epoch(comm, z, access):
    guilty, a, b = trio(comm, z)

    def conflict(window, memory):
        if comm.rank == a:                   # a accumulates into b[0], or puts there
            if access == "Accumulate":
                window.Accumulate(full(1, 1.0), b, target=(0, 1, MPI.DOUBLE), op=MPI.SUM)
            else:
                window.Put(full(1, 1.0), b, target=(0, 1, MPI.DOUBLE))
        if comm.rank == guilty:
            where, origin = (0 if z.wrong or access == "Accumulate" else 1), full(1, 2.0)
            if access == "Get":
                window.Get(origin, b, target=(where, 1, MPI.DOUBLE))
            elif access == "Accumulate" and not z.wrong:
                window.Accumulate(origin, b, target=(0, 1, MPI.DOUBLE), op=MPI.SUM)   # one op: allowed
            else:
                window.Put(origin, b, target=(where, 1, MPI.DOUBLE))
    return fence_epoch(comm, conflict)


@pattern("Global Concurrency", ranks=(2, 4), via="raw", feature="RMA")
def rma_target_stores_during_the_epoch(comm, z):
    def store(window, memory):
        if comm.rank == (z.guilty + 1) % comm.size:
            window.Put(full(1, 3.0), z.guilty, target=(0, 1, MPI.DOUBLE))
        if comm.rank == z.guilty:
            memory[0 if z.wrong else 2] = 4.0    # its own store, while the partner's Put may land
    return fence_epoch(comm, store)


@pattern("Global Concurrency", ranks=(3, 4), via="raw", feature="RMA")
def rma_puts_under_shared_locks(comm, z):
    guilty, a, b = trio(comm, z)
    memory = full(4, 0.0)
    window = MPI.Win.Create(memory, disp_unit=memory.itemsize, comm=comm)
    if comm.rank in (guilty, a):
        window.Lock(b, MPI.LOCK_SHARED if z.wrong else MPI.LOCK_EXCLUSIVE)
        window.Put(full(1, float(comm.rank)), b, target=(0, 1, MPI.DOUBLE))
        window.Unlock(b)
    comm.Barrier()
    window.Free()
    return memory


@pattern("Global Concurrency", ranks=(3, 4), via="raw",
         variants={"one buffer": {"second": lambda y: y[0:2]}, "overlapping slices": {"second": lambda y: y[1:3]}})
def two_senders_one_receive_buffer(comm, z, second):
    guilty, a, b = trio(comm, z)
    if comm.rank in (a, b):
        comm.Send(full(2, float(comm.rank)), guilty, tag=1)
    elif comm.rank == guilty:
        y = full(4, -1.0)
        into = second(y) if z.wrong else y[2:4]
        waitall([comm.Irecv(y[0:2], a, tag=1), comm.Irecv(into, b, tag=1)])
        return y


@pattern("Global Concurrency", ranks=(2, 4), via="raw",
         variants={"Iallreduce": {"blocking": False}, "Allreduce": {"blocking": True}})
def message_and_collective_into_one_buffer(comm, z, blocking):
    guilty, other, role = pair(comm, z)
    x, y = full(2, 1.0), full(2, 0.0)
    pending = []
    if role == "partner":
        pending.append(comm.Isend(full(2, 9.0), guilty, tag=1))
    if role == "guilty":
        pending.append(comm.Irecv(y if z.wrong else full(2, 0.0), other, tag=1))
    if blocking:
        comm.Allreduce(x, y)
    else:
        pending.append(comm.Iallreduce(x, y))
    waitall(pending)
    return y


@pattern("Global Concurrency", ranks=(2, 4), via="collectives")
def message_into_a_wrapper_collectives_buffer(comm, z):
    """A message lands in the x of refconv.collectives.iallreduce_ while the allreduce writes its sum there."""
    guilty, other, role = pair(comm, z)
    x = full(2, 1.0)
    pending = []
    if role == "partner":
        pending.append(comm.Isend(full(2, 9.0), guilty, tag=1))
    if role == "guilty":
        pending.append(comm.Irecv(x if z.wrong else full(2, 0.0), other, tag=1))
    summed = collectives.iallreduce_(comm, x)
    waitall(pending)
    return summed.wait()
