"""Planted bug: rank 1 sends its ring message to the wrong neighbour (refconv diagnose must name the BUG line)."""
import time

import numpy
from mpi4py import MPI

from refconv import collectives

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
x = numpy.full(16, rank, dtype=numpy.float32)
if rank == 1:
    got = collectives.exchange(comm, {left: x}, {left: (16,)}, x.dtype)  # BUG: sends left, not right
else:
    got = collectives.exchange(comm, {right: x}, {left: (16,)}, x.dtype)
time.sleep(0.3)     # so that the rank left waiting for rank 1's message times out first
collectives.reduce_scatter(comm, numpy.ones(size, dtype=numpy.float32), [1] * size)
