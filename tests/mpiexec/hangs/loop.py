"""A correct run that loops until it is killed (refconv diagnose must find no divergence)."""
import numpy
from mpi4py import MPI

from refconv import collectives

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
x = numpy.full(16, rank, dtype=numpy.float32)
rounds = 0
while True:
    collectives.allreduce(comm, x)
    collectives.exchange(comm, {right: x}, {left: (16,)}, x.dtype)
    collectives.gather(comm, x, [(16,)] * size, root=0)
    rounds += 1
    if rounds == 10 and rank == 0:
        print("looping", flush=True)
