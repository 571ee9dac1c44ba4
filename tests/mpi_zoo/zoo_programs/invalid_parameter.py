"""Invalid Parameter: the guilty rank hands a call a value MPI refuses on its own, whatever the other
ranks do: a root or peer outside the communicator, a tag below 0 (other than ANY_TAG on a receive) or
above MPI_TAG_UB, a colour below 0 other than MPI_UNDEFINED, a negative count, MPI_DATATYPE_NULL,
MPI_OP_NULL, a communicator used after its Free.  Each is MPI_ERR_ROOT, _RANK, _TAG, _ARG, _COUNT,
_TYPE, _OP or _COMM in MPI (MUST reports each at the guilty rank's call).  The twin passes a valid value."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, one_message, waitall
from zoo_registry import expect, pattern

NO_SPECIAL_VALUE = -7   # below 0 and none of PROC_NULL, ANY_SOURCE, ROOT (intercommunicators only), UNDEFINED
BAD_ROOTS = {"past the end": {"bad": lambda n: n}, "negative": {"bad": lambda n: NO_SPECIAL_VALUE}}
BAD_PEERS = {"past the end": {"bad": lambda n: n + 1}, "negative": {"bad": lambda n: NO_SPECIAL_VALUE}}
NOT_AN_INT = 2 ** 31    # above MPI_TAG_UB on every MPI (an int's range; the standard guarantees only 32767)


@pattern("Invalid Parameter", ranks=(2, 4), via="raw", variants=BAD_ROOTS)
def bcast_root(comm, z, bad):
    x = full(2, 5.0 if comm.rank == 0 else 0.0)
    comm.Bcast(x, root=bad(comm.size) if z.mine(comm) else 0)
    expect((x == 5.0).all(), f"rank {comm.rank}: Bcast from rank 0 gave {x}")
    return x


@pattern("Invalid Parameter", ranks=(2, 3), via="collectives", variants=BAD_ROOTS)
def bcast_wrapper_root(comm, z, bad):
    x = collectives.bcast(comm, full(2, 5.0 if comm.rank == 0 else 0.0), root=bad(comm.size) if z.mine(comm) else 0)
    expect((x == 5.0).all(), f"rank {comm.rank}: bcast from rank 0 gave {x}")
    return x


@pattern("Invalid Parameter", ranks=(2, 8), via="collectives")
def scatter_root(comm, z):
    root = comm.size if z.mine(comm) else 0
    blocks = [full(2, float(r)) for r in range(comm.size)] if comm.rank == 0 else None
    x = collectives.scatter(comm, blocks, (2,), root=root)
    expect((x == comm.rank).all(), f"rank {comm.rank}: scatter gave {x}")
    return x


@pattern("Invalid Parameter", ranks=(2, 4), via="raw", variants=BAD_PEERS)
def send_dest(comm, z, bad):
    x = full(2, 1.0)
    one_message(comm, z, lambda peer: comm.Send(x, bad(comm.size) if z.wrong else peer, tag=1),
                lambda peer: comm.Recv(x, peer, tag=1))
    return x


@pattern("Invalid Parameter", ranks=(2, 3), via="raw")
def recv_source_past_the_end(comm, z):
    x = full(2, 1.0)
    one_message(comm, z, lambda peer: comm.Send(x, peer, tag=1),
                lambda peer: comm.Recv(x, comm.size + 2 if z.wrong else peer, tag=1), from_guilty=False)
    return x


@pattern("Invalid Parameter", ranks=(2, 4), via="raw",
         variants={"negative": {"bad": -3}, "above TAG_UB": {"bad": NOT_AN_INT}})
def send_tag(comm, z, bad):
    x = full(2, 1.0)
    good = 32767    # the least TAG_UB the standard allows: valid on every MPI
    one_message(comm, z, lambda peer: comm.Isend(x, peer, tag=bad if z.wrong else good).Wait(),
                lambda peer: comm.Recv(x, peer, tag=MPI.ANY_TAG))
    return x


@pattern("Invalid Parameter", ranks=(2, 3), via="raw")
def recv_tag_negative(comm, z):
    x = full(2, 1.0)
    one_message(comm, z, lambda peer: comm.Send(x, peer, tag=4),        # ANY_TAG: the one negative tag allowed
                lambda peer: comm.Irecv(x, peer, tag=-4 if z.wrong else MPI.ANY_TAG).Wait(), from_guilty=False)
    return x


@pattern("Invalid Parameter", ranks=(2, 4), via="raw")
def any_source_as_a_destination(comm, z):
    """MPI.ANY_SOURCE is no destination; the twin sends to MPI.PROC_NULL, which completes at once, and
    receives from it: the buffer stays as it was, the Status says source PROC_NULL, count 0."""
    x = full(2, 1.0)
    if comm.rank == z.guilty:
        comm.Send(x, MPI.ANY_SOURCE if z.wrong else MPI.PROC_NULL, tag=1)
        status = MPI.Status()
        comm.Recv(x, MPI.PROC_NULL, tag=1, status=status)
        expect((x == 1.0).all() and (status.Get_source(), status.Get_count(MPI.DOUBLE)) == (MPI.PROC_NULL, 0),
               f"rank {comm.rank}: a receive from PROC_NULL gave {x}, source {status.Get_source()}, "
               f"count {status.Get_count(MPI.DOUBLE)}")
    return x


@pattern("Invalid Parameter", ranks=(3, 4), via="raw")
def split_colour_negative(comm, z):
    colour = -2 if z.mine(comm) else comm.rank % 2
    part = comm.Split(colour, comm.rank)
    part.Barrier()
    part.Free()


@pattern("Invalid Parameter", ranks=(2, 4), via="collectives")
def split_wrapper_colour_negative(comm, z):
    part = collectives.split(comm, -5 if z.mine(comm) else 0, comm.rank)
    total = collectives.allreduce(part, full(1, 1.0))
    part.Free()
    return total


@pattern("Invalid Parameter", ranks=(2, 3), via="raw")
def allreduce_op_null(comm, z):
    x, y = full(2, 1.0), full(2, 0.0)
    comm.Allreduce(x, y, op=MPI.OP_NULL if z.mine(comm) else MPI.SUM)
    expect((y == comm.size).all(), f"rank {comm.rank}: a sum of ones gave {y}")
    return y


@pattern("Invalid Parameter", ranks=(2, 4), via="collectives")
def allreduce_wrapper_op_unknown(comm, z):
    return collectives.allreduce(comm, full(2, 1.0), op="mean" if z.mine(comm) else "sum")


@pattern("Invalid Parameter", ranks=(2, 4), via="raw",
         variants={"negative count": {"spec": lambda x: [x, -1, MPI.DOUBLE]},
                   "DATATYPE_NULL": {"spec": lambda x: [x, 2, MPI.DATATYPE_NULL]}})
def send_buffer_spec(comm, z, spec):
    x = full(2, 3.0)
    one_message(comm, z, lambda peer: comm.Send(spec(x) if z.wrong else [x, 2, MPI.DOUBLE], peer, tag=2),
                lambda peer: comm.Recv([x, 2, MPI.DOUBLE], peer, tag=2))
    return x


@pattern("Invalid Parameter", ranks=(2, 4), via="raw")
def comm_used_after_free(comm, z):
    dup = comm.Dup()
    if z.mine(comm):
        dup.Free()
    x = full(2, 1.0)
    dup.Allreduce(MPI.IN_PLACE, x)
    if not z.mine(comm):
        dup.Free()
    return x


@pattern("Invalid Parameter", ranks=(2, 3), via="collectives")
def wrapper_on_freed_comm(comm, z):
    part = collectives.split(comm, 0, comm.rank)
    if z.mine(comm):
        part.Free()
    collectives.barrier(part)
    if not z.mine(comm):
        part.Free()


@pattern("Invalid Parameter", ranks=(4, 8), via="raw")
def isend_past_the_end_of_a_split(comm, z):
    half = comm.Split(comm.rank % 2, comm.rank)          # even and odd world ranks: each half has 2 or 4 ranks
    me, size = half.rank, half.size
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    dest = size if z.mine(comm) else (me + 1) % size      # `size`: a world rank, but no rank of `half`
    waitall([half.Isend(x, dest, tag=3), half.Irecv(y, (me - 1) % size, tag=3)])
    half.Free()
    return y
