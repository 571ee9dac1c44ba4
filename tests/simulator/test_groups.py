"""MPI groups on simulated ranks (refconv.simulated.groups): what they hold, the communicators made of them,
and the errors MPI would give."""

import numpy
import pytest
from mpi4py import MPI

from refconv import collectives, simulated


def test_groups_hold_ranks_in_mpi_s_order_and_combine_as_mpi_s_do():
    def body(comm):
        world = comm.Get_group()
        evens, last_two = world.Incl(list(range(0, comm.size, 2))), world.Excl(list(range(comm.size - 2)))
        made = {"union": type(world).Union(evens, last_two), "intersection": type(world).Intersection(evens, last_two),
                "difference": type(world).Difference(evens, last_two)}
        out = {name: g.Translate_ranks(None, world) for name, g in made.items()}
        out["rank in evens"] = evens.Get_rank()
        out["evens in last_two"] = evens.Translate_ranks(None, last_two)
        for g in (world, evens, last_two, *made.values()):
            g.Free()
        return out

    for rank, got in enumerate(simulated.run(body, 5)):
        assert got["union"] == [0, 2, 4, 3] and got["intersection"] == [4] and got["difference"] == [0, 2]
        assert got["rank in evens"] == (rank // 2 if rank % 2 == 0 else MPI.UNDEFINED)
        assert got["evens in last_two"] == [MPI.UNDEFINED, MPI.UNDEFINED, 1]


def test_create_and_create_group_make_a_communicator_of_the_group_s_ranks_in_its_order():
    def body(comm):
        world = comm.Get_group()
        backwards = world.Incl(list(reversed(range(1, comm.size))))    # every rank but 0, last first
        sub = comm.Create(backwards)
        out = None
        if sub != MPI.COMM_NULL:
            total = collectives.allreduce(sub, numpy.full(1, float(comm.rank)))
            other = comm.Create_group(backwards, tag=3)
            out = (sub.rank, sub.size, other.rank, float(total[0]))
            other.Free()
            sub.Free()
        backwards.Free()
        world.Free()
        return out

    got = simulated.run(body, 4, stepped=True)
    assert got[0] is None
    assert got[1:] == [(2, 3, 2, 6.0), (1, 3, 1, 6.0), (0, 3, 0, 6.0)]


def test_create_group_refuses_a_rank_outside_the_group_and_a_freed_group_by_name():
    def outside(comm):
        group = comm.Get_group()
        first = group.Incl([0])
        try:
            comm.Create_group(first)
        finally:
            group.Free()
            first.Free()

    with pytest.raises(ValueError, match=r"Create_group on rank 1 of 'world': this rank is not in the group"):
        simulated.run(outside, 2)

    def freed(comm):
        group = comm.Get_group()
        group.Free()
        group.Incl([0])

    with pytest.raises(ValueError, match=r"Group.Incl on rank 0: the group was freed"):
        simulated.run(freed, 1)


def test_create_with_different_groups_on_different_ranks_is_a_collective_mismatch():
    def body(comm):
        world = comm.Get_group()
        comm.Create(world.Incl([comm.rank]))

    with pytest.raises(simulated.CollectiveMismatch, match="Create"):
        simulated.run(body, 2)
