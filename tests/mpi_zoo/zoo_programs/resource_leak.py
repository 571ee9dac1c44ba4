"""Resource Leak: the guilty rank creates an MPI object and never frees it before the end (MPI_Finalize):
a communicator (Dup, Split, Split_type, Create), a group (Get_group, Incl), a committed datatype, a
user-defined op, a persistent request.  MUST reports each at the end with where it was created.  The twin
frees everything it creates.  The leak is the guilty rank's alone: the other ranks free theirs."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, waitall
from zoo_registry import pattern

NEW_COMMS = {
    "Dup": {"make": lambda comm: comm.Dup()},
    "Split": {"make": lambda comm: comm.Split(comm.rank % 2, comm.rank)},
    "Split_type": {"make": lambda comm: comm.Split_type(MPI.COMM_TYPE_SHARED)},
    "Create": {"make": lambda comm: _create(comm)},
    "collectives.split": {"make": lambda comm: collectives.split(comm, 0, comm.size - comm.rank)},
    "collectives.node_comm": {"make": lambda comm: collectives.node_comm(comm)},
}


def _create(comm):
    group = comm.Get_group()
    new = comm.Create(group)
    group.Free()
    return new


@pattern("Resource Leak", ranks=(2, 4), via="raw", variants={k: v for k, v in NEW_COMMS.items() if "." not in k})
def comm_not_freed(comm, z, make):
    new = make(comm)
    new.Barrier()
    if not z.mine(comm):
        new.Free()


@pattern("Resource Leak", ranks=(2, 8), via="collectives", variants={k: v for k, v in NEW_COMMS.items() if "." in k})
def wrapper_comm_not_freed(comm, z, make):
    new = make(comm)
    total = collectives.allreduce(new, full(1, 1.0))
    if not z.mine(comm):
        new.Free()
    return total


@pattern("Resource Leak", ranks=(2, 3), via="raw")
def one_of_three_dups_not_freed(comm, z):
    dups = [comm.Dup() for _ in range(3)]
    for k, dup in enumerate(dups):
        dup.Barrier()
        if not (z.mine(comm) and k == 1):
            dup.Free()


@pattern("Resource Leak", ranks=(2, 4), via="raw")
def dup_of_a_split_not_freed(comm, z):
    half = comm.Split(comm.rank % 2, comm.rank)
    inner = half.Dup()
    inner.Barrier()
    if not z.mine(comm):
        inner.Free()
    half.Free()


@pattern("Resource Leak", ranks=(2, 4), via="raw",
         variants={"Get_group": {"incl": False}, "Incl": {"incl": True}})
def group_not_freed(comm, z, incl):
    group = comm.Get_group()
    made = [group, group.Incl([0])] if incl else [group]
    size = made[-1].Get_size()
    for g in made[:-1] if z.mine(comm) else made:   # the guilty rank forgets the last group it made
        g.Free()
    return size


@pattern("Resource Leak", ranks=(2, 3), via="raw",
         variants={"contiguous": {"make": lambda: MPI.DOUBLE.Create_contiguous(2)},
                   "vector": {"make": lambda: MPI.INT.Create_vector(2, 1, 2)}})
def datatype_not_freed(comm, z, make):
    datatype = make().Commit()
    extent = datatype.Get_extent()
    comm.Barrier()
    if not z.mine(comm):
        datatype.Free()
    return extent


@pattern("Resource Leak", ranks=(2, 4), via="raw")
def datatype_sent_then_not_freed(comm, z):
    pairs = MPI.DOUBLE.Create_contiguous(2).Commit()
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    waitall([comm.Isend([x, 1, pairs], right, tag=6), comm.Irecv([y, 1, pairs], left, tag=6)])
    if not z.mine(comm):
        pairs.Free()
    return y


@pattern("Resource Leak", ranks=(2, 3), via="raw")
def op_not_freed(comm, z):
    op = MPI.Op.Create(lambda a, b, datatype: None, commute=True)   # made, never used: a leak all the same
    comm.Barrier()
    if not z.mine(comm):
        op.Free()


@pattern("Resource Leak", ranks=(2, 4), via="raw", feature="persistent")
def persistent_request_not_freed(comm, z):
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    send = comm.Send_init(x, right, tag=7)
    send.Start()
    comm.Recv(y, left, tag=7)
    send.Wait()
    if not z.mine(comm):
        send.Free()
    return y
