"""Block-read training is in-memory training, bit for bit, on real MPI ranks (refconv.datastore,
issue 22): tests/on_ranks/test_datastore.py's check, run here by 2 processes.

The same digits are saved as an .npz (loaded whole on every rank, each rank extracting its block
of the global batch), as a directory of .npy shards and as an HDF5 file (each rank reading only
its block).  ``train`` on each must give exactly the same losses and test accuracy, on sample,
spatial and channel splits, with the next block read ahead and without, by the reader thread and
(on the first grid) by the reader process.  The simulated test makes the same runs at 1 to 8
simulated ranks, and checks the image folder and ``refconv bench data``; here, at one size, what
simulated ranks cannot: ``train`` with its default gradient buckets (their planner's
``MPI.Comm.Compare`` takes no simulated communicator), and reader processes started by real
ranks, each reading the files for its own process.
"""

import os
import shutil
import sys
import tempfile

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/: the package on_ranks
from on_ranks import test_datastore as checks  # noqa: E402
from refconv.testing.mpirun import mpi_test  # noqa: E402

comm = MPI.COMM_WORLD


@mpi_test(sizes=(2,), timeout=240)
def test_block_read_training_is_in_memory_training_bit_for_bit():
    """Real MPI: ``train`` with its default gradient buckets, and reader processes started by real ranks."""
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        checks.write_stores(folder)
    comm.Barrier()
    try:
        checks.block_reads_match_memory(comm, folder)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder)
