"""refconv.threads under mpiexec: the ranks on a node share its cores."""

import os

from mpi4py import MPI

from refconv import threads
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test


@mpi_test(sizes=(1, 2), timeout=60)
def test_each_rank_gets_its_share_of_the_node():
    comm = MPI.COMM_WORLD
    before = threads.current()
    try:
        cores, ranks = threads.node_layout(comm)
        # mpiexec here starts every rank on this one machine
        assert_all_ranks(comm, ranks == comm.size, f"ranks on the node: {ranks}, expected {comm.size}")
        assert_all_ranks(comm, cores >= len(os.sched_getaffinity(0)), f"node cores {cores}")
        choice = threads.configure(comm, environ={})
        expected = max(1, cores // comm.size)
        assert_all_ranks(comm, (choice.threads, choice.source) == (expected, "default"), choice.describe())
        assert_all_ranks(comm, set(threads.current().values()) == {expected}, str(threads.current()))
        assert_all_ranks(comm, threads.oversubscribed(choice.threads + cores, cores, ranks), "oversubscribed")
    finally:
        for library, n in before.items():
            threads.limit(n)
