"""A world of K simulated ranks in one process: the rank threads, who runs when, and what ends a run.

Every rank is a thread running the same function with its own communicator
(:class:`refconv.simulated.comm.Comm`) and its own state in refconv.collectives
(:mod:`refconv.collectives.local`).  One lock (``World.lock``) guards everything the
ranks share: the calls posted on each communicator, the messages not yet received, each rank's
status.  A call that completes other ranks' calls (the last rank entering a collective, a send
meeting its receive) moves the data in the caller's thread and wakes the others.

The cost of one collective to the simulator is linear in its members, not quadratic in the world:
each rank parks on its own condition (``Rank.cond``, on the world's lock) and a completion wakes only
the ranks it completes; a counter of blocked ranks gates the deadlock scan (it runs only when every
live rank is blocked); in stepped mode the turn passes to one rank, found in a bitmask of the runnable
ranks.  tests/simulator/test_scheduler_counts.py counts the wakeups and scans.

Two schedules:

- **free** (the default): the rank threads run at once, as processes would (NumPy releases the
  GIL in its kernels);
- **stepped**: one rank runs at a time and the turn passes only at a communication call, to the
  next rank in rank order that can run.  Then ``breakpoint()`` in rank 1 stops there with every
  other rank parked, and a run is the same to the instruction each time.

A run never hangs:

- when a rank raises, every rank blocked in a call is released at once, and every other rank
  at its next call, each with :class:`PeerFailed`, which names the failing rank and carries its
  traceback;
- when every live rank is blocked and no call can complete them, the world reports a
  :class:`Deadlock` at once: for each rank its pending call (operation, communicator, peer, tag)
  and its Python stack.
"""

import os
import sys
import threading
import traceback

from refconv.collectives import local

MAX_RANKS = 1024  # threads of one process; a larger world belongs under mpiexec
BIG_WORLD = 256   # above this many ranks each rank thread gets a STACK_BYTES stack, not the default (often 8 MiB)
STACK_BYTES = 1 << 20  # virtual memory only (9.6 -> 2.2 GB at 1024 ranks); Python-to-Python calls use no C stack
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE) + os.sep                       # refconv/
_MACHINERY = (_HERE + os.sep, _PACKAGE + "collectives" + os.sep, _PACKAGE + "shapes" + os.sep)


class SimulatedError(RuntimeError):
    """An error the simulated world itself raises on a rank."""


class PeerFailed(SimulatedError):
    """This rank was released from a call (or stopped at its next one) because another rank failed."""


class Deadlock(SimulatedError):
    """Every live rank waits for a call that no rank can complete."""


class CollectiveMismatch(SimulatedError):
    """The ranks of a communicator called different collectives at the same place in their order."""


class RankStopped(SimulatedError):
    """Raised into a rank thread still running when its run timed out or was interrupted."""


class BufferReused(SimulatedError):
    """A buffer handed to a nonblocking call was changed before its request completed."""


class InvalidParameter(SimulatedError, ValueError):
    """A parameter MPI would reject (a root, rank, peer, tag, colour, op, count or datatype out of its
    range): the message names the call, the parameter, the rank and the allowed range."""


class FreedComm(InvalidParameter):
    """A call on a communicator after its ``Free()``."""


class TypeMismatch(SimulatedError, ValueError):
    """A sender's and a receiver's type signatures differ, or a message is longer than its receive
    buffer (MPI_ERR_TRUNCATE); the message names both ranks."""


class PendingRequests(SimulatedError):
    """A rank's function returned with requests it never completed (each named, with the call and the
    line that started it)."""


class Unsupported(SimulatedError, NotImplementedError):
    """A feature of MPI the simulated world does not simulate, by name."""


def persistent(call):
    """The refusal of a persistent request (``Comm.Send_init``, ``Recv_init``, ``MPI.Request.Startall``, ...)."""
    return Unsupported(f"{call}: persistent requests are not simulated; post Isend/Irecv each time, or run "
                       f"it under mpiexec")


class Rank:
    """The world's record of one rank, and the rank's handle (``local.simulated()``)."""

    def __init__(self, world, rank):
        self.world, self.rank = world, rank
        self.status = "new"        # running, done, failed
        self.blocked = False       # counted in world.blocked: waiting and not done
        self.cond = None           # this rank's own condition on the world's mutex
        self.waiting = None        # while blocked: (done, describe), two callables
        self.thread = None
        self.result = self.error = None
        self.clock = None          # refconv.simulated.clock.Clock on a priced run
        self.comm = None           # the rank's world communicator
        self._self = None

    def comm_self(self):
        """This rank's one-rank communicator (what ``MPI.COMM_SELF`` is to a process), made once."""
        if self._self is None:
            self._self = self.comm.self_comm()
        return self._self

    def __repr__(self):
        return f"<simulated rank {self.rank} of {self.world.size}>"


