"""Buffering Hazard: a program that completes only if MPI buffers its blocking sends: two ranks that
both Send before they Recv, a ring where every rank sends first, a rank that sends to itself, a Send
whose receive comes after a collective, several Sends received in another order.  MPI lets a blocking
send wait for its receive (MPI_Ssend's semantics; every MPI does for messages too large to send
eagerly), so each deadlocks (MUST reports it under its Ssend check; the simulated world always does).
The twin posts its receive first, or sends with Isend and waits after."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, pair, ring, waitall
from zoo_registry import pattern


@pattern("Buffering Hazard", ranks=(2, 4), via="raw")
def both_send_first(comm, z):
    guilty, other, role = pair(comm, z)
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    if role == "partner" or (role == "guilty" and z.wrong):
        comm.Send(x, other if role == "guilty" else guilty, tag=1)
        comm.Recv(y, other if role == "guilty" else guilty, tag=1)
    elif role == "guilty":
        comm.Recv(y, other, tag=1)
        comm.Send(x, other, tag=1)
    return y


@pattern("Buffering Hazard", ranks=(3, 8), via="raw", blame=False,
         variants={"twin receives first": {"cut": False}, "twin cut by PROC_NULL": {"cut": True}})
def ring_every_rank_sends_first(comm, z, cut):
    """Every rank sends right, then receives from the left: a cycle of blocking sends.  The twin breaks it at
    the guilty rank: it receives first, or (``cut``) the chain ends there, MPI.PROC_NULL on both sides of the
    cut, and the sends complete one after another from the chain's end, with no buffering."""
    right, left = ring(comm)
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    if not z.wrong and cut:
        right = MPI.PROC_NULL if comm.rank == z.guilty else right
        left = MPI.PROC_NULL if comm.rank == (z.guilty + 1) % comm.size else left
    if z.wrong or cut or comm.rank != z.guilty:
        comm.Send(x, right, tag=1)
        comm.Recv(y, left, tag=1)
    else:
        comm.Recv(y, left, tag=1)
        comm.Send(x, right, tag=1)
    return y


@pattern("Buffering Hazard", ranks=(2, 3), via="raw")
def send_to_itself(comm, z):
    x, y = full(2, float(comm.rank)), full(2, -1.0)
    if comm.rank == z.guilty:
        if z.wrong:
            comm.Send(x, comm.rank, tag=1)
            comm.Recv(y, comm.rank, tag=1)
        else:
            request = comm.Isend(x, comm.rank, tag=1)
            comm.Recv(y, comm.rank, tag=1)
            request.Wait()
    return y


BETWEEN = {
    "Barrier": {"call": lambda comm: comm.Barrier()},
    "Bcast": {"call": lambda comm: comm.Bcast(full(2, 0.0), root=0)},
    "Allreduce": {"call": lambda comm: comm.Allreduce(MPI.IN_PLACE, full(2, 1.0))},
    "collectives.allreduce": {"call": lambda comm: collectives.allreduce(comm, full(2, 1.0))},
    "collectives.barrier": {"call": lambda comm: collectives.barrier(comm)},
}


def _send_across(comm, z, call):
    guilty, other, role = pair(comm, z)
    y = full(2, -1.0)
    request = None
    if role == "guilty":
        if z.wrong:
            comm.Send(full(2, 1.0), other, tag=1)       # waits for a receive posted after the collective
        else:
            request = comm.Isend(full(2, 1.0), other, tag=1)
    call(comm)
    if role == "partner":
        comm.Recv(y, guilty, tag=1)
    if request is not None:
        request.Wait()
    return y


@pattern("Buffering Hazard", ranks=(2, 4), via="raw", variants={k: v for k, v in BETWEEN.items() if "." not in k})
def send_before_a_collective(comm, z, call):
    return _send_across(comm, z, call)


@pattern("Buffering Hazard", ranks=(2, 3), via="collectives", variants={k: v for k, v in BETWEEN.items() if "." in k})
def send_before_a_wrapper_collective(comm, z, call):
    return _send_across(comm, z, call)


@pattern("Buffering Hazard", ranks=(2, 4), via="raw")
def sends_received_in_reverse(comm, z):
    guilty, other, role = pair(comm, z)
    ys = [full(2, -1.0) for _ in range(3)]
    if role == "guilty":
        if z.wrong:
            for tag in (1, 2, 3):
                comm.Send(full(2, float(tag)), other, tag=tag)
        else:
            waitall([comm.Isend(full(2, float(tag)), other, tag=tag) for tag in (1, 2, 3)])
    elif role == "partner":
        for tag in (3, 2, 1):
            comm.Recv(ys[tag - 1], guilty, tag=tag)
    return ys
