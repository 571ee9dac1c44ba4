"""The simulated world itself (refconv.simulated): MPI's rules, failures, deadlocks, stepping.

What the algorithms do on it is tested in tests/on_ranks/; this file tests the world: that it
matches, reduces and completes as MPI does, that it catches what MPI forbids, and that a run
never hangs.
"""

import functools
import re
import threading
import time

import numpy
import pytest
from mpi4py import MPI

from refconv import ProcessGrid, collectives, simulated
from refconv.simulated import BufferReused, CollectiveMismatch, Deadlock, PeerFailed
from refconv.simulated.world import current_rank


def run(fn, ranks, **kw):
    return simulated.run(fn, ranks, timeout=60, **kw)


def until(condition, what, deadline_s=30.0):
    """Poll ``condition()`` until it holds, failing with ``what`` after ``deadline_s``: a loaded
    machine makes the wait longer, never the test wrong (as a fixed sleep would)."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"not within {deadline_s} s: {what}"
        time.sleep(0.001)


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [0, -1, simulated.MAX_RANKS + 1, 2.0, "4", True])
def test_a_bad_number_of_ranks_is_a_clear_error(ranks):
    with pytest.raises(ValueError, match=rf"ranks must be an int in \[1, {simulated.MAX_RANKS}\]"):
        simulated.run(lambda comm: None, ranks)


def test_a_world_does_not_run_inside_another():
    with pytest.raises(RuntimeError, match="a world cannot run inside another"):
        run(lambda comm: simulated.run(lambda c: None, 2), 2)


def test_an_mpi4py_call_the_world_lacks_names_itself():
    with pytest.raises(NotImplementedError, match="Comm.Reduce_scatter_block is not implemented"):
        run(lambda comm: comm.Reduce_scatter_block(numpy.ones(2), numpy.ones(1)), 2)
    with pytest.raises(NotImplementedError, match="Comm.sendrecv is not implemented"):
        run(lambda comm: comm.sendrecv(1, dest=0), 2)


def test_mpi_comm_world_bound_before_the_run_is_named():
    """MPI.COMM_WORLD read on a rank is its world (tests/simulator/test_standins.py); one bound before is not."""
    process_world = MPI.COMM_WORLD
    with pytest.raises(RuntimeError, match="allreduce: MPI.COMM_WORLD bound before the run .* used on simulated rank 0"):
        run(lambda comm: collectives.allreduce(process_world, numpy.ones(3)), 2)
    with pytest.raises(RuntimeError, match="grid: MPI.COMM_WORLD bound before the run .* used on simulated rank 0"):
        run(lambda comm: ProcessGrid(process_world), 1)


def test_each_rank_has_a_communicator_of_its_own_for_serial_twins():
    def body(comm):
        alone = collectives.comm_self()
        total = collectives.allreduce(alone, numpy.full(2, comm.rank + 1.0))
        return alone.Get_size(), alone is collectives.comm_self(), total.tolist()
    assert run(body, 3) == [(1, True, [r + 1.0] * 2) for r in range(3)]
    with pytest.raises(RuntimeError, match="MPI.COMM_SELF used on simulated rank 0.*collectives.comm_self"):
        run(lambda comm: ProcessGrid(MPI.COMM_SELF), 1)


def test_a_simulated_communicator_outside_its_world_is_named():
    comm, = run(lambda comm: comm, 1)
    with pytest.raises(RuntimeError, match="used outside its world's rank threads"):
        collectives.allreduce(comm, numpy.ones(2))


# -- MPI's semantics ------------------------------------------------------------------------------------
def test_reductions_run_in_rank_order_and_give_the_same_bits_every_run():
    def body(comm):
        x = numpy.random.default_rng(comm.rank).standard_normal(1000) * 10.0 ** comm.rank  # rounding matters
        return x, collectives.allreduce(comm, x)
    first, second = run(body, 5), run(body, 5)
    in_order = functools.reduce(lambda a, b: a + b, [x for x, _ in first])
    for (_, total), (_, again) in zip(first, second):
        assert numpy.array_equal(total, in_order) and numpy.array_equal(total, again)
    reversed_order = functools.reduce(lambda a, b: a + b, [x for x, _ in reversed(first)])
    assert not numpy.array_equal(in_order, reversed_order), "the data must be able to tell the orders apart"


def test_messages_match_by_source_and_tag_and_do_not_overtake():
    def body(comm):
        if comm.rank == 0:
            sends = [comm.Isend(numpy.full(2, value), 1, tag) for tag, value in [(7, 1.0), (5, 2.0), (7, 3.0)]]
            sends.append(comm.Isend(numpy.full(2, 9.0), 2, 7))
            type(sends[0]).Waitall(sends)      # the simulated Request class, as MPI.Request.Waitall
            return None
        if comm.rank == 2:
            buf = numpy.zeros(2)
            comm.Irecv(buf, MPI.ANY_SOURCE, MPI.ANY_TAG).Wait()
            return buf[0]
        got = []
        for tag in (5, 7, 7):            # tag 5 first, though sent second; the two 7s in their order
            buf = numpy.zeros(2)
            comm.Irecv(buf, 0, tag).Wait()
            got.append(buf[0])
        return got
    assert run(body, 3) == [None, [2.0, 1.0, 3.0], 9.0]


def test_every_wrapper_on_uneven_blocks_matches_numpy():
    def body(comm):
        r, p = comm.rank, comm.size
        counts = [i % 3 + 1 for i in range(p)]
        base = numpy.arange(2 * sum(counts) * 3, dtype=numpy.float64).reshape(2, sum(counts), 3)
        mine = base[:, sum(counts[:r]):sum(counts[:r + 1])]
        out = {
            "reduce_scatter": collectives.reduce_scatter(comm, base * (r + 1), counts, axis=1),
            "allgather": collectives.allgather(comm, numpy.ascontiguousarray(mine), counts, axis=1),
            "alltoallv": collectives.alltoallv(comm, [numpy.full(q + 1, r, float) for q in range(p)],
                                               [(r + 1,)] * p),
            "scatter": collectives.scatter(comm, [numpy.full(q + 2, q, float) for q in range(p)] if r == 0 else None,
                                           (r + 2,)),
            "gather": collectives.gather(comm, numpy.full(r + 1, r, float), [(q + 1,) for q in range(p)]),
        }
        return out, mine
    for r, (out, mine) in enumerate(run(body, 4)):
        counts = [i % 3 + 1 for i in range(4)]
        base = numpy.arange(2 * sum(counts) * 3, dtype=numpy.float64).reshape(2, sum(counts), 3)
        assert numpy.array_equal(out["reduce_scatter"], mine * 10)
        assert numpy.array_equal(out["allgather"], base)
        assert [b.tolist() for b in out["alltoallv"]] == [[q] * (r + 1) for q in range(4)]
        assert out["scatter"].tolist() == [r] * (r + 2)
        assert (out["gather"] is None) == (r != 0)
    assert [b.tolist() for b in run(body, 4)[0][0]["gather"]] == [[q] * (q + 1) for q in range(4)]


def test_each_rank_counts_only_its_own_calls():
    def body(comm):
        with collectives.stats.recording() as region:
            for _ in range(comm.rank + 1):
                collectives.exchange(comm, {(comm.rank + 1) % comm.size: numpy.ones(2)},
                                     {(comm.rank - 1) % comm.size: (2,)}, float)
        return region.summary()["halo"]["calls"]
    assert run(body, 1) == [1]
    with pytest.raises(Deadlock):   # rank 1 exchanges twice, rank 0 once: rank 1's second send finds no receive
        run(body, 2)


def test_split_orders_by_key_and_names_the_new_communicators():
    def body(comm):
        sub = collectives.split(comm, comm.rank % 2, -comm.rank)     # reversed order within each color
        where = sub.Get_size(), sub.Get_rank()
        sub.Free()
        return where
    assert run(body, 5) == [(3, 2), (2, 1), (3, 1), (2, 0), (3, 0)]


# -- what MPI forbids, caught ---------------------------------------------------------------------------------
def test_collectives_in_a_different_order_are_an_error_naming_both():
    def body(comm):
        if comm.rank == 1:
            collectives.bcast_object(comm, "x")
        else:
            collectives.allgather_object(comm, ("rank 0's verdict", False))
    with pytest.raises(CollectiveMismatch) as caught:
        run(body, 2)
    text = str(caught.value)
    assert "collective 0 on communicator 'world'" in text
    assert "rank 0 called allgather" in text and "rank 1 called bcast" in text
    assert "rank 0's verdict" in text   # what the object collective carried is shown


def test_a_send_buffer_changed_before_its_wait_is_caught():
    def body(comm):
        x = numpy.ones(4)
        request = collectives.iallreduce_(comm, x)
        if comm.rank == 1:
            x[0] = 5.0                      # before the wait: MPI may be reading x
        return request.wait()
    with pytest.raises(BufferReused, match="rank 1: the send buffer .* of Allreduce .* changed before"):
        run(body, 2)


def test_a_halo_send_changed_before_its_wait_is_caught():
    def body(comm):
        piece = numpy.ones(3)
        request = collectives.iexchange(comm, {1 - comm.rank: piece}, {1 - comm.rank: (3,)}, float)
        piece += 1                          # sent in place: contiguous, in the dtype
        return request.wait()
    with pytest.raises(BufferReused, match=r"the send buffer \(shape \(3,\) float64\) of Isend to rank"):
        run(body, 2)


def test_a_send_completes_only_when_its_receive_is_posted():
    """As MPI_Ssend: a program that needs MPI to buffer a message is unsafe under MPI too (it hangs
    once messages are too large to send eagerly); here it is a deadlock at any size."""
    def body(comm):
        comm.Isend(numpy.ones(1), 1 - comm.rank, 0).Wait()
        comm.Irecv(numpy.zeros(1), 1 - comm.rank, 0).Wait()
    with pytest.raises(Deadlock, match="rank 0: waits in Isend to rank 1 tag 0"):
        run(body, 2)


def test_a_receive_smaller_than_its_message_is_an_error():
    def body(comm):
        if comm.rank == 0:
            comm.Isend(numpy.ones(4), 1, 0).Wait()
        else:
            comm.Irecv(numpy.zeros(2), 0, 0).Wait()
    with pytest.raises(ValueError, match="larger than the receive buffer"):
        run(body, 2)


# -- never a hang -------------------------------------------------------------------------------------------------
def test_a_failing_rank_releases_the_others_at_once_with_its_traceback():
    def body(comm):
        if comm.rank == 2:
            others = [r for r in current_rank("the failing rank").world.ranks if r.rank != 2]
            until(lambda: all(r.waiting for r in others), "ranks 0, 1 and 3 block in the allreduce")
            raise ValueError("rank 2 fails here")
        collectives.allreduce(comm, numpy.ones(3))
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank 2 fails here") as caught:
        run(body, 4)
    assert time.monotonic() - t0 < 10, "released ranks must not wait for a deadline"
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "rank 2: raised ValueError: rank 2 fails here" in note
    for r in (0, 1, 3):
        assert f"rank {r}: released from Allreduce (collective 0) on communicator 'world' because rank 2 failed" \
            in note


def test_ranks_whose_calls_completed_raise_their_own_errors():
    def body(comm):
        collectives.allreduce(comm, numpy.ones(1))
        raise ValueError(f"rank {comm.rank}'s own")
    for stepped in (False, True):
        with pytest.raises(ValueError, match="rank 0's own") as caught:
            run(body, 4, stepped=stepped)
        note = "\n".join(caught.value.__notes__)
        assert all(f"rank {r}: raised ValueError: rank {r}'s own" in note for r in range(4)), note


def test_a_released_rank_carries_the_failing_ranks_traceback():
    seen = {}

    def body(comm):
        if comm.rank == 0:
            raise KeyError("boom")
        try:
            collectives.barrier(comm)
        except PeerFailed as exc:
            seen[comm.rank] = str(exc)
            raise
    with pytest.raises(KeyError):
        run(body, 3)
    assert set(seen) == {1, 2}
    assert "rank 0's traceback" in seen[1] and 'raise KeyError("boom")' in seen[1]


def test_ranks_in_different_collectives_are_reported_as_a_deadlock():
    def body(comm):
        a = collectives.split(comm, 0, comm.rank)
        a.Set_name("A")
        b = collectives.split(comm, 0, comm.rank)
        b.Set_name("B")
        collectives.allreduce(a if comm.rank == 0 else b, numpy.ones(2))   # rank 0 in A, rank 1 in B
    t0 = time.monotonic()
    with pytest.raises(Deadlock) as caught:
        run(body, 2)
    assert time.monotonic() - t0 < 10
    text = str(caught.value)
    assert re.search(r"rank 0: waits in Allreduce \(collective 0\) on communicator 'A'", text), text
    assert re.search(r"rank 1: waits in Allreduce \(collective 0\) on communicator 'B'", text), text
    assert text.count("in body") == 2, "each rank's stack shows where it waits"


def test_a_receive_with_no_send_is_reported_as_a_deadlock():
    def body(comm):
        if comm.rank == 1:
            comm.Irecv(numpy.zeros(3), 0, 7).Wait()
    with pytest.raises(Deadlock, match=r"rank 0: done\nrank 1: waits in Irecv from rank 0 tag 7 on communicator 'world'"):
        run(body, 2)


def test_a_rank_computing_forever_ends_at_the_timeout_with_each_ranks_stack():
    stop = threading.Event()

    def body(comm):
        while comm.rank == 0 and not stop.is_set():
            time.sleep(0.01)
        collectives.barrier(comm)
    try:
        with pytest.raises(TimeoutError, match=r"(?s)still running after 0.5 s.*rank 1: running, waits in Barrier"):
            simulated.run(body, 2, timeout=0.5)
        assert not [t for t in threading.enumerate() if t.name.startswith("simulated rank")], "a rank still runs"
    finally:
        stop.set()


def test_an_injected_fault_strikes_its_simulated_rank_only():
    def body(comm):
        collectives.set_fault("1:allreduce:raise")
        collectives.allreduce(comm, numpy.ones(2))
    with pytest.raises(collectives.FaultInjected, match="on rank 1"):
        run(body, 3)


# -- stepped ---------------------------------------------------------------------------------------------------------
def test_stepped_ranks_take_turns_only_at_calls_and_every_run_is_the_same():
    def body(comm, log):
        for i in range(3):
            log.append((comm.rank, i, "a"))
            log.append((comm.rank, i, "b"))       # no call between: never split from "a"
            collectives.allreduce(comm, numpy.ones(1))
    logs = []
    for _ in range(3):
        log = []
        run(body, 3, args=(log,), stepped=True)
        logs.append(log)
    assert logs[0] == logs[1] == logs[2]
    pairs = list(zip(logs[0][::2], logs[0][1::2]))
    assert all(a[:2] == b[:2] and (a[2], b[2]) == ("a", "b") for a, b in pairs)
    assert [a[0] for a, _ in pairs[:3]] == [0, 1, 2]    # round robin in rank order


def test_communicators_compare_as_mpi_compares_them():
    def body(comm):
        same = collectives.split(comm, 0, comm.rank)
        reordered = collectives.split(comm, 0, -comm.rank)
        half = collectives.split(comm, comm.rank % 2, comm.rank)
        compare = type(comm).Compare
        results = [compare(comm, comm), compare(comm, same), compare(comm, reordered), compare(comm, half)]
        for sub in (same, reordered, half):
            sub.Free()
        return results
    expected = [MPI.IDENT, MPI.CONGRUENT, MPI.SIMILAR, MPI.UNEQUAL]
    assert run(body, 4) == [expected] * 4


def test_each_rank_keeps_its_own_deadline_setting():
    before = collectives.get_timeout()

    def body(comm):
        with collectives.timeout(30 + comm.rank):
            inside = collectives.get_timeout()
            collectives.allreduce(comm, numpy.ones(1))
        return inside, collectives.get_timeout()
    assert run(body, 2, stepped=True) == [(30.0, None), (31.0, None)]
    assert collectives.get_timeout() == before
