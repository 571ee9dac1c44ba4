"""Planted bug: rank 1 gathers to another root (refconv diagnose must name the line marked BUG)."""
import numpy
from mpi4py import MPI

from refconv import collectives

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x = numpy.full(4, rank, dtype=numpy.float32)
collectives.allreduce(comm, x)
if rank == 1:
    collectives.gather(comm, x, [(4,)] * size, root=1)  # BUG: the others gather to root 0
else:
    collectives.gather(comm, x, [(4,)] * size, root=0)