class World:
    """K ranks and the lock they share; :func:`refconv.simulated.run` makes one per run."""

    def __init__(self, size, *, stepped=False):
        self.size, self.stepped = size, stepped
        self._mutex = threading.Lock()
        self.lock = threading.Condition(self._mutex)
        self.ranks = [Rank(self, r) for r in range(size)]
        for r in self.ranks:
            r.cond = threading.Condition(self._mutex)
        self.live, self.blocked = size, 0
        self.runnable = (1 << size) - 1   # bit r: rank r is running and not blocked
        self.failure = None        # the first rank that failed by itself (not released)
        self.deadlock = None       # the Deadlock report, once found
        self.turn = 0              # stepped: the rank that may run
        self._ids = 0

    def next_id(self):
        self._ids += 1
        return self._ids

    # -- the rank threads --------------------------------------------------------------------
    def start(self, body):
        """Start one thread per rank running ``body(rank)`` (a :class:`Rank`)."""
        for r in self.ranks:
            r.status = "running"
            r.thread = threading.Thread(target=self._main, args=(r, body), name=f"simulated rank {r.rank}",
                                        daemon=True)
        old = threading.stack_size(STACK_BYTES) if self.size > BIG_WORLD else None
        try:
            for r in self.ranks:
                r.thread.start()
        finally:
            if old is not None:
                threading.stack_size(old)

    def _main(self, me, body):
        try:
            if self.stepped:
                with self.lock:
                    self._await_turn(me)
            me.result = body(me)
        except BaseException as exc:  # noqa: B036 -- a rank's SystemExit or KeyboardInterrupt ends it, not the world
            with self.lock:
                me.error, me.status = exc, "failed"
                if self.failure is None and not isinstance(exc, (PeerFailed, Deadlock, RankStopped)):
                    self.failure = me
                self._rank_left(me)
        else:
            with self.lock:
                me.status = "done"
                self._rank_left(me)

    def _rank_left(self, me):
        """A rank ended: the others may now be deadlocked; in stepped mode the turn moves on."""
        self.live -= 1
        self.runnable &= ~(1 << me.rank)
        if self.failure is None and self.deadlock is None and self.live and self.blocked == self.live and self._deadlocked():
            self._report_deadlock(None)
        if self.ended():
            self._wake_all()
        elif self.stepped:
            self._pass_turn(me)

    def ended(self):
        return self.failure is not None or self.deadlock is not None

    # -- a rank's calls ------------------------------------------------------------------------
    def check(self, me, doing):
        """Raise on ``me`` if the world has ended (a failure elsewhere, a deadlock).  Under the lock."""
        if self.deadlock is not None:
            raise Deadlock(self.deadlock)
        if self.failure is not None and self.failure is not me:
            f = self.failure
            tb = "".join(traceback.format_exception(type(f.error), f.error, f.error.__traceback__))
            raise PeerFailed(f"rank {me.rank}: released from {doing} because rank {f.rank} failed with "
                             f"{type(f.error).__name__}: {f.error}\n--- rank {f.rank}'s traceback ---\n{tb}")

    def switch(self, me):
        """The end of a communication call: in stepped mode the next rank that can run takes the turn.
        Once the world has ended the ranks unwind at once, each at its next call."""
        if not self.stepped or self.ended():
            return
        with self.lock:
            self._pass_turn(me)
            self._await_turn(me)

    def block(self, me, done, describe):
        """Wait until ``done()`` (under the lock) is true; raise if the world ends first or if every
        live rank is blocked.  ``describe()`` says what ``me`` waits for, for the reports."""
        with self.lock:
            while True:
                if done():              # a call that completed is not released: its rank goes on
                    if me.blocked:
                        me.blocked = False
                        self.blocked -= 1
                        self.runnable |= 1 << me.rank
                    me.waiting = None
                    return
                self.check(me, describe())
                me.waiting = (done, describe)
                if not me.blocked:
                    me.blocked = True
                    self.blocked += 1
                    self.runnable &= ~(1 << me.rank)
                if self.blocked == self.live and self._deadlocked():
                    self._report_deadlock(me)
                    raise Deadlock(self.deadlock)
                if self.stepped:
                    self._pass_turn(me)
                    self._await_turn(me)
                else:
                    me.cond.wait()

    def notify(self, owners=None):
        """Something completed: wake the ranks it completes (under the lock); None: every rank."""
        if owners is None:
            self._wake_all()
            return
        for o in owners:
            if o.blocked and o.waiting is not None and o.waiting[0]():
                o.blocked = False
                self.blocked -= 1
                self.runnable |= 1 << o.rank
                if not self.stepped:
                    o.cond.notify()

    def _wake_all(self):
        for r in self.ranks:
            r.cond.notify()
        self.lock.notify_all()

    # -- stepped turns -----------------------------------------------------------------------------
    def _pass_turn(self, me):
        """The turn goes to the next runnable rank after ``me`` in rank order, cyclically (``me`` again if
        it is the only one): the lowest set bit of ``runnable`` above ``me``, else the lowest."""
        mask = self.runnable
        if not mask:
            return
        above = mask >> (me.rank + 1)
        nxt = me.rank + 1 + ((above & -above).bit_length() - 1) if above else (mask & -mask).bit_length() - 1
        self.turn = nxt
        if nxt != me.rank:
            self.ranks[nxt].cond.notify()

    def _await_turn(self, me):
        """Park until it is ``me``'s turn; once the world has ended every rank runs on to its next call."""
        while self.turn != me.rank and not self.ended():
            me.cond.wait()

    # -- deadlock ------------------------------------------------------------------------------------
    def _deadlocked(self):
        live = [r for r in self.ranks if r.status == "running"]
        return bool(live) and all(r.waiting is not None and not r.waiting[0]() for r in live)

    def _report_deadlock(self, me):
        frames = sys._current_frames()
        entries = []
        for r in self.ranks:
            if r.status != "running":
                entries.append((r.rank, r.status, ()))
                continue
            frame = sys._getframe() if r is me else frames.get(r.thread.ident)
            entries.append((r.rank, f"waits in {r.waiting[1]()}", tuple("    " + line for line in user_stack(frame))))
        lines = [f"deadlock on {self.size} simulated ranks: every live rank waits for a call no rank can complete"]
        self.deadlock = "\n".join(lines + by_rank(entries))
        self._wake_all()


