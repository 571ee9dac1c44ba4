"""A grid whose product is not the world size: every rank must raise the same error."""

import sys

from mpi4py import MPI

from refconv.grid import ProcessGrid

try:
    ProcessGrid(MPI.COMM_WORLD, sample=2, channel=3)
except ValueError as exc:
    # one write per line, so mpiexec cannot interleave ranks within it
    sys.stdout.write(f"rank {MPI.COMM_WORLD.rank}: {exc}\n")
    sys.stdout.flush()
