"""Every MPI data movement in refconv goes through this package.

``from refconv import collectives; collectives.allreduce(comm, x)``: the names below
are the public API, each defined in one module.

==============  ==========================================================================
module          what it holds
==============  ==========================================================================
``ops``         the operations, one implementation each, with the table of what each moves
``requests``    the calls in flight: ``Request`` (``wait``, ``test``) and ``progress``
``control``     calls that move no recorded data: barrier, split, small objects, node layout
``recording``   ``CommStats``: exact counts of the calls made (kind, ranks, elements, bytes)
``local``       what is kept per rank (``stats``, the calls in flight, the fault): the process's,
                or a simulated rank's (:mod:`refconv.simulated`)
``watchdog``    the collective deadline (``set_timeout``, ``timeout``, ``REFCONV_TIMEOUT``)
``flight``      each rank's record of its last MPI calls, written when the job fails
                (``REFCONV_RECORD_CALLS``, ``REFCONV_RECORD_DIR``)
``divergence``  the first call where the ranks' records differ (``refconv diagnose``)
``faults``      fault injection for tests (``REFCONV_FAULT``, read when first needed)
``staging``     host staging of device buffers, and the MPI datatypes of split blocks
``buckets``     gradients packed into one allreduce up to a size threshold (DDP's buckets)
==============  ==========================================================================

Only this package calls MPI to move data (tests/architecture/test_architecture.py checks it).
"""

from refconv.collectives.control import allgather_object, barrier, bcast_object, library_version, node_comm, split
from refconv.collectives.faults import FaultInjected, fault_point, set_fault
from refconv.collectives.ops import allgather, allreduce, allreduce_, alltoallv, bcast, exchange, gather, iallgather, \
    iallreduce_, iexchange, ireduce_scatter, reduce_scatter, scatter
from refconv.collectives.local import check_comm, comm_self, priced, stats
from refconv.collectives.recording import KINDS, CommStats, Record, Region
from refconv.collectives.requests import Request, progress
from refconv.collectives.staging import cuda_aware
from refconv.collectives.watchdog import EXIT_TIMEOUT, DEFAULT_TIMEOUT_S, env_timeout, get_timeout, \
    set_timeout, timeout

__all__ = ["allgather", "allgather_object", "allreduce", "allreduce_", "alltoallv", "barrier", "bcast",
           "bcast_object", "check_comm", "comm_self", "CommStats", "cuda_aware", "env_timeout", "exchange", "EXIT_TIMEOUT",
           "fault_point", "FaultInjected", "gather", "get_timeout", "iallgather", "iallreduce_", "iexchange",
           "ireduce_scatter", "KINDS", "library_version", "node_comm", "priced", "progress", "Record", "Request",
           "reduce_scatter", "Region", "scatter", "set_fault", "set_timeout", "split", "stats", "timeout",
           "DEFAULT_TIMEOUT_S"]
