"""mpi4py's own names on a simulated rank: ``MPI.COMM_WORLD``, ``MPI.Request``, ``MPI.Win`` and ``MPI.Op``.

While a world runs (:func:`installed`, which :func:`refconv.simulated.run` enters), these four
names leave the ``mpi4py.MPI`` module's dictionary and the module's ``__getattr__`` answers for
them, thread by thread:

==================  ==========================================  =================================
name                on a simulated rank's thread                on any other thread
==================  ==========================================  =================================
``COMM_WORLD``      the rank's world communicator (what ``run``  mpi4py's own
                    gave its function): every rank of the world
``Request``         :class:`RankRequest`: ``Waitall``,           mpi4py's own
                    ``Testall``, ``Waitany``, ``Testany``,
                    ``Waitsome``, ``Testsome`` complete
                    simulated requests (mpi4py's own take only
                    its own)
``Win``             :class:`RankWin`: a window on a simulated    mpi4py's own
                    communicator is refused by name
                    (:class:`refconv.simulated.world.Unsupported`)
``Op``              :class:`RankOp`: ``Op.Create`` makes         mpi4py's own
                    mpi4py's own op and records it with its
                    line, so that one never freed is a
                    ``ResourceLeak`` (:mod:`refconv.simulated.leaks`)
==================  ==========================================  =================================

So ``MPI.COMM_WORLD.Allreduce(...)`` on a simulated rank reduces over every simulated rank, as
it would under ``mpiexec``, and ``comm is MPI.COMM_WORLD`` holds there for the rank's world
communicator.  The names come back when the last world running ends.  What a lookup cannot reach:
an object bound before the run (``from mpi4py.MPI import COMM_WORLD`` at a module's top, a default
argument ``comm=MPI.COMM_WORLD``) is mpi4py's own, the process's one rank.  refconv's collective
wrappers refuse it by name (:func:`refconv.collectives.check_comm`); a raw call on it is not seen.
"""

import threading

from mpi4py import MPI

from refconv.collectives import local
from refconv.simulated import leaks
from refconv.simulated.comm import Request as SimulatedRequest
from refconv.simulated.world import SimulatedError, Unsupported, current_rank, persistent

NAMES = ("COMM_WORLD", "Request", "Win", "Op")
REAL = {name: getattr(MPI, name) for name in NAMES}   # mpi4py's own, read once, before any world runs
_lock = threading.Lock()
_worlds = 0          # worlds running now (several threads may each run one)
_previous = [None]   # the module's own __getattr__ while ours stands in


class installed:
    """``with installed():`` the module's four names answer by thread (see the module's table)."""

    def __enter__(self):
        global _worlds
        with _lock:
            if _worlds == 0:
                _previous[0] = vars(MPI).get("__getattr__")   # none in mpi4py 4.1; kept should one come
                MPI.__getattr__ = _lookup     # first, so that no thread ever finds the names missing
                for name in NAMES:
                    delattr(MPI, name)
            _worlds += 1
        return self

    def __exit__(self, *exc):
        global _worlds
        with _lock:
            _worlds -= 1
            if _worlds == 0:
                for name, obj in REAL.items():
                    setattr(MPI, name, obj)
                if _previous[0] is None:
                    del MPI.__getattr__
                else:
                    MPI.__getattr__ = _previous[0]


def _lookup(name):
    """``mpi4py.MPI``'s module ``__getattr__`` while a world runs: only the four names reach it."""
    obj = REAL.get(name)
    if obj is None:
        if _previous[0] is not None:
            return _previous[0](name)
        raise AttributeError(f"module 'mpi4py.MPI' has no attribute {name!r}")
    sim = local.simulated()
    if sim is None:
        return obj
    return sim.comm if name == "COMM_WORLD" else ON_RANKS[name]


