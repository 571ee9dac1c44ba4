"""Deliberately failing multi-rank tests for the harness self-test (not collected)."""

import time

from mpi4py import MPI

from refconv.testing.mpirun import mpi_test


@mpi_test(sizes=(2,), timeout=20)
def test_passes_first():
    MPI.COMM_WORLD.Barrier()


@mpi_test(sizes=(2,), timeout=20)
def test_fails_on_rank_1():
    if MPI.COMM_WORLD.rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    MPI.COMM_WORLD.Barrier()      # rank 0 waits here until the abort ends it


@mpi_test(sizes=(2,), timeout=20)
def test_passes_after():
    assert MPI.COMM_WORLD.allreduce(1) == 2


@mpi_test(sizes=(2,), timeout=3)
def test_hangs_on_rank_0():
    if MPI.COMM_WORLD.rank == 0:
        time.sleep(60)


@mpi_test(sizes=(2,), timeout=20)
def test_passes_last():
    MPI.COMM_WORLD.Barrier()
