"""Rank 1 raises before a collective; the others wait in it.  The job must end fast."""

from mpi4py import MPI

from refconv.failure import install_abort_on_exception

install_abort_on_exception()
comm = MPI.COMM_WORLD
if comm.rank == 1:
    raise RuntimeError("rank 1 raises here")
comm.Barrier()
