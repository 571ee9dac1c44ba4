"""Every match order of the wildcard receives: ``run(fn, K, schedules="all")``, as ISP explores them.

A receive from ``MPI.ANY_SOURCE`` may take the message of any rank that sends it one, and which
one it takes depends on timing: a free run finds a race only by luck, and a stepped run, always
the same, never finds it.  With ``schedules="all"`` (stepped implied) the world explores them:

- a wildcard receive is not matched when it is posted; it waits, with the rank's later receives
  on that communicator (MPI matches a message with the oldest receive that takes it), until
  every live rank waits (ISP's fence: no other call can move);
- there its candidates are, for each sending rank, the oldest of its pending sends to the receiver
  that the receive takes (messages from one rank do not overtake each other).  With more than
  one, the world takes one and records the choice: the first run takes the first candidate, in
  rank order, at every choice; each later run forces the choices of the one before up to its last
  choice with an alternative left, takes that alternative, and goes on with first candidates
  (depth first), until no choice has an alternative left;
- a schedule in which the world finds an error (:class:`refconv.simulated.world.SimulatedError`:
  a deadlock, a mismatch, ...) ends the exploration with it, with a note naming its choices;
- schedules whose outcomes differ raise :class:`MessageRace`, naming the wildcard receive
  (rank, file:line) whose choice made the difference, both outcomes and the number of schedules
  explored.  An outcome is each rank's result (NumPy arrays compared by value), or the program's
  own exception (its type and first line): an assert that fails in one order only is a race, and
  one that fails in every order is raised as itself.

A clean exploration returns the results (the same on every schedule) as an :class:`Explored`
list, whose ``schedules`` attribute is the number of schedules explored (1: no wildcard receive
ever had a choice).  A receive from a named rank with ``MPI.ANY_TAG`` has no choice (the oldest
message from that rank), so it is matched at once.  Limits: worlds of at most :data:`MAX_RANKS`
ranks and :data:`MAX_SCHEDULES` schedules; a receive is matched at a fence among the sends posted
by then, so a send that only the match of another rank's wildcard receive lets be posted is a
candidate of a later fence, not of this one.  A ``Test`` that finds its requests not done while
every other live rank waits is a fence too: a rank polling a wildcard receive is answered.
"""

import os
import sys
import threading
import time

import numpy
from mpi4py import MPI

from refconv.simulated.engine import _matches_send, pair
from refconv.simulated.world import SimulatedError, World

MAX_RANKS = 4          # the orders grow as (K-1)! per round of wildcard receives
MAX_SCHEDULES = 1000
_HERE = os.path.dirname(os.path.abspath(__file__))
_exploring = threading.local()   # .schedule: the Schedule the calling thread's next run follows


class MessageRace(SimulatedError):
    """Two match orders of a wildcard receive gave different results (``run(..., schedules="all")``)."""


class Explored(list):
    """The results of ``run(..., schedules="all")``, one per rank; ``schedules``: how many were explored."""

    schedules = 0


def explore(run, fn, ranks, schedules, *, timeout=None, machine=None, **kw):
    """Run ``fn`` on ``ranks`` ranks once per match order of its wildcard receives (see the module)."""
    if schedules != "all":
        raise ValueError(f"refconv.simulated.run: schedules must be None or 'all', got {schedules!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise ValueError(f"refconv.simulated.run: schedules='all' explores worlds of at most {MAX_RANKS} ranks "
                         f"(the orders grow factorially): ranks must be an int in [1, {MAX_RANKS}], got {ranks!r}")
    if machine is not None:
        raise ValueError("refconv.simulated.run: schedules='all' runs unpriced (each schedule's clocks would "
                         "differ); leave machine=None, or price one schedule with stepped=True")
    deadline = None if timeout is None else time.monotonic() + timeout
    first = first_trail = None     # the first schedule's outcome: ("returned", results) or ("raised", error)
    prefix, expected, count = [], [], 0
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"refconv.simulated.run: schedules='all' explored {count} schedules in {timeout:g} s "
                               f"and more remain")
        schedule = Schedule(prefix, expected)
        _exploring.schedule = schedule
        try:
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
            outcome = ("returned", run(fn, ranks, stepped=True, timeout=left, **kw))
        except Exception as err:
            err.add_note(f"schedules='all': raised in schedule {count + 1} of those explored, where "
                         f"{describe(schedule.trail)}")
            if isinstance(err, (SimulatedError, TimeoutError)):
                raise                  # the world's own finding (a deadlock, a mismatch, ...): at once
            outcome = ("raised", err)  # the program's own exception: an outcome to compare with the others'
        finally:
            _exploring.schedule = None
        count += 1
        if schedule.diverged:
            raise SimulatedError(f"schedules='all': schedule {count} {schedule.diverged}; the program must do the "
                                 f"same on every run but for its wildcard matches")
        if first is None:
            first, first_trail = outcome, schedule.trail
        elif not _same_outcome(first, outcome):
            raise race(first_trail, first, schedule.trail, outcome, count, ranks)
        prefix, expected = _next(schedule.trail)
        if prefix is None:
            if first[0] == "raised":
                raise first[1]         # every schedule raised it alike: the program's error, not a race
            explored = Explored(first[1])
            explored.schedules = count
            return explored
        if count >= MAX_SCHEDULES:
            raise RuntimeError(f"refconv.simulated.run: schedules='all' explored {MAX_SCHEDULES} schedules "
                               f"(refconv.simulated.schedules.MAX_SCHEDULES), all with the same outcome, and more "
                               f"remain: fewer wildcard receives or fewer ranks, or leave schedules=None")


