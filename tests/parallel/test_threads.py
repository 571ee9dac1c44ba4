"""refconv.threads: who chooses the BLAS threads, and that the choice is applied."""

import types

import pytest
from mpi4py import MPI

from refconv import threads


def test_the_user_choice_wins_in_order():
    env = {"OPENBLAS_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}
    assert threads.user_threads(2, env) == (2, "--threads")
    assert threads.user_threads(None, env) == (3, "OPENBLAS_NUM_THREADS")
    assert threads.user_threads(None, {"OMP_NUM_THREADS": "4", **env}) == (4, "OMP_NUM_THREADS")
    assert threads.user_threads(None, {"OMP_NUM_THREADS": " "}) == (None, None)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_value_names_its_source(value):
    with pytest.raises(ValueError, match="OMP_NUM_THREADS: expected a positive number of threads"):
        threads.user_threads(None, {"OMP_NUM_THREADS": value})
    with pytest.raises(ValueError, match="--threads"):
        threads.user_threads(value, {})


def test_default_share_and_oversubscription():
    assert threads.default_threads(cores=2, ranks=2) == 1
    assert threads.default_threads(cores=16, ranks=4) == 4
    assert threads.default_threads(cores=2, ranks=4) == 1  # never 0
    assert not threads.oversubscribed(1, cores=2, ranks=2)
    assert threads.oversubscribed(2, cores=2, ranks=2)


def test_configure_applies_and_describes_the_choice():
    cores, ranks = threads.node_layout(MPI.COMM_SELF)
    assert ranks == 1 and cores >= 1
    before = threads.current()
    try:
        choice = threads.configure(MPI.COMM_SELF, environ={})
        assert choice.source == "default" and choice.threads == cores
        assert choice.describe() == f"BLAS threads per rank: {cores} ({cores} cores / 1 rank on this node)"
        choice = threads.configure(MPI.COMM_SELF, environ={"OMP_NUM_THREADS": "1"})
        assert (choice.threads, choice.source) == (1, "OMP_NUM_THREADS")
        assert "set by OMP_NUM_THREADS" in choice.describe()
        assert set(threads.current().values()) == {1}  # every loaded pool, numpy's OpenBLAS included
    finally:
        for library, n in before.items():  # leave the process as the test found it
            threads.limit(n)


def test_match_gives_torch_the_blas_pools_count():
    # threads.match hands a library imported after configure (torch) the count the pools have.
    before = threads.current()
    told = []
    try:
        threads.limit(1)
        threads.match(types.SimpleNamespace(set_num_threads=told.append))
        assert told == [1]
    finally:
        for library, n in before.items():
            threads.limit(n)
