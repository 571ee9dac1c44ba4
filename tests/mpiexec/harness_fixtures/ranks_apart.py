"""A rank-dependent failure the harness must explain (not collected): rank 1 raises inside a
collective check, which turns the error into a verdict, then waits in a collective rank 0 never
reaches, because rank 0 went on to another communicator's.  Both time out."""

from mpi4py import MPI

from refconv.testing.asserts import caught
from refconv.testing.mpirun import mpi_test


@mpi_test(sizes=(2,), timeout=4)
def test_ranks_apart_after_a_caught_error():
    world = MPI.COMM_WORLD
    other = world.Dup()
    if world.rank == 1:
        try:
            raise ValueError("rank 1's caught error")
        except ValueError as exc:
            caught(exc)
        world.Barrier()               # reporting its verdict on the world...
    else:
        other.Barrier()               # ...while rank 0 went on to another communicator
