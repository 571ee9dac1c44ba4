"""Every wrapper in refconv.collectives under mpiexec: the real check against MPI, at 2 and 3 ranks.

tests/on_ranks/test_collectives.py holds the checks (functions of a communicator) and runs them
on 1 to 8 simulated ranks; here the same functions run on ``MPI.COMM_WORLD``.  The last three
tests check what only a real MPI shows, each says why in its docstring.
"""

import tracemalloc

import numpy
from mpi4py import MPI

from refconv import collectives as coll
from refconv.collectives import staging
from refconv.testing.asserts import assert_all_ranks, collective_assert_close
from refconv.testing.mpirun import mpi_test

from on_ranks_checks import load

SIZES = (2, 3)
checks = load("test_collectives")


def _world():
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


def _on_world(check):
    """``check(MPI.COMM_WORLD)`` as a test of this file at SIZES."""
    def test():
        check(MPI.COMM_WORLD)

    test.__doc__ = check.__doc__
    return mpi_test(sizes=SIZES, timeout=60)(test)


test_allreduce_sum_max_noncontiguous = _on_world(checks.allreduce_sum_max_noncontiguous)
test_reduce_scatter_uneven_any_axis = _on_world(checks.reduce_scatter_uneven_any_axis)
test_allgather_uneven = _on_world(checks.allgather_uneven)
test_split_axis_every_layout = _on_world(checks.split_axis_every_layout)
test_exchange_reaches_two_neighbours = _on_world(checks.exchange_reaches_two_neighbours)
test_alltoallv_uneven = _on_world(checks.alltoallv_uneven)
test_bcast_scatter_gather = _on_world(checks.bcast_scatter_gather)
test_stats_exact_figures = _on_world(checks.stats_exact_figures)


@mpi_test(sizes=SIZES, timeout=60)
def test_split_axis_copies_nothing_it_can_avoid():
    """Traced by tracemalloc (numpy reports its buffers to it): MPI datatypes walk the
    blocks, so a call allocates its result (and reduce_scatter the blocks it sums) and no
    packed copy of x; and the result is a new array on any number of ranks, never a view of x.
    Real MPI only: it checks what MPI's datatypes save, and tracemalloc counts a whole process
    (on simulated ranks, every rank thread and the world's own buffers at once)."""
    comm, r, p = _world()
    mib = 2**20
    counts = [2 * mib // 4 // 64] * p                 # a 2 MiB float32 block per rank
    L = sum(counts)
    problems = []
    for axis, shape in ((0, (L, 64)), (1, (1, L, 64)), (1, (4, L, 16))):
        full = numpy.ones(shape, numpy.float32)
        mine = numpy.ones(shape[:axis] + (counts[r],) + shape[axis + 1:], numpy.float32)
        # what each call may allocate: its result, and reduce_scatter's all-to-all receives
        # every rank's copy of block r, the size of x; a packed x would come on top
        gathered_bytes = mine.nbytes + full.nbytes
        for name, call, x, allowed in (("reduce_scatter", coll.reduce_scatter, full, gathered_bytes),
                                       ("allgather", coll.allgather, mine, full.nbytes)):
            tracemalloc.start()
            out = call(comm, x, counts, axis=axis)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            if peak > allowed + mib // 2:
                problems.append(f"{name} axis={axis} {shape}: peak {peak} B, allowed {allowed} B")
            if numpy.shares_memory(out, x):
                problems.append(f"{name} axis={axis} {shape}: the result is a view of x")
    assert_all_ranks(comm, not problems, str(problems))


@mpi_test(sizes=(3,), timeout=60)
def test_block_types_of_a_call_outlive_the_cache_limit():
    """With the cache of MPI datatypes kept to one, a call whose three ranks have three
    different block lengths (three datatypes) still hands MPI three live ones: the cache
    is trimmed after a call's datatypes are made, never below them.  Real MPI only: simulated
    ranks make no MPI datatypes (refconv.collectives.staging.block_types)."""
    comm, r, p = _world()
    kept = staging.BLOCK_TYPES_KEPT
    counts, start = [1, 2, 3], [0, 1, 3][r]
    full = numpy.arange(2 * 6 * 2, dtype=numpy.float64).reshape(2, 6, 2)  # (outer, L, inner)
    staging.BLOCK_TYPES_KEPT = 1
    try:
        gathered = coll.allgather(comm, full[:, start:start + counts[r]], counts, axis=1)
        summed = coll.reduce_scatter(comm, full, counts, axis=1)
    finally:
        staging.BLOCK_TYPES_KEPT = kept
    assert_all_ranks(comm, numpy.array_equal(gathered, full)
                     and numpy.array_equal(summed, p * full[:, start:start + counts[r]]),
                     f"gathered {gathered}, summed {summed}")


@mpi_test(sizes=SIZES, timeout=30)
def test_timeout_setting():
    """The deadline: validated alike on every rank, scoped by the context manager,
    and a collective that finishes in time is untouched by it.  Real MPI only: the deadline is
    the process's (refconv.collectives.watchdog), one for all the rank threads of a simulated
    world, where each rank's ``with timeout(...)`` would restore another's setting."""
    comm, r, p = _world()
    default = coll.env_timeout(coll.DEFAULT_TIMEOUT_S)     # several ranks: 300 s unless REFCONV_TIMEOUT says
    assert_all_ranks(comm, coll.get_timeout() == default, f"the default deadline is {coll.get_timeout()}")
    errors = []
    for bad in (-1, float("nan"), float("inf"), "5", True):
        try:
            coll.set_timeout(bad)
            errors.append(f"no error for {bad!r}")
        except ValueError as exc:
            if "timeout: expected seconds > 0" not in str(exc):
                errors.append(str(exc))
    assert_all_ranks(comm, not errors, str(errors))
    with coll.timeout(30):
        inside = coll.get_timeout()
        total = coll.allreduce(comm, numpy.ones(3))
        with coll.timeout(0):                        # 0: no deadline inside
            innermost = coll.get_timeout()
    assert_all_ranks(comm, (inside, innermost, coll.get_timeout()) == (30.0, None, default),
                     f"{inside}, {innermost}, {coll.get_timeout()}")
    collective_assert_close(comm, total, numpy.full(3, float(p)))
