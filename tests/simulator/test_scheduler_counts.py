"""The simulated world's scheduler costs linear in the ranks per collective (issue 39): counted, never timed.

- a collective wakes each of its members at most a few times, in free and in stepped mode, whatever K;
- the full deadlock scan runs only when every live rank is blocked (never in a run without a deadlock);
- a message is matched only against the calls pending for its destination, not the world's;
- the stepped turn goes to the same rank as the linear scan it replaced (the next runnable rank in rank order).
"""

import threading
import types

import numpy
import pytest

from refconv import collectives, simulated
from refconv.simulated import Deadlock, engine, world


class Counting:
    """A ``threading.Condition`` on the world's lock that counts how often a rank's wait returned."""

    wakeups = 0

    def __init__(self, lock=None):
        self._cond = threading.Condition(lock)

    def __enter__(self):
        return self._cond.__enter__()

    def __exit__(self, *exc):
        return self._cond.__exit__(*exc)

    def wait(self, timeout=None):
        result = self._cond.wait(timeout)
        Counting.wakeups += 1
        return result

    def notify(self, n=1):
        self._cond.notify(n)

    def notify_all(self):
        self._cond.notify_all()


@pytest.fixture
def wakeups(monkeypatch):
    fake = types.SimpleNamespace(**{name: getattr(threading, name) for name in dir(threading) if not name.startswith("__")})
    fake.Condition = Counting
    monkeypatch.setattr(world, "threading", fake)
    Counting.wakeups = 0
    return Counting


def allreduces(comm, n):
    for _ in range(n):
        collectives.allreduce(comm, numpy.ones(4, numpy.float32))


def per_collective(counter, ranks, stepped, n=10):
    """Wakeups per collective of ``n`` allreduces, less those of a run that makes none."""
    counter.wakeups = 0
    simulated.run(allreduces, ranks, args=(0,), stepped=stepped, timeout=120)
    base = counter.wakeups
    counter.wakeups = 0
    simulated.run(allreduces, ranks, args=(n,), stepped=stepped, timeout=120)
    return (counter.wakeups - base) / n


@pytest.mark.parametrize("stepped", [False, True], ids=["free", "stepped"])
def test_wakeups_per_collective_are_linear_in_the_ranks(wakeups, stepped):
    small, large = per_collective(wakeups, 16, stepped), per_collective(wakeups, 64, stepped)
    # the old scheduler's notify_all woke every blocked rank at every pass: 4 040 wakeups per allreduce at 64, stepped
    assert small <= 3 * 16 and large <= 3 * 64, (small, large)


def test_the_deadlock_scan_runs_only_when_every_live_rank_is_blocked(monkeypatch):
    scans = []
    scan = world.World._deadlocked
    monkeypatch.setattr(world.World, "_deadlocked", lambda self: scans.append(1) or scan(self))

    def halo_ring(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        for _ in range(3):
            got = numpy.zeros(2)
            requests = [comm.Irecv(got, source=left, tag=7), comm.Isend(numpy.ones(2) * comm.rank, dest=right, tag=7)]
            simulated.comm.Request.Waitall(requests)
            allreduces(comm, 1)

    for stepped in (False, True):
        simulated.run(halo_ring, 32, stepped=stepped, timeout=120)
    assert scans == []

    def unmatched(comm):
        if comm.rank == 3:
            comm.Recv(numpy.zeros(1), source=0, tag=1)
        allreduces(comm, 1)
    with pytest.raises(Deadlock):
        simulated.run(unmatched, 32, timeout=120)
    assert 1 <= len(scans) <= 2


def test_a_message_is_matched_only_against_its_destinations_calls(monkeypatch):
    compared = []
    send = engine._matches_send           # a receive's matcher calls it too
    monkeypatch.setattr(engine, "_matches_send", lambda s, r: compared.append(1) or send(s, r))

    def everyone_posts_then_receives(comm):
        # every rank's sends are pending at once: a scan of the whole queue would compare O(K) posts per message
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        sent = [comm.Isend(numpy.ones(1), dest=right, tag=t) for t in range(2)]
        collectives.barrier(comm)
        for t in range(2):
            comm.Recv(numpy.zeros(1), source=left, tag=t)
        simulated.comm.Request.Waitall(sent)

    per_rank = []
    for ranks in (16, 64):
        compared.clear()
        simulated.run(everyone_posts_then_receives, ranks, timeout=120)
        per_rank.append(len(compared) / ranks)
    # each receive compares the sends to its own rank only (2 pending, the first matches); the old single
    # queue held every rank's sends, O(K) comparisons per receive
    assert per_rank[0] == per_rank[1] == 2, per_rank


def test_the_stepped_turn_goes_where_the_linear_scan_sent_it(monkeypatch):
    """At every pass the bitmask's choice is the old rule's: the next rank after ``me``, cyclically,
    that is running and not waiting for an unfinished call."""
    passes = []
    pass_turn = world.World._pass_turn

    def checked(self, me):
        old = next((r.rank for k in range(1, self.size + 1) for r in [self.ranks[(me.rank + k) % self.size]]
                    if r.status == "running" and (r.waiting is None or r.waiting[0]())), self.turn)
        pass_turn(self, me)
        passes.append((old, self.turn))

    monkeypatch.setattr(world.World, "_pass_turn", checked)

    def mixed(comm):
        sub = comm.Split(3 if comm.rank == 5 else comm.rank % 3, comm.rank)
        if comm.rank == 5:
            sub.Free()
            return                      # a rank that leaves early
        for i in range(2):
            right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
            got = numpy.zeros(1)
            simulated.comm.Request.Waitall([sub.Irecv(got, source=left, tag=i), sub.Isend(numpy.ones(1), dest=right, tag=i)])
            collectives.allreduce(sub, numpy.ones(2))
        sub.Free()

    simulated.run(mixed, 11, stepped=True, timeout=120)
    assert len(passes) > 100
    assert all(old == new for old, new in passes), [p for p in passes if p[0] != p[1]][:5]


def test_a_deadlock_on_many_ranks_is_reported_once_per_distinct_wait():
    def unmatched(comm):
        if comm.rank == 3:
            comm.Recv(numpy.zeros(1), source=0, tag=1)
        allreduces(comm, 1)
    with pytest.raises(Deadlock) as caught:
        simulated.run(unmatched, 64, timeout=120)
    heads = [line for line in str(caught.value).splitlines() if not line.startswith(" ")]
    assert heads[1:] == ["ranks 0-2, 4-63: waits in Allreduce (collective 0) on communicator 'world'",
                         "rank 3: waits in Recv from rank 0 tag 1 on communicator 'world'"], heads


def test_a_failure_on_many_ranks_is_summarized_once_per_distinct_outcome():
    def body(comm):
        if comm.rank == 7:
            raise ValueError("planted")
        allreduces(comm, 1)
    with pytest.raises(ValueError) as caught:
        simulated.run(body, 32, timeout=120)
    note = caught.value.__notes__[0].splitlines()
    assert note[0] == "on 32 simulated ranks:" and len(note) == 3, note
    assert note[1].startswith("  ranks 0-6, 8-31: released from Allreduce (collective 0)") and "because rank 7 failed" in note[1]
    assert note[2] == "  rank 7: raised ValueError: planted"
