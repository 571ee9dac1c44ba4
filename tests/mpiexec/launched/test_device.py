"""Rank-to-GPU binding across ranks, with a fake device count and fake
CUDA_VISIBLE_DEVICES (no GPU here): the node-local rank comes from the
shared-memory split, and a refused binding is refused on every rank alike."""

import pytest
from mpi4py import MPI

from refconv import device
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test


def _bind(**kw):
    picked = []
    mine, table = device.bind(MPI.COMM_WORLD, "cuda", select=picked.append, warn=False, **kw)
    return mine, table, picked


@mpi_test(sizes=(2, 4), timeout=60)
def test_local_rank_and_one_gpu_each():
    comm = MPI.COMM_WORLD
    mine, table, picked = _bind(count=comm.size, env={})  # one node here: local rank == world rank
    ok = (mine.local_rank == comm.rank and mine.local_size == comm.size and mine.gpu == comm.rank
          and picked == [comm.rank] and [b.rank for b in table] == list(range(comm.size)))
    assert_all_ranks(comm, ok, f"rank {comm.rank}: {mine}, picked {picked}")


@mpi_test(sizes=(2, 4), timeout=60)
def test_more_ranks_than_gpus_is_refused_on_every_rank():
    comm = MPI.COMM_WORLD
    with pytest.raises(device.BindError, match=f"{comm.size} ranks on node .* share 1 GPU"):
        _bind(count=1, env={})
    mine, _, picked = _bind(count=1, env={}, oversubscribe=True)  # opted in: all on device 0
    assert_all_ranks(comm, mine.gpu == 0 and picked == [0], f"rank {comm.rank}: {mine}")


@mpi_test(sizes=(2, 4), timeout=60)
def test_one_visible_gpu_per_task_is_not_a_conflict():
    comm = MPI.COMM_WORLD  # as Slurm's --gpus-per-task=1 hands them out
    mine, _, picked = _bind(count=1, env={"CUDA_VISIBLE_DEVICES": str(comm.rank)})
    assert_all_ranks(comm, mine.gpu == 0 and mine.gpu_id == str(comm.rank) and picked == [0], f"{mine}")
