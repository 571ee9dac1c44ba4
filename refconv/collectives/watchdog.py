"""Deadlines: every MPI call of refconv.collectives runs under the collective timeout.

When one call waits longer, a daemon thread prints ONE line (the collective, the
communicator's name, the shapes, how long this rank waited) and calls
``MPI.COMM_WORLD.Abort(EXIT_TIMEOUT)``, so a stopped or stuck peer ends the job
instead of hanging it.  The timeout comes from ``set_timeout(seconds)`` or
``with timeout(seconds):``, else the environment variable ``REFCONV_TIMEOUT``
(seconds; 0, ``none`` or ``off``: none), read at import.  Under more than one MPI rank the
default is ``DEFAULT_TIMEOUT_S`` (300 s), so a hang ends instead of busy-polling forever; a
long run opts out with ``REFCONV_TIMEOUT=0``, ``set_timeout(None)``, or ``with timeout(None):``
around one long wait.  One process has none (it makes no MPI call).  ``refconv train`` uses
``--timeout`` (default ``DEFAULT_TIMEOUT_S``).  Before it aborts, the rank writes its call
record (:mod:`refconv.collectives.flight`).

A wrapper brackets its MPI call with ``with guard(kind, comm, buffers, call=...):``, which
enters the call in the rank's record, and is also where a fault injected for tests strikes (``refconv.collectives.faults``) and
where the time per kind is added up (``stats.add_seconds``).
"""

import contextlib
import numbers
import os
import sys
import threading
import time

from mpi4py import MPI

from refconv.collectives import flight, local
from refconv.collectives.faults import fault_point
from refconv.failure import LINE_GRACE_S

DEFAULT_TIMEOUT_S = 300.0       # the deadline under several ranks, and refconv train's default --timeout
EXIT_TIMEOUT = 124              # the abort code of a timed-out collective (as coreutils timeout)


def _check_timeout(seconds, what="timeout"):
    """seconds > 0, or None for no deadline (0 also means none)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not seconds >= 0 \
            or seconds == float("inf"):
        raise ValueError(f"{what}: expected seconds > 0, or 0 / None for no deadline; got {seconds!r}")
    return float(seconds) or None


def env_timeout(default=None):
    """REFCONV_TIMEOUT in seconds (0: no deadline) if set, else ``default``."""
    text = os.environ.get("REFCONV_TIMEOUT", "").strip()
    if not text:
        return _check_timeout(default)
    if text.lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = text
    return _check_timeout(value, "REFCONV_TIMEOUT")


class Watchdog:
    """Watches the MPI call in progress from a daemon thread; aborts the job past its deadline.

    The calling thread only stores and clears ``current``, a tuple (kind, comm, buffers,
    start time, timeout): no lock, no system call, so the deadline costs well under 5%
    of a 4 KB allreduce (``python -m refconv.bench.watchdog``).
    """

    def __init__(self):
        self.timeout = None
        self.current = None
        self._thread = None

    def set(self, seconds):
        self.timeout = seconds
        if seconds is not None and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="refconv-watchdog", daemon=True)
            self._thread.start()

    def __call__(self, kind, comm, buffers, *, started=None, overlap="", call=None, nbytes=None, root=None,
                 peers=None, entry=None):
        """``with guard(kind, comm, buffers): <one MPI call>``; also the fault hook.  For the wait
        of a started call, ``started`` is when it was started and ``overlap`` what it ran behind
        (its fault point was its start: :class:`refconv.collectives.requests.Request`), and
        ``entry`` its entry in the rank's record.  ``call`` (MPI's name), ``nbytes`` (what every
        rank must agree on), ``root`` and ``peers`` go into the record (refconv.collectives.flight).
        On a simulated rank (refconv.simulated) there is no deadline: its world reports a hang itself."""
        if started is None:
            fault_point(kind, "collective")
        state = local.current()         # looked up once: this is on the path of every MPI call
        record = state.flight
        if record is not None:
            if entry is None:
                entry = record.begin(kind, call, comm, nbytes, root, peers)
            else:
                entry[flight.WAIT] = time.perf_counter()
            record.waiting = entry
        if self.timeout is not None and state.simulated is None:
            self.current = (kind, comm, buffers, time.monotonic(), self.timeout)
        return _Call(self, state, kind, started, overlap, entry)

    def _watch(self):
        while True:
            call = self.current
            limit = call[4] if call is not None else self.timeout or 20.0
            time.sleep(min(1.0, max(0.01, limit / 20)))     # fires within 5% of the deadline
            if call is not None and call is self.current and time.monotonic() - call[3] > call[4]:
                _abort_timed_out(*call)


class _Call:
    """One guarded MPI call of the rank whose ``state`` (``local.RankState``) it is: its times go to
    that rank's ``stats`` when it ends."""

    __slots__ = ("watchdog", "state", "kind", "overlap", "waited", "started", "entry")

    def __init__(self, watchdog, state, kind, started, overlap, entry):
        self.watchdog, self.state, self.kind, self.overlap, self.entry = watchdog, state, kind, overlap, entry
        self.waited = state.now()
        self.started = started if started is not None else self.waited

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        state = self.state
        if state.simulated is None:
            self.watchdog.current = None
        if self.entry is not None:
            self.entry[flight.END] = time.perf_counter()
            if exc[0] is not None:
                self.entry[flight.ERROR] = exc[0].__name__
            state.flight.waiting = None
        ended = state.arrived()
        state.stats.add_seconds(self.kind, max(0.0, ended - self.waited))  # time per kind, for refconv bench
        state.stats.add_event(self.kind, self.overlap, self.started, self.waited, ended)  # for a timeline


