"""Ranks in one process: run a function on K simulated ranks, with MPI's semantics, no mpiexec.

::

    from refconv import simulated

    def body(comm):                                   # runs on every rank, as under mpiexec
        with refconv.ProcessGrid(comm, channel=comm.size) as grid:     # frees its sub-communicators at the end
            layer = refconv.DistConv2d(8, 8, 3, padding=1, grid=grid, algorithm="stationary-x")
            ...
            return layer.weight_grad

    grads = simulated.run(body, 4)                    # one result per rank, rank 0's first

Each rank is a thread with its own communicator (:class:`refconv.simulated.comm.Comm`, the
part of mpi4py's that refconv calls) and its own state in :mod:`refconv.collectives`
(``stats``, calls in flight, faults), so every algorithm, layer, model, training step,
checkpoint and ``records()`` runs on it unchanged: refconv's code cannot tell the
difference, and its collectives go through the same wrappers
(:mod:`refconv.collectives.ops`) as under mpiexec.

``run`` returns each rank's result, or raises.  When a rank raises, the others are released
at once (:class:`PeerFailed`) and ``run`` raises the lowest failing rank's own exception, with
a note that lists every rank's outcome.  A deadlock raises :class:`Deadlock` with each rank's
pending call and stack.  ``stepped=True`` runs one rank at a time, switching at communication
calls only (a debugger stops one rank with the others parked); ``machine=`` prices the run on a
logical clock (:mod:`refconv.simulated.clock`, imported only then: the simulator's core,
world, comm, engine and buffers, imports only :mod:`refconv.collectives`).  A run that returns warns once
(:class:`ResourceLeak`) about every communicator, group and derived datatype a rank made and did not free
(:mod:`refconv.simulated.leaks`).  docs/simulated-ranks.md says what is simulated and what is not.
"""

import ctypes
import sys
import time

from threadpoolctl import threadpool_limits

from refconv.collectives import local
from refconv.simulated import leaks, standins
from refconv.simulated.comm import Comm, Group
from refconv.simulated.engine import Calls
from refconv.simulated.leaks import ResourceLeak
from refconv.simulated.poison import poisoned
from refconv.simulated.schedules import MessageRace, explore, new_world
from refconv.simulated.world import (MAX_RANKS, BufferReused, CollectiveMismatch, Deadlock, FreedComm, InvalidParameter,
                                     PeerFailed, PendingRequests, RankStopped, SimulatedError, TypeMismatch,
                                     Unsupported, by_rank, current_rank, user_stack)

__all__ = ["run", "comm_world", "poisoned", "MAX_RANKS", "SimulatedError", "PeerFailed", "Deadlock",
           "CollectiveMismatch", "BufferReused", "RankStopped", "InvalidParameter", "FreedComm", "TypeMismatch",
           "PendingRequests", "Unsupported", "MessageRace", "ResourceLeak"]


def run(fn, ranks, *, args=(), kwargs=None, stepped=False, machine=None, timeout=None, schedules=None):
    """Run ``fn(comm, *args, **kwargs)`` on ``ranks`` simulated ranks; return their results as a list.

    ``comm`` is each rank's world communicator.  ``stepped``: one rank runs at a time, and the turn
    passes, in rank order, only at a communication call.  ``machine``: a machine file (a path, a
    built-in name such as ``"v100-edr"``, or a loaded :class:`refconv.pricing.machine.Machine`)
    that prices each rank's compute and calls on a logical clock; a priced run is stepped, so its
    times are the same on every run, and each result is then ``(value, clock)``
    (:class:`refconv.simulated.clock.Clock`).  ``timeout``: seconds after which a run still going
    (a rank computing forever: no deadlock the world can see) raises TimeoutError with each rank's
    stack, and stops the ranks still running (:class:`RankStopped`).  BLAS runs one thread per rank
    while the world runs.  ``schedules="all"``: run once per match order of the wildcard receives
    (stepped), up to 4 ranks; the results are then a list whose ``schedules`` attribute counts the
    orders explored, and orders with different results raise :class:`MessageRace`
    (:mod:`refconv.simulated.schedules`).
    """
    if schedules is not None:   # every match order of the wildcard receives, one run each
        return explore(run, fn, ranks, schedules, args=args, kwargs=kwargs, machine=machine, timeout=timeout)
    ranks = _check_ranks(ranks)
    if local.simulated() is not None:
        raise RuntimeError("refconv.simulated.run: called on a simulated rank; a world cannot run inside another")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"refconv.simulated.run: timeout must be seconds > 0 or None, got {timeout!r}")
    kwargs = kwargs or {}
    world = new_world(ranks, stepped=stepped or machine is not None)   # a ScheduledWorld while exploring
    clocks = _clocks(machine, world)
    group = Group(world, range(ranks), "world")
    for r in world.ranks:
        r.comm, r.world_calls, r.clock = Comm(group, r.rank, r), Calls(world, r), clocks[r.rank]

    def body(me):
        state = local.RankState(simulated=me, clock=me.clock)
        local.bind(state)
        try:
            if me.clock is None:
                result = fn(me.comm, *args, **kwargs)
            else:
                with state.stats.timeline() as me.clock.events:
                    result = fn(me.comm, *args, **kwargs), me.clock
            pending = me.world_calls.unfinished()
            if pending is not None:
                raise pending
            return result
        finally:
            local.bind(None)

    with threadpool_limits(limits=1), standins.installed():   # MPI.COMM_WORLD on a rank: its world
        world.start(body)
        _join(world, timeout)
    results = _outcome(world)
    leaks.report(world)      # refconv.simulated.leaks: what the ranks made and did not free (a run that succeeded)
    return results


