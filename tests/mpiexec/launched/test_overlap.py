"""Overlapped communication under real MPI progress: what simulated ranks cannot show.

tests/on_ranks/test_overlap.py checks every overlap on simulated ranks of 1 to 8, where a
nonblocking call's data moves when the last rank reaches it.  Here, at one size (3 ranks,
uneven blocks, a rank with two neighbours), each nonblocking call is polled with MPI_Test until
MPICH's own progress engine completes it, and must give its blocking result (the simulated
test's own function, run here on real ranks).  The gradient buckets stay here too: their
planner compares communicators with ``MPI.Comm.Compare``, which a simulated communicator does
not take, and so does ``refconv train``, whose gradients go in buckets.

The blocking path is the oracle: every comparison here is exact (``array_equal``), since
both paths make the same MPI calls in the same order (refconv/algorithms/base.py,
``segmented_allreduce``).
"""

import os
import sys

import numpy
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/: the package on_ranks
from on_ranks import test_overlap as checks  # noqa: E402
from refconv.layers import DistConv2d  # noqa: E402
from refconv.testing.asserts import assert_all_ranks  # noqa: E402
from refconv.testing.mpirun import mpi_test  # noqa: E402
from refconv.train import train  # noqa: E402
from refconv.train_config import TrainConfig  # noqa: E402

comm = MPI.COMM_WORLD
SIZE = 3


@mpi_test(sizes=(SIZE,), timeout=60)
def test_each_nonblocking_call_gives_its_blocking_result_and_records_its_overlap():
    """Real MPI: the calls complete by MPICH's progress, polled with MPI_Test, not when the last
    simulated rank arrives."""
    checks.nonblocking_calls_give_their_blocking_results(comm)


BUCKET_GRIDS = {3: ({"sample": 3}, "stationary-x")}


@mpi_test(sizes=(SIZE,), timeout=240)
def test_gradient_buckets_give_the_same_bits_blocking_and_overlapped_and_records_list_their_calls():
    """Packed into buckets of 1 MiB (several gradients in one), blocking and overlapped training
    give the same losses and parameters, bit for bit: both make the same bucket calls.  With
    overlap on, the allreduces that ran behind compute are exactly the bucket calls the model's
    ``records()`` lists, fewer than its gradients.  Real MPI: the bucket planner calls
    MPI.Comm.Compare, which simulated communicators do not take."""
    problems = []
    grid, algorithm = BUCKET_GRIDS[comm.size]
    (l0, p0, c0), (l1, p1, c1) = (checks.train_steps(comm, grid, algorithm, on, 2 ** 20) for on in (False, True))
    if l0 != l1 or not all(numpy.array_equal(a, b) for a, b in zip(p0, p1)):
        problems.append(f"losses {l0} vs {l1}")
    made, marked, (unbucketed, bucketed) = c1
    if made != marked or not 0 < len(made) == bucketed < unbucketed:
        problems.append(f"overlapped {made}, records() list {marked}; calls {bucketed} of {unbucketed} gradients")
    if c0[0]:
        problems.append(f"the blocking run overlapped {c0[0]}")
    assert_all_ranks(comm, not problems, str(problems))

@mpi_test(sizes=(SIZE,), timeout=240)
def test_refconv_train_overlaps_by_default_and_no_overlap_gives_the_same_run():
    """Real MPI: ``train`` packs the gradients into buckets (``--bucket-kib 64``), whose planner
    calls MPI.Comm.Compare, which simulated communicators do not take."""
    runs = {on: train(TrainConfig(grid={"sample": 1, "height": comm.size}, epochs=1, max_steps=3, batch_size=16,
                                  progress=False, bucket_kib=64, **({} if on else {"overlap": False})),
                      log=lambda *a: None)
            for on in (True, False)}  # --bucket-kib 64: the gradients in buckets on both paths
    flags = {on: [(layer.overlap_gradients, layer.overlap_halo) for _, layer in run["model"].named_layers()
                  if isinstance(layer, DistConv2d)] for on, run in runs.items()}
    ok = (runs[True]["losses"] == runs[False]["losses"] and flags[True] and all(all(f) for f in flags[True])
          and not any(any(f) for f in flags[False]) and runs[True]["model"].bucket_bytes == 64 * 1024)
    assert_all_ranks(comm, ok, f"losses {runs[True]['losses']} vs {runs[False]['losses']}; flags {flags}")
