"""Call Matching: calls that cannot match: the guilty rank skips a collective the others make, makes a
different one or one more, makes them in another order, or on another communicator; a blocking
collective where the others start a nonblocking one (MPI-3 says they never match); Dup where the others
Split; a send no rank receives, a receive no rank sends, a tag the peer does not use.  Under MPI the job
hangs or aborts (MUST: "collective mismatch", "deadlock", "lost message").  The twin makes the calls
the others make."""

from mpi4py import MPI

from refconv import collectives
from zoo_programs.common import full, one_message
from zoo_registry import pattern

COLLECTIVES = {
    "Barrier": lambda comm: comm.Barrier(),
    "Allreduce": lambda comm: comm.Allreduce(MPI.IN_PLACE, full(2, 1.0)),
    "Bcast": lambda comm: comm.Bcast(full(2, 1.0), root=0),
    "barrier": lambda comm: collectives.barrier(comm),
    "allreduce": lambda comm: collectives.allreduce(comm, full(2, 1.0)),
    "bcast": lambda comm: collectives.bcast(comm, full(2, 1.0), root=0),
}
RAW, WRAPPED = ("Barrier", "Allreduce", "Bcast"), ("barrier", "allreduce", "bcast")


@pattern("Call Matching", ranks=(2, 4), via="raw", variants={k: {"call": COLLECTIVES[k]} for k in RAW[:2]})
def collective_skipped(comm, z, call):
    if not z.mine(comm):
        call(comm)


@pattern("Call Matching", ranks=(2, 8), via="collectives", variants={k: {"call": COLLECTIVES[k]} for k in WRAPPED[:2]})
def wrapper_collective_skipped(comm, z, call):
    if not z.mine(comm):
        call(comm)


@pattern("Call Matching", ranks=(2, 4), via="raw", variants={"Bcast for Allreduce": {"names": ("Allreduce", "Bcast")}})
def different_collective(comm, z, names):
    COLLECTIVES[names[1] if z.mine(comm) else names[0]](comm)


@pattern("Call Matching", ranks=(2, 3), via="collectives", variants={"bcast for allreduce": {"names": ("allreduce", "bcast")}})
def wrapper_different_collective(comm, z, names):
    COLLECTIVES[names[1] if z.mine(comm) else names[0]](comm)


@pattern("Call Matching", ranks=(2, 4), via="raw")
def collectives_in_another_order(comm, z):
    order = ("Barrier", "Allreduce") if z.mine(comm) else ("Allreduce", "Barrier")
    for name in order:
        COLLECTIVES[name](comm)


@pattern("Call Matching", ranks=(2, 4), via="raw")
def one_collective_more(comm, z):
    COLLECTIVES["Allreduce"](comm)
    if z.mine(comm):
        COLLECTIVES["Allreduce"](comm)


@pattern("Call Matching", ranks=(2, 4), via="raw")
def collective_on_another_communicator(comm, z):
    dup = comm.Dup()
    x = full(2, 1.0)
    (dup if z.mine(comm) else comm).Allreduce(MPI.IN_PLACE, x)
    dup.Free()
    return x


@pattern("Call Matching", ranks=(2, 3), via="raw")
def blocking_matched_with_nonblocking(comm, z):
    x = full(2, 1.0)
    if z.mine(comm):
        comm.Allreduce(MPI.IN_PLACE, x)
    else:
        comm.Iallreduce(MPI.IN_PLACE, x).Wait()
    return x


@pattern("Call Matching", ranks=(2, 4), via="collectives")
def wrapper_blocking_matched_with_nonblocking(comm, z):
    x = full(2, 1.0)
    return collectives.allreduce_(comm, x) if z.mine(comm) else collectives.iallreduce_(comm, x).wait()


@pattern("Call Matching", ranks=(2, 4), via="raw")
def dup_where_the_others_split(comm, z):
    new = comm.Dup() if z.mine(comm) else comm.Split(0, comm.rank)
    new.Barrier()
    new.Free()


@pattern("Call Matching", ranks=(2, 4), via="raw",
         variants={"one send more": {"from_guilty": True, "extra": 1, "tag": 1},
                   "one receive more": {"from_guilty": False, "extra": 1, "tag": 1},
                   "a tag never sent": {"from_guilty": False, "extra": 0, "tag": 2}})
def unmatched_messages(comm, z, from_guilty, extra, tag):
    """The guilty rank makes ``extra`` calls more than its partner matches, or receives with ``tag``; the partner
    sends or receives one message of tag 1."""
    x = full(2, 1.0)
    ours = 1 + (extra if z.wrong else 0)

    def send(peer):
        for _ in range(ours if from_guilty else 1):
            comm.Send(x, peer, tag=1)

    def receive(peer):
        for _ in range(1 if from_guilty else ours):
            comm.Recv(x, peer, tag=tag if z.wrong else 1)
    one_message(comm, z, send, receive, from_guilty=from_guilty)
    return x
