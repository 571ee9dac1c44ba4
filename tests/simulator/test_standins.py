"""mpi4py's own names on a simulated rank (refconv.simulated.standins): MPI.COMM_WORLD is the rank's
world, MPI.Request's class methods complete simulated requests, MPI.Win and persistent requests are
refused by name, and every name is mpi4py's own again once the world ends."""

import threading

import numpy
import pytest
from mpi4py import MPI

from refconv import ProcessGrid, collectives, simulated
from refconv.collectives import local
from refconv.simulated import Unsupported

PROCESS_WORLD = MPI.COMM_WORLD   # bound before any run: mpi4py's own, this process's one rank


def run(fn, ranks, **kw):
    return simulated.run(fn, ranks, timeout=60, **kw)


# -- MPI.COMM_WORLD ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_raw_allreduce_on_mpi_comm_world_reduces_over_every_simulated_rank(ranks):
    def body(comm):
        total = numpy.empty(1)
        MPI.COMM_WORLD.Allreduce(numpy.array([comm.rank + 1.0]), total)   # not the rank's own value
        return total[0], MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()

    assert run(body, ranks) == [(ranks * (ranks + 1) / 2, ranks, r) for r in range(ranks)]


def test_mpi_comm_world_is_the_ranks_world_communicator_by_identity_and_equality():
    def body(comm):
        from mpi4py.MPI import COMM_WORLD   # a from-import inside the rank's code reads it there too
        sub = comm.Split(comm.rank % 2, comm.rank)
        seen = (comm is MPI.COMM_WORLD, COMM_WORLD is comm, comm == MPI.COMM_WORLD, sub is MPI.COMM_WORLD,
                MPI.COMM_WORLD is simulated.comm_world())
        sub.Free()
        return seen

    assert run(body, 4) == [(True, True, True, False, True)] * 4


def test_refconvs_own_code_takes_mpi_comm_world_read_on_a_rank():
    """ProcessGrid's default, the collective wrappers and collectives.check_comm on MPI.COMM_WORLD."""
    def body(comm):
        grid = ProcessGrid(channel=comm.size)        # the default communicator: MPI.COMM_WORLD, read now
        total = collectives.allreduce(MPI.COMM_WORLD, numpy.full(2, comm.rank + 1.0))
        return grid.comm is comm, total.tolist()

    assert run(body, 3) == [(True, [6.0, 6.0])] * 3


def test_mpi_comm_world_bound_before_the_run_is_named_by_refconvs_wrappers():
    with pytest.raises(RuntimeError, match=r"allreduce: MPI.COMM_WORLD bound before the run \(the process's, one "
                                           r"rank.*used on simulated rank 0"):
        run(lambda comm: collectives.allreduce(PROCESS_WORLD, numpy.ones(3)), 2)


def test_what_the_lookup_cannot_reach_is_as_documented():
    """docs/simulated-ranks.md: names bound before the run stay mpi4py's own, the process's one rank."""
    process_waitall = MPI.Request.Waitall

    def body(comm):
        mine = numpy.empty(1)
        PROCESS_WORLD.Allreduce(numpy.array([comm.rank + 1.0]), mine)     # one rank: its own value, no error
        requests, _ = _ring(comm)
        try:
            process_waitall(requests)
        except TypeError:
            MPI.Request.Waitall(requests)
            return mine[0], "TypeError"
        return mine[0], None

    assert run(body, 2) == [(1.0, "TypeError"), (2.0, "TypeError")]


def test_other_threads_see_mpi4pys_own_names_while_a_world_runs_and_after_it():
    seen = {}

    def body(comm):
        if comm.rank == 0:
            t = threading.Thread(target=lambda: seen.update(world=MPI.COMM_WORLD, request=MPI.Request, win=MPI.Win))
            t.start()
            t.join()             # a thread a rank starts is not a rank: it sees the process's names
        return local.simulated() is not None and MPI.Request is not seen.get("request")

    assert run(body, 2) == [True, True]
    assert seen["world"] is PROCESS_WORLD and seen["request"].__module__ == "mpi4py.MPI"
    assert MPI.COMM_WORLD is PROCESS_WORLD and "COMM_WORLD" in vars(MPI) and "__getattr__" not in vars(MPI)
    assert MPI.Request.__module__ == "mpi4py.MPI" and MPI.Win.__module__ == "mpi4py.MPI"


