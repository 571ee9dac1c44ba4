"""The calls in flight: a :class:`Request` per call started by an ``i...`` operation
(refconv.collectives.ops), and :func:`progress`, which lets MPI move them on.

A Request holds the MPI requests of its call and a ``finish`` that turns the received
buffers into the result once MPI is done with them.  ``wait()`` runs under the
collective deadline (``guard``) and counts the seconds waited in ``stats``, as a
blocking call's; ``test()`` polls.  MPICH progresses a nonblocking call only inside
MPI calls unless ``MPICH_ASYNC_PROGRESS=1``, so work that overlaps calls in flight
calls :func:`progress` between its chunks (docs/parallel.md, "Overlap").
"""

import time

from refconv.collectives import flight, local
from refconv.collectives.faults import fault_point
from refconv.collectives.local import stats
from refconv.collectives.watchdog import guard


class Request:
    """A call started by an ``i...`` function: ``wait()`` finishes it and returns its result.

    ``test()`` lets MPI progress it and says whether it has finished.  ``finish`` turns the
    received buffers into the result once MPI is done with them.
    """

    def __init__(self, kind, comm, requests, finish, buffers=None, overlap="", *, call=None, nbytes=None,
                 root=None, peers=None):
        self.kind, self.comm, self._requests, self._finish, self._buffers = kind, comm, requests, finish, buffers
        self.overlap, self.started = overlap, local.now()
        self._done, self._result, self.entry = False, None, None
        if requests:
            fault_point(kind, "collective")  # at the start: progress() may finish the call, and no wait come
            state = local.current()
            state.in_flight.add(self)
            if state.flight is not None:    # its entry in the rank's record (call, nbytes, root, peers: see guard)
                self.entry = state.flight.begin(kind, call, comm, nbytes, root, peers)

    def test(self):
        """True when MPI has finished the call (``wait()`` then returns without waiting)."""
        if self._done or not self._requests:
            return True
        if _request_class(self._requests).Testall(self._requests):
            local.current().in_flight.discard(self)
            self._requests = []
            if self.entry is not None:
                self.entry[flight.END] = time.perf_counter()
            stats.add_event(self.kind, self.overlap, self.started, local.now(), local.current().arrived())  # no wait
            return True
        return False

    def wait(self):
        """The result, once MPI has finished (the time waited is the kind's, as a blocking call's)."""
        if not self._done:
            if self._requests:
                with guard(self.kind, self.comm, self._buffers or {}, started=self.started, overlap=self.overlap,
                           entry=self.entry):
                    _request_class(self._requests).Waitall(self._requests)
                local.current().in_flight.discard(self)
            self._result, self._done = self._finish(), True
            self._requests = self._finish = self._buffers = None
        return self._result


def _request_class(requests):
    """The request class whose ``Waitall``/``Testall`` completes these: ``MPI.Request``, or a simulated
    world's (refconv.simulated), which offers the same two class methods."""
    return type(requests[0])


def progress():
    """Test every call in flight on this rank, so that MPI moves them on (MPI_Test polling); returns
    how many are still in flight.  Cheap: call it between chunks of compute while calls overlap it."""
    in_flight = local.current().in_flight
    for request in list(in_flight):
        request.test()
    return len(in_flight)


def finished(result):
    """A Request with nothing in flight (a one-rank communicator: no MPI call)."""
    return Request(None, None, [], lambda: result)
