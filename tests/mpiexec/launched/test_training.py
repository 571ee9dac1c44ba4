"""``refconv.train`` under mpiexec: what simulated ranks cannot show.

tests/on_ranks/test_training.py checks distributed training against the one-rank twin at 2 to
8 simulated ranks, every algorithm, spatial and mixed grids, evaluation and the last batches of
every remainder.  Here, at 4 real ranks, what needs processes: ``train`` on every rank of
``MPI.COMM_WORLD``, where it watches for a rank that leaves early (``refconv.failure.training``
does nothing on simulated ranks), against its one-rank run on the real ``MPI.COMM_SELF``, on
training sets of every remainder; and the abort hook that ``import refconv`` installs in each
process of a job of several ranks.
"""

import os
import shutil
import sys
import tempfile

import numpy
from mpi4py import MPI

from refconv import datasets, failure
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import train
from refconv.train_config import TrainConfig

comm = MPI.COMM_WORLD


# -- batches of any size (issue 11): a last batch smaller than the sample split ----------------------
@mpi_test(sizes=(4,), timeout=240)
def test_training_runs_of_every_remainder_match_one_rank():
    """``train`` of the digits CNN on sample=4 at batch 4 with training sets of every size mod 4
    and test sets of 2, 3, 4 and 5 samples: the same losses (float64) and accuracy as the run on
    one rank.  (tests/on_ranks/test_training.py runs the same with a model of every layer kind.)"""
    x, y, _, _ = datasets.load_digits(upsample=1)
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    for n in (16, 17, 18, 19, 20, 24, 28):          # train 14..23 samples, test 2..5 (see datasets.split)
        path = os.path.join(folder, f"d{n}.npz")
        if comm.rank == 0:
            numpy.savez(path, x=x[:n], y=y[:n])
        comm.Barrier()
        cfg = dict(model="digits-cnn", data=path, batch_size=4, epochs=2, dtype="float64", backend="numpy",
                   progress=False, seed=3)
        dist = train(TrainConfig(**cfg, grid={"sample": 4}), log=lambda *a: None)
        one = train(TrainConfig(**cfg), comm=MPI.COMM_SELF, log=lambda *a: None) if comm.rank == 0 else None
        one = comm.bcast(None if one is None else (one["losses"], one["accuracy"]), root=0)
        rel = numpy.abs(numpy.subtract(dist["losses"], one[0])) / numpy.abs(one[0])
        assert_all_ranks(comm, len(dist["losses"]) == len(one[0]) and rel.max() < 1e-6 and
                         dist["accuracy"] == one[1], f"{n} samples: {dist['losses']} vs {one[0]}, "
                                                     f"accuracy {dist['accuracy']} vs {one[1]}")
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)


@mpi_test(sizes=(4,), timeout=60)
def test_import_refconv_installs_the_abort_hook_under_several_ranks():
    """Real MPI: the hook belongs to each process of a job of several ranks; simulated ranks share one."""
    assert_all_ranks(comm, failure.installed() and sys.excepthook is failure._report_and_abort,
                     f"import refconv under {comm.size} ranks left sys.excepthook alone")
