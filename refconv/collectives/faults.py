"""Fault injection for tests: ``REFCONV_FAULT=rank:point:action[:n]``.

World rank ``rank`` ``kill``s (SIGKILL), ``stop``s (SIGSTOP), ``raise``s
(:class:`FaultInjected`), ``exit``s (``sys.exit(0)``) or ``osexit``s (``os._exit(0)``)
itself the ``n``-th time (default 1) it reaches ``point``:

- ``startup``: the start of a ``refconv`` command (``refconv.cli.main``);
- a collective kind, just before its MPI call: ``allreduce``, ``reduce_scatter``,
  ``allgather``, ``halo``, ``alltoallv``, ``bcast``, ``scatter``, ``gather``,
  ``barrier``, ``object``, ``split`` (a call started without waiting, ``iallreduce_`` and the
  others that return a Request, just after MPI took it: its wait may never come, where
  ``progress()`` finished it);
- ``collective``: any of them, so ``n`` counts every MPI call of the run;
- a point of a checkpoint save (``refconv.checkpoint.FAULT_POINTS``).

Importing this module reads nothing: the variable is read the first time a point
is reached (or ``set_fault`` sets the fault instead).  Unset, a point costs two
tests.  On simulated ranks (:mod:`refconv.simulated`) ``rank`` is the simulated
rank and each rank keeps its own fault; ``kill``, ``stop`` and ``osexit`` need a
process per rank and raise NotImplementedError there.
"""

import os
import signal
import sys

from mpi4py import MPI

from refconv.collectives import local


class FaultInjected(RuntimeError):
    """Raised by the ``raise`` action of REFCONV_FAULT."""


class Fault:
    ACTIONS = ("kill", "stop", "raise", "exit", "osexit")

    def __init__(self, spec):
        parts = spec.split(":")
        try:
            rank, self.point, self.action = int(parts[0]), parts[1], parts[2]
            self.nth = int(parts[3]) if len(parts) == 4 else 1
        except (IndexError, ValueError):
            rank = None
        if rank is None or len(parts) > 4 or self.action not in self.ACTIONS or self.nth < 1:
            raise ValueError(f"REFCONV_FAULT: expected rank:point:action[:n] with action in "
                             f"{self.ACTIONS} and n >= 1, e.g. 1:allreduce:stop:3; got {spec!r}")
        self.mine = rank == _world_rank()
        self.count = 0

    def reached(self, *points):
        """Count this visit of ``points`` (e.g. "allreduce", "collective"); act on the n-th."""
        if not self.mine or self.point not in points:
            return
        self.count += 1
        if self.count != self.nth:
            return
        where = f"{self.point} (visit {self.nth}) on rank {_world_rank()}"
        sys.stderr.write(f"REFCONV_FAULT: {self.action} at {where}\n")     # tests time the end from here
        sys.stderr.flush()
        if self.action == "raise":
            raise FaultInjected(f"REFCONV_FAULT: injected at {where}")
        if self.action == "exit":
            sys.exit(0)
        if local.simulated() is not None:   # a thread cannot be killed, stopped or os._exit alone
            raise NotImplementedError(f"REFCONV_FAULT: {self.action!r} needs a rank of its own process: "
                                      f"on simulated ranks use 'raise' or 'exit', or run under mpiexec")
        if self.action == "osexit":
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)


def _world_rank():
    """This rank's place in the world: the simulated rank, else ``MPI.COMM_WORLD``'s."""
    sim = local.simulated()
    return sim.rank if sim is not None else MPI.COMM_WORLD.Get_rank()


def set_fault(spec):
    """Inject a fault like REFCONV_FAULT (``"rank:point:action[:n]"``), or None for none, on the
    calling rank (each simulated rank keeps its own, as each process does)."""
    local.current().fault = None if spec is None else Fault(spec)


def fault_point(*points):
    """A named point where REFCONV_FAULT may strike (the collectives, refconv.checkpoint)."""
    state = local.current()
    if state.fault is local.UNREAD:
        set_fault(os.environ.get("REFCONV_FAULT") or None)
    if state.fault is not None:
        state.fault.reached(*points)