def _abort_timed_out(kind, comm, buffers, started, timeout):
    world = MPI.COMM_WORLD
    waited = time.monotonic() - started
    line = (f"[rank {world.Get_rank()}] refconv: collective timeout: {kind} on communicator "
            f"{comm.Get_name()!r} ({comm.Get_size()} ranks) with {_describe(buffers)}: "
            f"this rank waited {waited:.1f} s (timeout {timeout:g} s); aborting the job")
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    flight.write("timeout", line)
    time.sleep(LINE_GRACE_S)         # mpiexec may drop output still in flight when the abort lands
    world.Abort(EXIT_TIMEOUT)


def _describe(buffers):
    """'send (4, 6) float32, recv (8, 6) float32' from {role: array, or {rank: array}, or shape}."""
    def one(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(a)}" for k, a in sorted(v.items())) + "}"
        if isinstance(v, (list, tuple)) and v and hasattr(v[0], "shape"):
            return "[" + ", ".join(one(a) for a in v) + "]"
        if hasattr(v, "shape"):
            return f"{tuple(v.shape)} {v.dtype}"
        return repr(v)
    return ", ".join(f"{role} {one(v)}" for role, v in buffers.items())


guard = Watchdog()
guard.set(env_timeout(DEFAULT_TIMEOUT_S if MPI.COMM_WORLD.Get_size() > 1 else None))
if MPI.COMM_WORLD.Get_size() > 1:
    flight.install(local.process_state().flight, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())


def set_timeout(seconds):
    """Deadline of every later MPI call made through refconv.collectives: seconds > 0, or
    None (also 0) for none.  Set it alike on every rank.  A simulated rank keeps its own setting
    (its world reports hangs itself: nothing is armed)."""
    seconds = _check_timeout(seconds)
    state = local.current()
    if state.simulated is not None:
        state.timeout = seconds
    else:
        guard.set(seconds)


def get_timeout():
    """The current deadline in seconds, or None (a simulated rank's own setting there)."""
    state = local.current()
    return state.timeout if state.simulated is not None else guard.timeout


@contextlib.contextmanager
def timeout(seconds):
    """``with collectives.timeout(30): ...`` sets the deadline inside the block only."""
    before = get_timeout()
    set_timeout(seconds)
    try:
        yield
    finally:
        set_timeout(before)
