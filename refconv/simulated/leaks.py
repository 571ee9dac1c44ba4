"""Resources a simulated rank made and never freed: MPI's Resource Leak, reported when the run ends.

A communicator, a group or a derived datatype belongs to the rank that made it until it frees it
(``Free()``).  Under MPI a forgotten one costs memory on every step that makes another, and a
real job runs out of communicator ids after a few thousand; on simulated ranks
:func:`refconv.simulated.run` reports every one still held when the run returned, in one
:class:`ResourceLeak` warning (a ``UserWarning``), one line per object::

    rank 2: communicator 'world/split 0' (Split), made at my_test.py:14
    rank 2: group of 2 ranks (Incl), made at my_test.py:15

What is seen, and how:

===========================  ======================================================================
object                       seen
===========================  ======================================================================
communicator                 made by the simulated world (``Split``, ``Split_type``, ``Dup``,
                             ``Create``, ``Create_group``): recorded where it is made, crossed off
                             at its ``Free()``
group                        made by the simulated world (``Get_group``, ``Incl``, ``Excl``,
                             ``Union``, ``Intersection``, ``Difference``): the same
user-defined op              a real mpi4py object made by ``MPI.Op.Create``, which answers on a
                             rank's thread (:mod:`refconv.simulated.standins`): recorded where it
                             is made, a leak if not freed (its handle not ``OP_NULL``) at the end
derived datatype             a real mpi4py object, made by MPI itself (``Create_contiguous``,
                             ``Create_vector``, ``Create_indexed``, ``Create_struct``, ...), where
                             the simulator cannot see it: it is recorded when the rank first hands
                             it to a simulated call, with that call's line ("first used at"), and
                             is a leak if it is not freed (mpi4py then holds ``DATATYPE_NULL``) when
                             the run ends
===========================  ======================================================================

The limit, beside MUST's (which wraps ``MPI_Type_create_*`` in the MPI library itself): a derived
datatype made on a simulated rank and never used in a call is not seen, and a datatype is named by
its first use, not its creation.  Predefined objects (the world communicator, ``comm_self()``,
``MPI.DOUBLE``) are never leaks, and neither is anything a run that failed left behind: the
failure is the report.

A "where" is the innermost frame outside refconv (the user's own line), with the refconv line that
made the object beside it when refconv made it (a :class:`refconv.grid.ProcessGrid`'s
sub-communicator: close the grid, or the model that holds it, with ``close()`` or ``with``).
"""

import functools
import os
import sys
import warnings

from mpi4py import MPI

from refconv.collectives import local
from refconv.simulated.world import by_rank

_SIMULATED = os.path.dirname(os.path.abspath(__file__))
_REFCONV = os.path.dirname(_SIMULATED)
_SKIPPED = (_SIMULATED, os.path.join(_REFCONV, "collectives"))   # the simulator, and the wrappers a call goes through


class ResourceLeak(UserWarning):
    """Communicators, groups, datatypes or ops a simulated rank made and had not freed when its run ended."""


class Entry:
    """One object a rank made: what it is, by which call, and where; ``freed`` once it is."""

    __slots__ = ("obj", "rank", "kind", "call", "where", "freed")

    def __init__(self, obj, rank, kind, call, where):
        self.obj, self.rank, self.kind, self.call, self.where = obj, rank, kind, call, where
        self.freed = False

    def held(self):
        """Still held when the run ended? (A datatype or an op is freed when mpi4py's handle is null.)"""
        return bool(self.obj) if self.kind in ("datatype", "op") else not self.freed

    def line(self):
        """``communicator 'channel' (Split), made at test_x.py:12``: the name as it is at the report."""
        if self.kind == "communicator":
            return f"communicator {self.obj.group.name!r} ({self.call}), made at {self.where}"
        if self.kind == "group":
            n = len(self.obj.members)
            return f"group of {n} rank{'' if n == 1 else 's'} ({self.call}), made at {self.where}"
        if self.kind == "op":
            return f"op ({self.call}), made at {self.where}"
        return f"datatype {self.call}, first used at {self.where}"


