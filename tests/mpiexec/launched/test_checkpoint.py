"""Checkpoints across ranks under mpiexec: save on one grid/algorithm, load on another
(resharding), and a corrupt shard raises on every rank instead of hanging.

The checks are tests/on_ranks/test_checkpoint.py's functions of ``comm`` and a folder, run here
on real processes at 2 and 3 ranks (even and uneven channel blocks): each process writes its
own shard file and rank 0 commits the manifest once every shard is on disk, in a folder that
only the file system shares between them, and the one-rank side of a reshard is the real
``MPI.COMM_SELF``.
"""

import os
import shutil
import sys
import tempfile

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/: the package on_ranks
from on_ranks import test_checkpoint as checks  # noqa: E402
from refconv.testing.mpirun import mpi_test  # noqa: E402

comm = MPI.COMM_WORLD


def _in_shared_folder(check, *args):
    """``check(comm, folder, *args)`` in one fresh folder, named by rank 0, removed once all are done."""
    folder = comm.bcast(tempfile.mkdtemp(prefix="refconv-ck-") if comm.rank == 0 else None, root=0)
    try:
        check(comm, folder, *args)
    finally:
        comm.Barrier()                      # everyone has finished reading
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


@mpi_test(sizes=(2, 3), timeout=60)
def test_reshard_between_grids_and_algorithms():
    """Real MPI: each process writes and reads its own shard files."""
    _in_shared_folder(checks.reshard_between_grids)


@mpi_test(sizes=(2,), timeout=60)
def test_reshard_to_a_different_world_size():
    """Real MPI: the one-rank side is the real MPI.COMM_SELF."""
    _in_shared_folder(checks.reshard_to_one_rank, MPI.COMM_SELF)


@mpi_test(sizes=(2, 3), timeout=60)
def test_corrupt_or_missing_shard_raises_on_every_rank():
    """Real MPI: a damaged file seen by separate processes raises on each, none left waiting."""
    _in_shared_folder(checks.damaged_shard_raises)


@mpi_test(sizes=(2, 3), timeout=60)
def test_a_nonfinite_tensor_is_never_saved():
    """Real MPI: one process's NaN stops every process's save before any file is written."""
    _in_shared_folder(checks.nonfinite_never_saved)
