"""Planted bug: the last rank skips a collective (refconv diagnose must name the line marked BUG)."""
import numpy
from mpi4py import MPI

from refconv import collectives

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
x = numpy.ones(8, dtype=numpy.float32)
collectives.allreduce(comm, x)
if rank != size - 1:
    collectives.allreduce(comm, x)  # BUG: the last rank never makes this call