GROUPED = 16  # a report on more ranks than this gives each distinct line once, with the ranks it is true of


def by_rank(entries):
    """Report lines from ``[(rank, text, detail lines)]``: ``rank r: text`` and its detail for each rank; on
    more than GROUPED ranks, each distinct (text, detail) once, as ``ranks 0-253, 255: text``, in the order
    of its first rank (a 1024-rank deadlock is then a few lines, not a thousand stacks)."""
    if len(entries) <= GROUPED:
        return [line for rank, text, detail in entries for line in (f"rank {rank}: {text}", *detail)]
    groups = {}
    for rank, text, detail in entries:
        groups.setdefault((text, detail), []).append(rank)
    lines = []
    for (text, detail), ranks in groups.items():
        lines.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {_spans(ranks)}: {text}")
        lines.extend(detail)
    return lines


def _spans(ranks):
    """``0-253, 255`` for the sorted ranks 0, 1, ..., 253, 255."""
    spans, start = [], ranks[0]
    for prev, r in zip(ranks, ranks[1:] + [None]):
        if r is None or r != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = r
    return ", ".join(spans)


def user_stack(frame):
    """The lines of ``frame``'s stack that are the rank's own code, not this package's or threading's."""
    if frame is None:
        return []
    kept = [f for f in traceback.extract_stack(frame)
            if not f.filename.startswith(_HERE) and not f.filename.endswith(("threading.py",))]
    return "".join(traceback.format_list(kept)).rstrip("\n").split("\n")


def call_site(skip=2):
    """Where a call on a simulated rank was made: ``"file:line"`` of the nearest frame outside this
    package and refconv.collectives/refconv.shapes (the call's own machinery), and, when that frame
    is refconv's own code, ``" (from file:line)"`` of the nearest frame outside refconv: the user's line."""
    f = sys._getframe(skip)
    while f is not None and f.f_code.co_filename.startswith(_MACHINERY):
        f = f.f_back
    if f is None:
        return "an unknown line"
    site = f"{f.f_code.co_filename}:{f.f_lineno}"
    if not f.f_code.co_filename.startswith(_PACKAGE):
        return site
    g = f.f_back
    while g is not None and g.f_code.co_filename.startswith(_PACKAGE):
        g = g.f_back
    return site if g is None else f"{g.f_code.co_filename}:{g.f_lineno} (in {site})"


def current_rank(what):
    """The calling thread's simulated rank, or a RuntimeError naming ``what`` outside a simulated world."""
    sim = local.simulated()
    if sim is None:
        raise RuntimeError(f"{what}: not on a simulated rank; call it inside a function run by refconv.simulated.run")
    return sim