def ledger(world):
    """``{id(obj): Entry}``: every object the ranks of ``world`` made (each kept, so no id is reused), made at
    the first entry; ``dict.setdefault`` is one step, so two ranks making the first objects at once share it."""
    return world.__dict__.get("leak_ledger") or world.__dict__.setdefault("leak_ledger", {})


def made(owner, obj, kind, call):
    """Rank ``owner`` (a :class:`refconv.simulated.world.Rank`) made ``obj`` of ``kind`` with ``call``: record
    it and where."""
    ledger(owner.world)[id(obj)] = Entry(obj, owner.rank, kind, call, where(sys._getframe(1)))


def freed(owner, obj):
    """``obj`` was freed (a second ``Free`` finds it crossed off already)."""
    entry = ledger(owner.world).get(id(obj))
    if entry is not None and entry.obj is obj:
        entry.freed = True


def makes(call):
    """Decorate a Comm method that returns a new communicator (or ``MPI.COMM_NULL``): record it."""
    def decorate(method):
        @functools.wraps(method)
        def making(comm, *args, **kwargs):
            return comm_made(comm.owner, method(comm, *args, **kwargs), call)
        return making
    return decorate


def comm_made(owner, new, call):
    """Record the communicator ``new`` that ``call`` made on ``owner`` (nothing for ``MPI.COMM_NULL``); return it."""
    if getattr(new, "simulated", False):
        made(owner, new, "communicator", call)
    return new


def frees(method):
    """Decorate ``Comm.Free``: once the communicator is freed, it is crossed off."""
    @functools.wraps(method)
    def freeing(comm, *args, **kwargs):
        result = method(comm, *args, **kwargs)
        freed(comm.owner, comm)
        return result
    return freeing


def datatype_used(datatype):
    """A simulated call was handed ``datatype``: a derived mpi4py datatype is recorded at its first use."""
    if isinstance(datatype, MPI.Datatype) and datatype is not MPI.BYTE and not datatype.is_predefined:
        me = local.simulated()
        if me is not None and id(datatype) not in ledger(me.world):
            made(me, datatype, "datatype", _datatype_label(datatype))


def _datatype_label(datatype):
    """``(vector, 24 bytes)``: how the datatype was made (its MPI combiner) and its size."""
    try:
        combiner = next((name[len("COMBINER_"):].lower() for name in dir(MPI) if name.startswith("COMBINER_")
                         and getattr(MPI, name) == datatype.combiner), "derived")
        return f"({combiner}, {datatype.Get_size()} bytes)"
    except MPI.Exception:       # freed before its first use: its handle says nothing
        return "(freed)"


def report(world, stacklevel=3):
    """Warn once (:class:`ResourceLeak`) about every object of ``world`` still held, by rank."""
    held = sorted((e for e in world.__dict__.get("leak_ledger", {}).values() if e.held()), key=lambda e: e.rank)
    if not held:
        return
    lines = by_rank([(e.rank, e.line(), ()) for e in held])
    noun = "object" if len(held) == 1 else "objects"
    warnings.warn(ResourceLeak(
        f"refconv.simulated.run: {len(held)} {noun} made on simulated ranks and not freed when the run ended "
        f"(MPI's Resource Leak): free each (comm.Free(), group.Free(), datatype.Free(), op.Free()), or close what made it "
        f"(ProcessGrid.close(), Model.close(), or a with block)\n" + "\n".join(lines)), stacklevel=stacklevel)


def where(frame):
    """``file:line`` of the innermost frame outside refconv, with the innermost refconv line beside it (past
    the simulator and the collectives' wrappers) when refconv itself made the object:
    ``test_x.py:12 (refconv/grid.py:164)``."""
    inner = user = None
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIPPED):
            if inner is None:
                inner = frame
            if not path.startswith(_REFCONV):
                user = frame
                break
        frame = frame.f_back
    first = user or inner
    if first is None:
        return "an unknown line"
    text = _place(first)
    return text if inner is None or inner is first else f"{text} ({_place(inner)})"


def _place(frame):
    path = frame.f_code.co_filename
    if path.startswith(os.path.dirname(_REFCONV) + os.sep):
        path = os.path.relpath(path, os.path.dirname(_REFCONV))
    return f"{path}:{frame.f_lineno}"
