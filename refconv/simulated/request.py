"""A simulated rank's request: one nonblocking call, from its post to its completion.

A request is *done* once its data has moved (the engine delivers it when the call matches) and
*completed* once a ``Wait`` or a ``Test`` returned it; the rank's engine keeps the requests not yet
completed (``Calls.pending``), and a rank whose function returns with one is a
:class:`refconv.simulated.world.PendingRequests`.  Between the post and the completion its
buffers are watched (:mod:`refconv.simulated.buffers`: a change is a ``BufferReused``) and a
nonblocking receive's buffer holds poison (:mod:`refconv.simulated.poison`); after the completion
they are the rank's again, and nothing of the request is checked twice.
"""

import numpy
from mpi4py import MPI

from refconv.simulated import buffers, params, poison
from refconv.simulated.world import BufferReused, InvalidParameter, Unsupported, current_rank

PERSISTENT = ("Send_init", "Recv_init", "Ssend_init", "Bsend_init", "Rsend_init", "Start", "Startall")


class Request:
    """One nonblocking call of one rank; done once its data has moved, completed once waited (or tested)."""

    def __init__(self, owner, what, call=None, site=None):
        self.owner, self.what = owner, what
        self.call, self.site = call, site    # the mpi4py call that started it and where ("file:line"), for reports
        self.done = False          # its data has moved
        self.completed = False     # a Wait or a Test returned it: nothing of it is checked again
        self.result = None         # what a blocking call returns (a new communicator, an object)
        self.payload = None        # what an object collective carries, pickled (for the reports)
        self.error = None          # a BufferReused found while the data moved, raised at completion
        self.ready = 0.0           # the logical time the call's data arrives (a priced run)
        self.status = None         # a receive's (source, tag, bytes) once matched
        self._watched = []         # [(array, fingerprint, role)]: buffers that must not change
        self._poisoned = []        # [[array, what it holds once completed]]: receive buffers holding poison
        self.memory = []           # [(array or byte view, writes)]: the memory the call reads or writes, until completed

    def watch(self, array, role):
        """Remember ``array``'s bytes now: it must not change until the request completes."""
        self._watched.append([array, buffers.fingerprint(array), role])

    def claim(self, array, writes, view=None):
        """The call reads (``writes`` False) or writes ``array`` (``view``: the bytes of it a datatype names)
        until it completes: :func:`overlap` compares the next calls of this rank with it."""
        if array is not None and not getattr(array, "shapes_only", False):
            self.memory.append((array if view is None else view, writes))

    def poison(self, array):
        """Fill the receive buffer ``array`` with poison until completion (refconv.simulated.poison);
        before :meth:`watch`, which then watches the poison."""
        saved = poison.fill(array)
        if saved is not None:
            self._poisoned.append([array, saved])

    def verify(self, when):
        """A BufferReused if a watched buffer changed; else None."""
        for array, print_, role in self._watched:
            if buffers.changed(array, print_):
                return BufferReused(f"rank {self.owner.rank}: the {role} buffer (shape {array.shape} {array.dtype}) of "
                                    f"{self.what} changed {when}: a real MPI could move either version; keep it "
                                    f"untouched until the request's Wait or Test returns")
        return None

    def moving(self):
        """The data is about to move: a buffer changed since the post is an error, kept for the owner;
        poisoned buffers get back what they held (an in-place send's data, a short message's tail)."""
        self.error = self.error or self.verify("before its data moved")
        for entry in self._poisoned:
            entry[0][...] = entry[1]

    def delivered(self):
        """The data moved: it waits beside a poisoned buffer, which holds poison again; receive buffers
        are now watched with what they hold."""
        for entry in self._poisoned:
            entry[1] = poison.fill(entry[0])
        for entry in self._watched:
            entry[1] = buffers.refreshed(*entry[:2])
        self.done = True

    def complete(self):
        """A Wait or Test returned it: poisoned buffers get their data, and nothing is watched any more."""
        for array, data in self._poisoned:
            array[...] = data
        self._poisoned = self._watched = self.memory = ()
        self.completed = True

    def fill(self, status):
        """Fill an ``MPI.Status`` with what this request received (source, tag, count in bytes)."""
        if status is None:
            return
        if not isinstance(status, MPI.Status):
            raise InvalidParameter(f"{self.call or 'Wait'} on rank {self.owner.rank}: status must be an MPI.Status "
                                   f"or None, got a {type(status).__name__}")
        source, tag, nbytes = self.status or (MPI.ANY_SOURCE, MPI.ANY_TAG, 0)
        status.Set_source(source)
        status.Set_tag(tag)
        status.Set_error(MPI.SUCCESS)
        status.Set_elements(MPI.BYTE, nbytes)

    # -- mpi4py's completion calls ----------------------------------------------------------------
    def Wait(self, status=None):
        self.owner.world_calls.wait([self])
        self.fill(status)
        return True

    def Test(self, status=None):
        done = self.owner.world_calls.test([self])
        if done:
            self.fill(status)
        return done

    @classmethod
    def Waitall(cls, requests, statuses=None):
        requests = _requests(requests, "Request.Waitall")
        if requests:
            current_rank("Request.Waitall").world_calls.wait(requests)
        _fill_all(requests, statuses)
        return True

    @classmethod
    def Testall(cls, requests, statuses=None):
        requests = _requests(requests, "Request.Testall")
        done = not requests or current_rank("Request.Testall").world_calls.test(requests)
        if done:
            _fill_all(requests, statuses)
        return done

    @classmethod
    def Waitany(cls, requests, status=None):
        """The index of the request that completed (MPI.UNDEFINED when none was active); ``status`` filled."""
        entries = _requests(requests, "Request.Waitany", nulls=True)
        done = current_rank("Request.Waitany").world_calls.wait_any([r for r in entries if r is not None])
        if done is None:
            return MPI.UNDEFINED
        done.fill(status)
        return next(i for i, r in enumerate(entries) if r is done)

    @classmethod
    def Testany(cls, requests, status=None):
        """``(index, flag)``: the request that completed now, or ``(MPI.UNDEFINED, flag)``."""
        entries = _requests(requests, "Request.Testany", nulls=True)
        done, flag = current_rank("Request.Testany").world_calls.test_any([r for r in entries if r is not None])
        if done is None:
            return MPI.UNDEFINED, flag
        done.fill(status)
        return next(i for i, r in enumerate(entries) if r is done), True

    def __getattr__(self, name):
        if name in PERSISTENT:
            raise Unsupported(f"simulated ranks: persistent requests (Request.{name}) are not simulated")
        if name[:1].isupper() or name in ("wait", "test", "waitall", "testall", "waitany", "testany", "cancel"):
            raise Unsupported(f"simulated ranks: Request.{name} is not implemented (Wait, Test, Waitall, Testall, "
                              f"Waitany and Testany are)")
        raise AttributeError(name)

    def __repr__(self):
        return f"<simulated request: {self.what}{' (done)' if self.done else ''}>"


