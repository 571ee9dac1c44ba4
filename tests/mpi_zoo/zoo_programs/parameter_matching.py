"""Parameter Matching: calls that match, with arguments that must agree and do not, on the guilty rank:
a collective's root, op, count or datatype; a point-to-point message whose type signature differs from
its receive's (float64 sent, int32 received, the same bytes), or that is longer than the receive buffer
(MPI_ERR_TRUNCATE); block shapes of refconv.collectives' gather and alltoallv that the others do not
expect.  Every value is valid on its own: the error is in the pair (MUST: "type/count/root/op mismatch"
naming both ranks).  The twin passes the agreeing value."""

import numpy
from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, one_message
from zoo_registry import expect, pattern


@pattern("Parameter Matching", ranks=(2, 4), via="raw")
def bcast_root_differs(comm, z):
    root = (z.guilty + 1) % comm.size if z.mine(comm) else z.guilty    # the guilty rank names another root
    x = full(2, 5.0 if comm.rank == z.guilty else 0.0)
    comm.Bcast(x, root=root)
    expect((x == 5.0).all(), f"rank {comm.rank}: Bcast from rank {z.guilty} gave {x}")
    return x


@pattern("Parameter Matching", ranks=(2, 3), via="collectives")
def bcast_wrapper_root_differs(comm, z):
    root = (z.guilty + 1) % comm.size if z.mine(comm) else z.guilty    # the guilty rank names another root
    return collectives.bcast(comm, full(2, float(comm.rank)), root=root)


@pattern("Parameter Matching", ranks=(2, 4), via="raw")
def allreduce_op_differs(comm, z):
    x, y = full(2, float(comm.rank + 1)), full(2, 0.0)
    comm.Allreduce(x, y, op=MPI.MAX if z.mine(comm) else MPI.SUM)
    return y


@pattern("Parameter Matching", ranks=(2, 8), via="collectives")
def allreduce_wrapper_op_differs(comm, z):
    return collectives.allreduce(comm, full(2, float(comm.rank + 1)), op="max" if z.mine(comm) else "sum")


@pattern("Parameter Matching", ranks=(2, 4), via="raw",
         variants={"count": {"length": 3, "dtype": numpy.float64},
                   "datatype": {"length": 2, "dtype": numpy.float32}})
def allreduce_buffer_differs(comm, z, length, dtype):
    x = full(length, 1.0, dtype) if z.mine(comm) else full(2, 1.0)
    comm.Allreduce(MPI.IN_PLACE, x)
    return x


@pattern("Parameter Matching", ranks=(2, 3), via="collectives")
def allreduce_wrapper_length_differs(comm, z):
    return collectives.allreduce(comm, full(3 if z.mine(comm) else 2, 1.0))


@pattern("Parameter Matching", ranks=(2, 4), via="raw")
def bcast_datatype_differs(comm, z):
    x = full(4, 0, numpy.int32) if z.mine(comm) else full(2, 0.0)     # 16 bytes either way
    comm.Bcast(x, root=(z.guilty + 1) % comm.size)
    return x


@pattern("Parameter Matching", ranks=(2, 4), via="raw",
         variants={"float64 sent, int32 received": {"wrong_spec": lambda y: [y.view(numpy.int32), MPI.INT]},
                   "message longer than the receive": {"wrong_spec": lambda y: [y[:1], MPI.DOUBLE]}})
def p2p_signature_differs(comm, z, wrong_spec):
    y = full(2, 0.0)

    def receive(peer):
        comm.Recv(wrong_spec(y) if z.wrong else [y, MPI.DOUBLE], peer, tag=1)
        expect((y == 2.5).all(), f"rank {comm.rank}: received {y}, sent 2.5")
    one_message(comm, z, lambda peer: comm.Send([full(2, 2.5), MPI.DOUBLE], peer, tag=1), receive, from_guilty=False)
    return y


@pattern("Parameter Matching", ranks=(2, 3), via="raw")
def byte_counts_differ(comm, z):
    x, y = numpy.arange(4, dtype=numpy.float64), full(4, -1.0)

    def receive(peer):
        comm.Recv([y, 16, MPI.BYTE], peer, tag=1)
        expect((y == [0, 1, -1, -1]).all(), f"rank {comm.rank}: 16 bytes of 0, 1 gave {y}")
    one_message(comm, z, lambda peer: comm.Send([x, 32 if z.wrong else 16, MPI.BYTE], peer, tag=1), receive)
    return y   # the twin sends its first two doubles


@pattern("Parameter Matching", ranks=(2, 4), via="collectives")
def gather_wrapper_block_differs(comm, z):
    x = full(3 if z.mine(comm) else 2, float(comm.rank))
    return collectives.gather(comm, x, [(2,)] * comm.size, root=0)


@pattern("Parameter Matching", ranks=(2, 3), via="collectives")
def alltoallv_wrapper_block_differs(comm, z):
    n = 2 if z.mine(comm) else 1
    blocks = [full(n, float(comm.rank)) for _ in range(comm.size)]
    return collectives.alltoallv(comm, blocks, [(1,)] * comm.size)