def _same_outcome(a, b):
    if a[0] != b[0]:
        return False
    if a[0] == "raised":
        return type(a[1]) is type(b[1]) and _line(a[1]) == _line(b[1])
    return len(a[1]) == len(b[1]) and all(same(x, y) for x, y in zip(a[1], b[1]))


def _line(error):
    return str(error).split("\n", 1)[0]


def new_world(size, stepped):
    """The World of a run: one that follows a schedule while :func:`explore` runs one on this thread."""
    schedule = getattr(_exploring, "schedule", None)
    return World(size, stepped=stepped) if schedule is None else ScheduledWorld(size, schedule)


class ScheduledWorld(World):
    """A stepped world whose wildcard receives wait for a fence and a schedule's choice."""

    def __init__(self, size, schedule):
        super().__init__(size, stepped=True)
        self.schedule = schedule

    def _deadlocked(self):
        """Every live rank waits: match a waiting wildcard receive first; a deadlock only if none can be."""
        while self.blocked == self.live:
            if not self.schedule.resolve(self):
                return super()._deadlocked()
        return False


class Choice:
    """One wildcard match with more than one candidate: the receive, its candidates, the one taken."""

    def __init__(self, recv, options, chosen):
        self.rank, self.what, self.where = recv.request.owner.rank, recv.request.what, recv.where
        self.senders = [s.request.owner.rank for s in options]
        self.chosen = chosen

    def receive(self):
        return f"rank {self.rank}'s {self.what} at {self.where}"

    def taken(self, chosen=None):
        return f"rank {self.senders[self.chosen if chosen is None else chosen]}'s message"


class Schedule:
    """One run's choices: forced by ``prefix`` (the last run's, one changed), then the first candidate."""

    def __init__(self, prefix=(), expected=()):
        self.prefix, self.expected = list(prefix), list(expected)
        self.trail = []            # a Choice per wildcard match that had more than one candidate
        self.queues = {}           # (group id, comm rank) -> (group, [its receives waiting, oldest first])
        self.diverged = None

    def posted(self, group, mine, other):
        """The engine's hook (under the lock): the call ``mine`` matches ``other`` now, or waits (None)."""
        if mine.call == "send":        # its oldest receive waits for a choice: so does the message
            return None if other is not None and getattr(other, "deferred", False) else other
        key = (group.id, mine.rank)
        if mine.args["peer"] != MPI.ANY_SOURCE and key not in self.queues:
            return other
        mine.deferred, mine.where = True, _caller()
        self.queues.setdefault(key, (group, []))[1].append(mine)
        return None

    def resolve(self, world):
        """At a fence (under the lock): match one waiting wildcard receive; False when none has a candidate."""
        for key, (group, queue) in self.queues.items():
            recv = queue[0]            # a wildcard: _settle matched the others at the front
            options = _candidates(group, recv)
            if options:
                send = options[self._choose(recv, options)]
                group.sends[recv.rank].remove(send)
                group.recvs[recv.rank].remove(recv)
                self._pop(key)
                pair(world, group, send, recv)
                self._settle(world, key)
                return True
        return False

    def polled(self, world):
        """A Test found its requests not done: with every other live rank waiting, the poller cannot be
        answered without a choice, so this is a fence too (one match per failed Test)."""
        with world.lock:
            if world.blocked == world.live - 1 and not world.ended():
                self.resolve(world)

    def _settle(self, world, key):
        """The receives behind a matched wildcard that name their source: matched as the engine would."""
        while key in self.queues and self.queues[key][1][0].args["peer"] != MPI.ANY_SOURCE:
            group = self.queues[key][0]
            recv = self._pop(key)
            send = next((s for s in group.sends.get(recv.rank, ()) if _matches_send(s, recv)), None)
            if send is not None:
                group.sends[recv.rank].remove(send)
                group.recvs[recv.rank].remove(recv)
                pair(world, group, send, recv)

    def _pop(self, key):
        queue = self.queues[key][1]
        recv = queue.pop(0)
        recv.deferred = False
        if not queue:
            del self.queues[key]
        return recv

    def _choose(self, recv, options):
        if len(options) == 1:
            return 0
        i = len(self.trail)
        chosen = 0
        if i < len(self.prefix):
            if self.expected[i] != len(options) and self.diverged is None:
                self.diverged = (f"found {len(options)} candidates where the schedule before found "
                                 f"{self.expected[i]}, at {recv.request.what} at {recv.where}")
            chosen = min(self.prefix[i], len(options) - 1)
        self.trail.append(Choice(recv, options, chosen))
        return chosen


