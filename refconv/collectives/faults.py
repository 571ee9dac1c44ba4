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
is reached (or ``set_fault`` sets the fault instead).  Unset, a point costs one
``is None`` test.
"""

import os
import signal
import sys

from mpi4py import MPI


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
        self.mine = rank == MPI.COMM_WORLD.Get_rank()
        self.count = 0

    def reached(self, *points):
        """Count this visit of ``points`` (e.g. "allreduce", "collective"); act on the n-th."""
        if not self.mine or self.point not in points:
            return
        self.count += 1
        if self.count != self.nth:
            return
        where = f"{self.point} (visit {self.nth}) on rank {MPI.COMM_WORLD.Get_rank()}"
        sys.stderr.write(f"REFCONV_FAULT: {self.action} at {where}\n")     # tests time the end from here
        sys.stderr.flush()
        if self.action == "raise":
            raise FaultInjected(f"REFCONV_FAULT: injected at {where}")
        if self.action == "exit":
            sys.exit(0)
        if self.action == "osexit":
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGSTOP)


class _Unread:
    """The fault before REFCONV_FAULT is read: the first point reached reads it."""

    def reached(self, *points):
        set_fault(os.environ.get("REFCONV_FAULT") or None)
        if _fault is not None:
            _fault.reached(*points)


_fault = _Unread()


def set_fault(spec):
    """Inject a fault like REFCONV_FAULT (``"rank:point:action[:n]"``), or None for none."""
    global _fault
    _fault = None if spec is None else Fault(spec)


def fault_point(*points):
    """A named point where REFCONV_FAULT may strike (the collectives, refconv.checkpoint)."""
    if _fault is not None:
        _fault.reached(*points)
