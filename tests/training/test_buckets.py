"""Gradient buckets on one rank: which gradients share a bucket (``plan``), and that a bucket's
one call hands every gradient back whole (``Buckets``).  The multi-rank bits are checked in
tests/mpiexec/launched/test_overlap.py."""

import numpy
import pytest
from mpi4py import MPI

from refconv import collectives
from refconv.collectives.buckets import Buckets, plan

F32, F64 = numpy.dtype("float32"), numpy.dtype("float64")


def test_a_bucket_takes_consecutive_gradients_of_one_communicator_and_dtype_up_to_the_threshold():
    other = MPI.COMM_SELF.Dup()
    entries = [("a", MPI.COMM_SELF, 100, F32), ("b", MPI.COMM_SELF, 100, F32), ("c", MPI.COMM_SELF, 100, F32),
               ("d", MPI.COMM_SELF, 10, F64), ("e", other, 10, F64), ("f", other, 500, F64)]
    try:
        keys = lambda threshold: [b.keys for b in plan(entries, threshold)]  # noqa: E731
        assert keys(0) == [[k] for k in "abcdef"]                             # each its own: no buckets
        assert keys(200) == [["a", "b"], ["c"], ["d", "e", "f"]]              # closed at >= 200 bytes; dtype
        assert keys(10 ** 6) == [["a", "b", "c"], ["d", "e", "f"]]            # a Dup has the same ranks
        assert [b.nbytes for b in plan(entries, 10 ** 6)] == [300, 520]
        with pytest.raises(ValueError, match="threshold: expected bytes >= 0"):
            plan(entries, -1)
    finally:
        other.Free()


def test_a_bucket_starts_when_full_and_hands_each_gradient_back():
    rng = numpy.random.default_rng(0)
    grads = {k: rng.standard_normal(shape).astype(numpy.float32) for k, shape in (("w", (4, 3)), ("b", (4,)))}
    expected = {k: g.copy() for k, g in grads.items()}
    buckets = plan([(k, MPI.COMM_SELF, g.nbytes, g.dtype) for k, g in grads.items()], 10 ** 6)
    run = Buckets(buckets, overlap="test")
    with collectives.stats.recording() as region:
        slot_w = run.add("w", grads["w"])
        with pytest.raises(RuntimeError, match="waited for before all its gradients were added"):
            slot_w.wait()
        slot_b = run.add("b", grads["b"])                               # full: one call of both
    assert slot_w.wait() is grads["w"] and slot_b.wait() is grads["b"]
    assert all(numpy.array_equal(grads[k], expected[k]) for k in grads)  # one rank: the sum is itself
    assert [(r.kind, r.bytes, r.overlap) for r in region.records] == [("allreduce", 64, "test")]