class _OnRanks(type):
    """``isinstance(x, MPI.Request)`` on a rank: a request of mpi4py's or of the simulated world."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.__mro__[1]) or isinstance(obj, cls.simulated)


class RankRequest(REAL["Request"], metaclass=_OnRanks):
    """``MPI.Request`` on a simulated rank: its class methods complete simulated requests in the
    simulated world, and hand a list of mpi4py's own to mpi4py."""

    simulated = SimulatedRequest

    Waitall = classmethod(lambda cls, requests, statuses=None: _either("Waitall", requests, statuses))
    Testall = classmethod(lambda cls, requests, statuses=None: _either("Testall", requests, statuses))
    Waitany = classmethod(lambda cls, requests, status=None: _either("Waitany", requests, status))
    Testany = classmethod(lambda cls, requests, status=None: _either("Testany", requests, status))

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        """The indices of the requests done once at least one is (None when none is active)."""
        sims = _simulated(requests, "Waitsome")
        if sims is None:
            return REAL["Request"].Waitsome(requests, statuses)
        first = SimulatedRequest.Waitany(sims)          # the simulated world's own completion: blocks for one
        if first == MPI.UNDEFINED:
            return None
        return [first] + [i for i, r in enumerate(sims) if i != first and not r.completed and r.Test()]

    @classmethod
    def Testsome(cls, requests, statuses=None):
        sims = _simulated(requests, "Testsome")
        if sims is None:
            return REAL["Request"].Testsome(requests, statuses)
        active = [i for i, r in enumerate(sims) if not r.completed]
        return [i for i in active if sims[i].Test()] if active else None

    @classmethod
    def Startall(cls, requests):
        if _simulated(requests, "Startall") is None:
            return REAL["Request"].Startall(requests)
        raise persistent("MPI.Request.Startall")


def _either(call, requests, status):
    """``MPI.Request.<call>`` on a rank: simulated requests complete in the simulated world
    (:class:`refconv.simulated.request.Request`'s own class method), a list of mpi4py's own in mpi4py."""
    sims = _simulated(requests, call)
    return getattr(REAL["Request"] if sims is None else SimulatedRequest, call)(requests if sims is None else sims,
                                                                                 status)


def _simulated(requests, call):
    """The simulated requests in ``requests``; None when every one is mpi4py's own."""
    requests = list(requests)
    kinds = {isinstance(r, SimulatedRequest) for r in requests}
    if kinds != {True}:
        if True in kinds:
            raise SimulatedError(f"MPI.Request.{call}: the list mixes simulated requests with mpi4py's own "
                                 f"({', '.join(type(r).__name__ for r in requests)}); complete each kind apart")
        return None
    return requests


class RankWin(REAL["Win"], metaclass=_OnRanks):
    """``MPI.Win`` on a simulated rank: a window on a simulated communicator is refused by name."""

    simulated = ()

    @classmethod
    def Create(cls, *args, **kwargs):
        return _window("Create", args, kwargs)

    @classmethod
    def Allocate(cls, *args, **kwargs):
        return _window("Allocate", args, kwargs)

    @classmethod
    def Allocate_shared(cls, *args, **kwargs):
        return _window("Allocate_shared", args, kwargs)

    @classmethod
    def Create_dynamic(cls, *args, **kwargs):
        return _window("Create_dynamic", args, kwargs)


def _window(call, args, kwargs):
    if any(getattr(a, "simulated", False) is True for a in (*args, *kwargs.values())):
        raise Unsupported(f"MPI.Win.{call} on simulated rank {current_rank('MPI.Win').rank}: one-sided "
                          f"communication (MPI.Win) is not simulated; run it under mpiexec")
    return getattr(REAL["Win"], call)(*args, **kwargs)


class RankOp(REAL["Op"], metaclass=_OnRanks):
    """``MPI.Op`` on a simulated rank: ``Create`` makes mpi4py's own user-defined op (a real ``MPI.Op``, so
    ``isinstance`` and the reductions see no difference) and records it, with the line that made it, in the
    world's leak ledger: one not freed (``op.Free()``) when the run ends is a ``ResourceLeak``."""

    simulated = ()

    @classmethod
    def Create(cls, function, commute=False):
        op = REAL["Op"].Create(function, commute)
        me = local.simulated()
        if me is not None:
            leaks.made(me, op, "op", "Op.Create")
        return op


ON_RANKS = {"Request": RankRequest, "Win": RankWin, "Op": RankOp}
