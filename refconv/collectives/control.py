"""The MPI calls that move no recorded data: synchronisation, communicators, small objects,
and the job's layout (``refconv.device``, ``refconv info``).  Each runs under the deadline."""

from mpi4py import MPI

from refconv.collectives import local
from refconv.collectives.local import check_comm
from refconv.collectives.watchdog import guard


def barrier(comm):
    """comm.Barrier() (not recorded)."""
    check_comm(comm, "barrier")
    with guard("barrier", comm, {"barrier": "no data"}, call="Barrier"):
        comm.Barrier()


def split(comm, color, key):
    """``comm.Split(color, key)`` under the deadline (collective; not recorded)."""
    check_comm(comm, "split")
    with guard("split", comm, {"color": color, "key": key}, call="Split"):
        new = comm.Split(color, key)
    _forget(new)
    return new


def bcast_object(comm, obj, root=0):
    """Root's small picklable ``obj`` (a shape, a flag) on every rank; metadata, not recorded."""
    check_comm(comm, "bcast_object")
    if comm.Get_size() == 1:
        return obj
    with guard("object", comm, {"bcast from root": root}, call="bcast", root=root):
        return comm.bcast(obj, root=root)


def allgather_object(comm, obj):
    """Every rank's picklable ``obj``, as a list indexed by rank, on every rank."""
    check_comm(comm, "allgather_object")
    with guard("object", comm, {"allgather of": type(obj).__name__}, call="allgather"):
        return comm.allgather(obj)


def node_comm(comm):
    """The ranks of ``comm`` that share this rank's node (a shared-memory split);
    its rank is the node-local rank.  The caller frees it."""
    check_comm(comm, "node_comm")
    with guard("split", comm, {"split": "shared memory"}, call="Split_type"):
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    _forget(node)
    node.Set_name("node")                   # for the watchdog's timeout line
    return node


def _forget(comm):
    """A new communicator may reuse a freed one's handle: its calls are numbered afresh in the record."""
    record = local.current().flight
    if record is not None:
        record.forget(comm)


def library_version():
    """The MPI library's own version string (``MPI_Get_library_version``)."""
    return MPI.Get_library_version().strip()