def _candidates(group, recv):
    """The sends ``recv`` may take: each sender's oldest pending send that it matches, in rank order."""
    options, seen = [], set()
    for send in group.sends.get(recv.rank, ()):
        if send.rank not in seen and _matches_send(send, recv):
            seen.add(send.rank)
            options.append(send)
    return sorted(options, key=lambda s: s.rank)


def _next(trail):
    """The next schedule depth first: (forced choices, their candidate counts), or (None, None) when done."""
    for i in range(len(trail) - 1, -1, -1):
        if trail[i].chosen + 1 < len(trail[i].senders):
            prefix = [c.chosen for c in trail[:i]] + [trail[i].chosen + 1]
            return prefix, [len(c.senders) for c in trail[:i + 1]]
    return None, None


def _caller():
    """``file.py:12``: the innermost frame outside refconv.simulated (the rank's own call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_HERE):
        frame = frame.f_back
    return "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def describe(trail):
    if not trail:
        return "no wildcard receive had more than one candidate"
    return "; ".join(f"{c.receive()} took {c.taken()} (of ranks {c.senders})" for c in trail)


def race(trail_a, outcome_a, trail_b, outcome_b, count, ranks):
    """The MessageRace between the first schedule and a later one with another outcome."""
    at = next((i for i, (a, b) in enumerate(zip(trail_a, trail_b)) if a.chosen != b.chosen), 0)
    choice_a, choice_b = trail_a[at], trail_b[at]
    shown = None
    if outcome_a[0] == outcome_b[0] == "returned":
        shown = [r for r in range(len(outcome_a[1])) if not same(outcome_a[1][r], outcome_b[1][r])][:4]

    def told(outcome):
        if outcome[0] == "raised":
            return f"raised {type(outcome[1]).__name__}: {_clip(_line(outcome[1]))}"
        return ", ".join(f"rank {r} returned {_short(outcome[1][r])}" for r in (shown or range(len(outcome[1]))))

    error = MessageRace(
        f"message race: the match of {choice_a.receive()} changes the outcome (schedules='all' explored "
        f"{count} schedules on {ranks} ranks):\n"
        f"  taking {choice_a.taken()}: {told(outcome_a)}\n"
        f"  taking {choice_b.taken()}: {told(outcome_b)}\n"
        f"Name the source of the receive, or make the result independent of the order messages arrive in.")
    error.__cause__ = next((o[1] for o in (outcome_b, outcome_a) if o[0] == "raised"), None)
    return error


def _short(value):
    return _clip(repr(value))


def _clip(text):
    return text if len(text) <= 200 else text[:200] + " ..."


def same(a, b):
    """Equal results: arrays by shape, dtype and value (NaN equal to NaN), containers item by item."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "shape") and hasattr(a, "dtype") or hasattr(b, "shape") and hasattr(b, "dtype"):
        if getattr(a, "shape", None) != getattr(b, "shape", None) or getattr(a, "dtype", None) != getattr(b, "dtype", None):
            return False
        if getattr(a, "shapes_only", False) or getattr(b, "shapes_only", False):
            return getattr(a, "shapes_only", False) == getattr(b, "shapes_only", False)
        a, b = numpy.asarray(a), numpy.asarray(b)
        return bool(numpy.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    try:
        return bool(a == b)
    except Exception:           # an object whose == is not a truth value
        return a is b
