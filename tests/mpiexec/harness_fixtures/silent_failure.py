"""A rank whose failure report never reaches mpiexec's output (harness self-test; not collected).

Rank 1 points its stdout at /dev/null before raising, which is what an Abort that
kills the job before mpiexec forwards the rank's last lines looks like to the launcher.
"""

import os
import sys

from mpi4py import MPI

from refconv.testing.mpirun import mpi_test


@mpi_test(sizes=(2,), timeout=20)
def test_fails_silently_on_rank_1():
    if MPI.COMM_WORLD.rank == 1:
        sys.stdout = open(os.devnull, "w")
        raise RuntimeError("deliberate silent failure on rank 1")
    MPI.COMM_WORLD.Barrier()      # rank 0 waits here until the abort ends it