def test_the_names_stay_while_another_world_still_runs():
    started, release, out = threading.Event(), threading.Event(), []

    def slow(comm):
        started.set()
        release.wait(30)
        return MPI.COMM_WORLD is comm

    other = threading.Thread(target=lambda: out.append(simulated.run(slow, 2, timeout=60)))
    other.start()
    try:
        assert started.wait(30)
        assert run(lambda comm: MPI.COMM_WORLD is comm, 2) == [True, True]
        assert "__getattr__" in vars(MPI) and "COMM_WORLD" not in vars(MPI)   # the other world still runs
    finally:
        release.set()
        other.join(60)
    assert out == [[True, True]] and MPI.COMM_WORLD is PROCESS_WORLD and "__getattr__" not in vars(MPI)


def test_the_names_come_back_after_a_failed_run():
    with pytest.raises(ValueError, match="boom"):
        run(lambda comm: (_ for _ in ()).throw(ValueError("boom")), 2)
    assert MPI.COMM_WORLD is PROCESS_WORLD and "__getattr__" not in vars(MPI)


# -- MPI.Request's class methods ------------------------------------------------------------------------------
def _ring(comm):
    """Each rank sends its rank to the next; (requests, the receive buffer)."""
    got = numpy.full(1, -1)
    requests = [comm.Isend(numpy.array([comm.rank]), (comm.rank + 1) % comm.size),
                comm.Irecv(got, (comm.rank - 1) % comm.size)]
    return requests, got


def test_mpi_request_waitall_and_testall_complete_simulated_requests():
    def body(comm):
        requests, got = _ring(comm)
        MPI.Request.Waitall(requests)
        return int(got[0]), MPI.Request.Testall(requests), isinstance(requests[0], MPI.Request)

    assert run(body, 3) == [(2, True, True), (0, True, True), (1, True, True)]


def test_mpi_request_waitany_returns_each_request_once_then_undefined():
    def body(comm):
        requests, got = _ring(comm)
        order = [MPI.Request.Waitany(requests) for _ in requests]
        return sorted(order), MPI.Request.Waitany(requests), int(got[0])

    assert run(body, 2) == [([0, 1], MPI.UNDEFINED, 1), ([0, 1], MPI.UNDEFINED, 0)]


def test_mpi_request_waitsome_and_testsome_report_indices_done():
    def body(comm):
        requests, got = _ring(comm)
        done = []
        while len(done) < len(requests):
            done += MPI.Request.Waitsome(requests)
        again = MPI.Request.Testsome(requests)
        return sorted(done), again, int(got[0])

    assert run(body, 2) == [([0, 1], None, 1), ([0, 1], None, 0)]


def test_mpi_request_testany_completes_one_request():
    def body(comm):
        requests, got = _ring(comm)
        index, flag = MPI.Request.Testany(requests)
        while not flag:
            index, flag = MPI.Request.Testany(requests)
        MPI.Request.Waitall([r for i, r in enumerate(requests) if i != index])
        return int(got[0])

    assert run(body, 2) == [1, 0]


def test_a_list_mixing_simulated_and_mpi4py_requests_is_named():
    def body(comm):
        requests, _ = _ring(comm)
        MPI.Request.Waitall(requests + [MPI.REQUEST_NULL])

    with pytest.raises(simulated.SimulatedError, match="MPI.Request.Waitall: the list mixes simulated requests "
                                                      "with mpi4py's own"):
        run(body, 2)


# -- refused by name ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", ["Create", "Allocate", "Allocate_shared", "Create_dynamic"])
def test_a_window_on_a_simulated_communicator_is_refused_by_name(call):
    args = {"Create": (numpy.zeros(4),), "Allocate": (32,), "Allocate_shared": (32,), "Create_dynamic": ()}[call]

    def body(comm):
        getattr(MPI.Win, call)(*args, comm=MPI.COMM_WORLD)

    with pytest.raises(Unsupported, match=rf"MPI.Win.{call} on simulated rank 0: one-sided communication "
                                          r"\(MPI.Win\) is not simulated") as caught:
        run(body, 2)
    assert isinstance(caught.value, NotImplementedError) and isinstance(caught.value, simulated.SimulatedError)


@pytest.mark.parametrize("call", ["Send_init", "Recv_init", "Ssend_init", "Allreduce_init"])
def test_persistent_requests_are_refused_by_name(call):
    def body(comm):
        getattr(comm, call)(numpy.zeros(2), 0)

    with pytest.raises(Unsupported, match=rf"Comm.{call}: persistent requests are not simulated"):
        run(body, 2)
