"""What several classes' programs share: small buffers and the guilty rank's partner."""

import numpy
from mpi4py import MPI


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


def one_message(comm, z, send, receive, *, from_guilty=True):
    """A message between the guilty rank and its partner (``from_guilty``: the guilty rank sends): the
    sender calls ``send(receiver)``, the receiver ``receive(sender)``, the other ranks nothing."""
    guilty, other, _ = pair(comm, z)
    sender, receiver = (guilty, other) if from_guilty else (other, guilty)
    if comm.rank == sender:
        send(receiver)
    elif comm.rank == receiver:
        receive(sender)


def fence_epoch(comm, access):
    """An RMA window over 4 doubles of each rank (displacements in elements), one Fence epoch in which
    ``access(window, memory)`` runs on every rank, then the window freed; returns this rank's memory."""
    memory = full(4, 0.0)
    window = MPI.Win.Create(memory, disp_unit=memory.itemsize, comm=comm)
    window.Fence()
    access(window, memory)
    window.Fence()
    window.Free()
    return memory