def overlap(new, pending, site):
    """A BufferReused if ``new`` (a call just posted on this rank) writes memory that a request of
    ``pending`` (this rank's requests not yet completed) reads or writes, or reads memory one writes: MPI
    forbids touching the buffer of a pending call.  Byte ranges first (cheap), exact only where they meet;
    O(this rank's pending requests), so a rank with none pays nothing.  ``site``: where ``new`` was called."""
    for mine, writes in new.memory:
        for other in pending:
            for theirs, written in other.memory:
                if (writes or written) and numpy.may_share_memory(mine, theirs) and _share(mine, theirs):
                    return BufferReused(
                        f"rank {new.owner.rank}: {new.call} at {new.site or site()} ({new.what}) "
                        f"{'writes' if writes else 'reads'} memory that {other.call} at {other.site or 'an unknown line'} "
                        f"({other.what}) {'writes' if written else 'reads'} and that request is still pending: the "
                        f"buffer of a nonblocking call must not be touched until its Wait or Test returns (MPI); "
                        f"use separate buffers, or wait first")
    return None


def _share(a, b):
    try:
        return numpy.shares_memory(a, b, max_work=10_000)
    except numpy.exceptions.TooHardError:     # strided views too tangled to solve: they may meet
        return True


def _requests(requests, call, nulls=False):
    """The simulated requests of a Waitall/Testall list; MPI.REQUEST_NULL entries are skipped, as MPI does
    (``nulls``: kept as None, so that indices stay those of ``requests``)."""
    call = f"{call} on rank {current_rank(call).rank}"
    try:
        entries = list(requests)
    except TypeError:
        raise InvalidParameter(f"{call}: requests must be a list of requests, got {params.show(requests)}") from None
    kept = []
    for i, r in enumerate(entries):
        if isinstance(r, Request):
            kept.append(r)
        elif isinstance(r, MPI.Request) and r == MPI.REQUEST_NULL:
            if nulls:
                kept.append(None)
        else:
            raise InvalidParameter(f"{call}: requests[{i}] must be a request of this simulated rank, got {params.show(r)}")
    return kept


def _fill_all(requests, statuses):
    if statuses is None:
        return
    if not isinstance(statuses, list):
        raise InvalidParameter(f"Request.Waitall on rank {current_rank('Request.Waitall').rank}: statuses must be a list of MPI.Status or None, got {params.show(statuses)}")
    statuses.extend(MPI.Status() for _ in range(len(requests) - len(statuses)))   # as mpi4py: the list grows
    for r, status in zip(requests, statuses):
        r.fill(status)