def comm_world():
    """The calling simulated rank's world communicator (what ``run`` passed its function)."""
    return current_rank("refconv.simulated.comm_world").comm


def _check_ranks(ranks):
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise ValueError(f"refconv.simulated.run: ranks must be an int in [1, {MAX_RANKS}] (threads of one "
                         f"process; more belong under mpiexec), got {ranks!r}")
    return ranks


def _clocks(machine, world):
    if machine is None:
        return [None] * world.size
    from refconv.simulated.clock import clocks_for   # the pricing model and the layers: only for machine=

    return clocks_for(machine, world)


def _join(world, timeout):
    """Wait for every rank thread; a Ctrl-C or the timeout ends the world and reports each rank."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for r in world.ranks:
            while r.thread.is_alive():
                r.thread.join(0.1)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(_stacks(world, f"refconv.simulated.run: still running after {timeout:g} s"))
    except BaseException:
        with world.lock:
            if world.failure is None:
                world.failure = next((r for r in world.ranks if r.status == "running"), world.ranks[0])
                world.failure.error = world.failure.error or RuntimeError("the run was stopped from outside")
            world.notify()
        _stop(world)
        raise


def _stop(world):
    """Raise :class:`RankStopped` into every rank thread still running (CPython's
    ``PyThreadState_SetAsyncExc``): a rank computing forever ends at its next bytecode instead of
    taking the CPU from every later run.  A rank inside one long C call ends when it returns."""
    for r in world.ranks:
        if r.thread.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(r.thread.ident), ctypes.py_object(RankStopped))
    for r in world.ranks:
        r.thread.join(1.0)


def _stacks(world, headline):
    frames = sys._current_frames()
    lines = [headline]
    for r in world.ranks:
        lines.append(f"rank {r.rank}: {r.status}" + (f", waits in {r.waiting[1]()}" if r.waiting else ""))
        if r.status == "running":
            lines.extend("    " + line for line in user_stack(frames.get(r.thread.ident)))
    return "\n".join(lines)


def _outcome(world):
    """Every rank's result, or the exception that explains the run."""
    if world.deadlock is not None:
        raise Deadlock(world.deadlock)
    failed = [r for r in world.ranks if r.status == "failed"]
    if not failed:
        return [r.result for r in world.ranks]
    own = [r for r in failed if not isinstance(r.error, PeerFailed)]
    first = (own or failed)[0]
    error = first.error
    note = _summary(world)
    if hasattr(error, "add_note"):
        error.add_note(note)
        raise error
    raise SimulatedError(f"{type(error).__name__}: {error}\n{note}") from error   # Python 3.10: no notes


def _summary(world):
    """One line per rank: what it returned or raised."""
    entries = []
    for r in world.ranks:
        if r.status == "done":
            entries.append((r.rank, "returned", ()))
        elif isinstance(r.error, PeerFailed):   # its message names the rank already: "rank 3: released from ..."
            entries.append((r.rank, str(r.error).splitlines()[0].split(": ", 1)[-1], ()))
        else:
            entries.append((r.rank, f"raised {type(r.error).__name__}: {str(r.error).splitlines()[0] if str(r.error) else ''}", ()))
    return "\n".join([f"on {world.size} simulated ranks:"] + ["  " + line for line in by_rank(entries)])
