"""What several classes' programs share: small buffers and the guilty rank's partner."""

import numpy


def full(n, value, dtype=numpy.float64):
    """A small array of ``n`` elements, each ``value``."""
    return numpy.full(n, value, dtype=dtype)


def partner(comm, z):
    """The rank the guilty rank talks to: the next one, around the ring."""
    return (z.guilty + 1) % comm.size


def pair(comm, z):
    """``(guilty, partner)``, and this rank's role in it: "guilty", "partner" or None (a bystander)."""
    other = partner(comm, z)
    role = "guilty" if comm.rank == z.guilty else "partner" if comm.rank == other else None
    return z.guilty, other, role


def waitall(requests):
    """Complete ``requests`` with their own class's ``Waitall`` (mpi4py's ``MPI.Request`` under mpiexec, the
    simulated world's on simulated ranks), as refconv.collectives.requests does; none: nothing to wait for."""
    if requests:
        type(requests[0]).Waitall(requests)


def trio(comm, z):
    """``(guilty, a, b)``: the guilty rank and the next two around the ring (a world of 3 ranks or more)."""
    return z.guilty, (z.guilty + 1) % comm.size, (z.guilty + 2) % comm.size


def ring(comm):
    """``(right, left)``: the next and the previous rank around the ring."""
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
