"""What refconv.collectives keeps per rank, and which rank is calling.

Under ``mpiexec`` a rank is a process, and its state is the process's.  On simulated ranks
(:mod:`refconv.simulated`: K ranks as threads of one process) each rank thread binds its own
:class:`RankState`, so that every rank counts its own calls (``stats``), records its own last calls
(``flight``), keeps its own calls in flight (``requests.progress``) and meets its own
injected fault, exactly as a process would.

``stats`` is the calling rank's :class:`refconv.collectives.recording.CommStats`, looked up at each
use: ``collectives.stats.recording()`` on a simulated rank records that rank's calls only.
"""

import threading
import time

from mpi4py import MPI

from refconv.collectives.flight import FlightRecord, env_capacity
from refconv.collectives.recording import CommStats

UNREAD = object()  # a rank's fault before REFCONV_FAULT is read (refconv.collectives.faults)


class RankState:
    """One rank's state in refconv.collectives.

    ``simulated`` is the rank's handle in a simulated world (``refconv.simulated``), None for the
    process of an MPI rank.  ``clock`` is its logical clock when the run prices time (else None):
    then ``now()`` reads it instead of the wall clock.
    """

    def __init__(self, simulated=None, clock=None):
        self.stats = CommStats()
        self.in_flight = set()   # the Requests started and not yet finished (requests.progress)
        self.fault = UNREAD      # the fault this rank injects (faults.set_fault), read when first needed
        self.simulated = simulated
        self.clock = clock
        self.timeout = None      # a simulated rank's deadline setting (collectives.set_timeout); unused under MPI
        capacity = env_capacity()
        self.flight = FlightRecord(capacity) if capacity else None   # its last calls (collectives.flight)
        self.memory = None       # the rank's refconv.shapes.memory.Tracker while it tracks shapes-only arrays

    def now(self):
        """Seconds on this rank's clock: the logical clock of a priced run, else ``time.perf_counter()``."""
        return self.clock.now() if self.clock is not None else time.perf_counter()

    def arrived(self):
        """When the calls this rank just completed finished: now, but on a priced run, where a call
        that arrived while the rank computed finished before the rank came to wait for it."""
        return self.clock.arrival if self.clock is not None else time.perf_counter()


class _Thread(threading.local):
    state = None    # a class attribute: a thread that bound nothing reads None, no exception raised


_PROCESS = RankState()
_THREAD = _Thread()


def process_state():
    """The process's own state (an MPI rank's), whichever thread asks."""
    return _PROCESS


def current():
    """The calling rank's state: the simulated rank this thread runs, else the process's.  On the
    path of every collective call: two attribute reads."""
    return _THREAD.state or _PROCESS


def bind(state):
    """Make ``state`` the calling thread's rank state (None: back to the process's)."""
    _THREAD.state = state


def simulated():
    """The calling thread's simulated rank (``refconv.simulated``), or None on a real MPI rank."""
    return current().simulated


def comm_self():
    """This rank alone: ``MPI.COMM_SELF``, or on a simulated rank its own one-rank communicator."""
    sim = simulated()
    return MPI.COMM_SELF if sim is None else sim.comm_self()


def now():
    """The calling rank's clock (:meth:`RankState.now`)."""
    return current().now()


def priced(what, *args):
    """On a priced simulated rank, advance its logical clock by the machine file's price of ``what``
    (``"conv"``: a local convolution pass; ``"layer"``: a layer's other work; the arguments of
    :class:`refconv.simulated.clock.Clock`'s method of that name).  Elsewhere nothing."""
    clock = current().clock
    if clock is not None:
        getattr(clock, what)(*args)


class RankStats:
    """``collectives.stats``: every attribute is the calling rank's CommStats'."""

    def __getattribute__(self, name):   # every name, directly: no failed lookup first (a hot path)
        return getattr(current().stats, name)

    def __repr__(self):
        return f"<the calling rank's {current().stats!r}>"


stats = RankStats()


def check_comm(comm, what):
    """``comm``, once it is known to belong to the calling rank's world: a simulated rank must
    use its world's communicators (``MPI.COMM_WORLD`` read there is the rank's world, but one bound
    before the run is the pytest process's one rank, a silent wrong answer), and a simulated
    communicator works only on its own ranks."""
    on_simulated_rank = simulated() is not None
    if getattr(comm, "simulated", False) != on_simulated_rank:
        if on_simulated_rank:
            raise RuntimeError(f"{what}: {_mpi_name(comm)} used on simulated rank {simulated().rank}: inside "
                               f"refconv.simulated.run use the communicator the rank function was given "
                               f"(or MPI.COMM_WORLD read there, refconv.simulated.comm_world(); "
                               f"collectives.comm_self() for this rank alone), never an MPI communicator "
                               f"bound before the run")
        raise RuntimeError(f"{what}: the simulated communicator {comm!r} used outside its world's rank "
                           f"threads: call it only inside the function refconv.simulated.run runs")
    return comm


_PROCESS_COMMS = {"COMM_WORLD": MPI.COMM_WORLD, "COMM_SELF": MPI.COMM_SELF}   # mpi4py's own: read before any
# simulated world runs (while one does, MPI.COMM_WORLD read on a rank is that rank's world: refconv.simulated.standins)


def _mpi_name(comm):
    for name, process_comm in _PROCESS_COMMS.items():
        try:
            if comm == process_comm:
                return (f"MPI.{name} bound before the run (the process's, one rank: a default argument, a global, "
                        f"a 'from mpi4py.MPI import {name}')" if name == "COMM_WORLD" else f"MPI.{name}")
        except Exception:       # not an MPI communicator at all
            break
    return f"the MPI communicator {comm!r}"
