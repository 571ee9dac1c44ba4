"""Every wrapper in refconv.collectives, uneven counts, expected values derived from the size."""

import itertools
import tracemalloc

import numpy
from mpi4py import MPI

from refconv import collectives as coll
from refconv.collectives import staging
from refconv.testing.asserts import assert_all_ranks, close_message, collective_assert_close
from refconv.testing.mpirun import mpi_test

ALL = (1, 2, 3, 4, 8)


def _world():
    comm = MPI.COMM_WORLD
    return comm, comm.Get_rank(), comm.Get_size()


@mpi_test(sizes=ALL)
def test_allreduce_sum_max_noncontiguous():
    comm, r, p = _world()
    base = numpy.arange(24, dtype=numpy.float64).reshape(4, 6)
    x = base * (r + 1)
    collective_assert_close(comm, coll.allreduce(comm, x), base * p * (p + 1) / 2)
    collective_assert_close(comm, coll.allreduce(comm, x, op="max"), base * p)
    y = coll.allreduce(comm, x[:, ::2])            # packed first
    collective_assert_close(comm, y, base[:, ::2] * p * (p + 1) / 2)
    z = x.copy()
    coll.allreduce_(comm, z)
    collective_assert_close(comm, z, base * p * (p + 1) / 2)
    out = numpy.full_like(x, numpy.nan)
    assert_all_ranks(comm, coll.allreduce(comm, x, out=out) is out, "allreduce(out=) must return out")
    collective_assert_close(comm, out, base * p * (p + 1) / 2)
    try:
        coll.allreduce(comm, x, out=numpy.empty((2, 2)))
        message = "no error for a wrongly shaped out"
    except ValueError as exc:
        message = "" if "out must have x's shape" in str(exc) else str(exc)
    assert_all_ranks(comm, not message, message)


@mpi_test(sizes=ALL)
def test_reduce_scatter_uneven_any_axis():
    comm, r, p = _world()
    counts = [i % 3 + 1 for i in range(p)]           # uneven: 1, 2, 3, 1, ...
    L = sum(counts)
    start = sum(counts[:r])
    base = numpy.arange(3 * L * 2, dtype=numpy.float32).reshape(3, L, 2)
    out = coll.reduce_scatter(comm, base * (r + 1), counts, axis=1)
    collective_assert_close(comm, out, base[:, start:start + counts[r]] * (p * (p + 1) / 2),
                            reduction_length=p)
    out0 = coll.reduce_scatter(comm, base.transpose(1, 0, 2) * (r + 1), counts, axis=0)
    collective_assert_close(comm, out0, base.transpose(1, 0, 2)[start:start + counts[r]]
                            * (p * (p + 1) / 2), reduction_length=p)


@mpi_test(sizes=ALL)
def test_allgather_uneven():
    comm, r, p = _world()
    counts = [q + 1 for q in range(p)]
    x = numpy.full((2, r + 1, 3), r, dtype=numpy.int64)
    out = coll.allgather(comm, x, counts, axis=1)
    expected = numpy.concatenate([numpy.full((2, q + 1, 3), q) for q in range(p)], axis=1)
    assert_all_ranks(comm, numpy.array_equal(out, expected), f"got {out}")
    # a zero-length block is allowed
    counts = [0 if q == 0 else 2 for q in range(p)]
    y = coll.allgather(comm, numpy.full((counts[r],), r, numpy.int32), counts)
    assert_all_ranks(comm, numpy.array_equal(y, numpy.repeat(numpy.arange(p), counts)), str(y))


@mpi_test(sizes=(1, 2, 3), timeout=60)
def test_split_axis_every_layout():
    """reduce_scatter and allgather along axes 0, 1, 3 and -1 of a 4-d array, float32, float64
    and int16, uneven counts (a zero-length block too) and even ones (allgather's Allgather
    branch), contiguous and strided input: all match numpy.  An axis out of range is named."""
    comm, r, p = _world()
    problems = []
    layouts = ([q % 3 + 1 for q in range(p)], [0] + [2] * (p - 1), [2] * p)   # the last even: Allgather
    for dtype, axis, counts in itertools.product((numpy.float32, numpy.float64, numpy.int16), (0, 1, 3, -1),
                                                 layouts):
        L, start = sum(counts), sum(counts[:r])
        shape = [2, 3, 2, 3]
        shape[axis] = L
        full = numpy.arange(numpy.prod(shape), dtype=dtype).reshape(shape) % 11
        mine = numpy.take(full, numpy.arange(start, start + counts[r]), axis=axis)
        strided = numpy.repeat(full * (r + 1), 2, axis=-1)[..., ::2]  # not contiguous
        for x in (full * (r + 1), strided):
            got = coll.reduce_scatter(comm, x, counts, axis=axis)
            if got.dtype != dtype or not got.flags.c_contiguous or \
                    close_message(got, mine * (p * (p + 1) // 2), reduction_length=p):
                problems.append(f"reduce_scatter {dtype.__name__} axis={axis} counts={counts}")
        gathered = coll.allgather(comm, numpy.repeat(mine, 2, axis=-1)[..., ::2], counts, axis=axis)
        if gathered.dtype != dtype or not gathered.flags.c_contiguous or \
                not numpy.array_equal(gathered, full):
            problems.append(f"allgather {dtype.__name__} axis={axis} counts={counts}")
    for call in (coll.reduce_scatter, coll.allgather):
        try:
            call(comm, numpy.zeros((2, p)), [1] * p, axis=2)
            problems.append(f"{call.__name__}: no error for axis=2 of a 2-d x")
        except ValueError as exc:
            if "axis must be an int in [-2, 2) for x of shape (2, " not in str(exc):
                problems.append(str(exc))
    assert_all_ranks(comm, not problems, str(problems))


@mpi_test(sizes=(1, 2, 3), timeout=60)
def test_split_axis_copies_nothing_it_can_avoid():
    """Traced by tracemalloc (numpy reports its buffers to it): MPI datatypes walk the
    blocks, so a call allocates its result (and reduce_scatter the blocks it sums) and no
    packed copy of x; and the result is a new array on any number of ranks, never a view of x."""
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
    is trimmed after a call's datatypes are made, never below them."""
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


@mpi_test(sizes=ALL)
def test_exchange_reaches_two_neighbours():
    comm, r, p = _world()
    peers = [q for q in (r - 2, r - 1, r, r + 1, r + 2) if 0 <= q < p]
    sends = {q: numpy.full((q + 1,), 100 * r + q, numpy.float64) for q in peers}
    got = coll.exchange(comm, sends, {q: (r + 1,) for q in peers}, numpy.float64)
    ok = sorted(got) == peers and all(
        numpy.array_equal(got[q], numpy.full((r + 1,), 100 * q + r)) for q in peers)
    assert_all_ranks(comm, ok, f"got {got}")


@mpi_test(sizes=ALL)
def test_alltoallv_uneven():
    comm, r, p = _world()
    send = [numpy.full((r + 1, q + 1), 10 * r + q, numpy.float32) for q in range(p)]
    got = coll.alltoallv(comm, send, [(s + 1, r + 1) for s in range(p)])
    ok = all(numpy.array_equal(got[s], numpy.full((s + 1, r + 1), 10 * s + r)) for s in range(p))
    assert_all_ranks(comm, ok, f"got {got}")


@mpi_test(sizes=ALL)
def test_bcast_scatter_gather():
    comm, r, p = _world()
    root = p - 1
    x = numpy.arange(7.0) if r == root else None
    got = coll.bcast(comm, x, root=root)
    assert_all_ranks(comm, numpy.array_equal(got, numpy.arange(7.0)), str(got))
    blocks = [numpy.full((q + 1, 2), q, numpy.int16) for q in range(p)] if r == root else None
    mine = coll.scatter(comm, blocks, (r + 1, 2), root=root)
    assert_all_ranks(comm, mine.dtype == numpy.int16 and numpy.array_equal(
        mine, numpy.full((r + 1, 2), r)), str(mine))
    back = coll.gather(comm, mine, [(q + 1, 2) for q in range(p)], root=root)
    if r == root:
        ok = all(numpy.array_equal(back[q], numpy.full((q + 1, 2), q)) for q in range(p))
    else:
        ok = back is None
    assert_all_ranks(comm, ok, str(back))


@mpi_test(sizes=ALL)
def test_stats_exact_figures():
    comm, r, p = _world()
    counts = [q + 1 for q in range(p)]
    L = sum(counts)
    with coll.stats.recording() as region:
        coll.allreduce(comm, numpy.zeros(10, numpy.float32))                      # 40 B
        coll.reduce_scatter(comm, numpy.zeros((L, 3)), counts)                    # 24 L B
        coll.allgather(comm, numpy.zeros((r + 1, 3), numpy.float32), counts)      # 12 L B
        below = {r + 1: numpy.zeros(5)} if r < p - 1 else {}
        above = {r - 1: (5,)} if r > 0 else {}
        coll.exchange(comm, below, above, numpy.float64)                          # 40 B or 0
        coll.alltoallv(comm, [numpy.zeros(q + 1, numpy.int32) for q in range(p)],
                       [(r + 1,)] * p)                                            # not self
    s = region.summary()
    expected = {
        "allreduce": {"calls": 1, "elements": 10, "bytes": 40},
        "reduce_scatter": {"calls": 1, "elements": 3 * L, "bytes": 24 * L},
        "allgather": {"calls": 1, "elements": 3 * L, "bytes": 12 * L},
        "halo": {"calls": 1, "elements": 5 if r < p - 1 else 0, "bytes": 40 if r < p - 1 else 0},
        "alltoallv": {"calls": 1, "elements": L - (r + 1), "bytes": 4 * (L - (r + 1))},
    }
    assert_all_ranks(comm, s == expected, f"summary {s} != {expected}")
    assert_all_ranks(comm, all(rec.comm_size == p for rec in region.records), "comm_size")
    assert_all_ranks(comm, coll.stats.records[-5:] == region.records, "global records")


@mpi_test(sizes=(1, 2), timeout=30)
def test_timeout_setting():
    """The deadline: validated alike on every rank, scoped by the context manager,
    and a collective that finishes in time is untouched by it."""
    comm, r, p = _world()
    assert_all_ranks(comm, coll.get_timeout() is None, "plain API use has no deadline")
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
    assert_all_ranks(comm, (inside, innermost, coll.get_timeout()) == (30.0, None, None),
                     f"{inside}, {innermost}, {coll.get_timeout()}")
    collective_assert_close(comm, total, numpy.full(3, float(p)))


@mpi_test(sizes=(1,), timeout=30)
def test_stats_folds_old_records_into_exact_totals():
    """A long run keeps only the recent records; summary() still counts every call since reset()."""
    comm = MPI.COMM_WORLD
    s = coll.CommStats()
    s.RECENT = 3
    with s.recording() as everything:                 # a region keeps every record: the oracle
        for i in range(20):
            s.add("halo" if i % 3 else "allreduce", 1 + i % 2, i, 4 * i)
    kept = len(s.records)
    ok = 3 <= kept < 6 and s.records == everything.records[-kept:]
    for moved_only in (False, True):
        ok = ok and s.summary(moved_only=moved_only) == everything.summary(moved_only=moved_only)
    s.reset()
    assert_all_ranks(comm, ok and s.summary() == {} and s.records == [], f"kept {kept}: {s.summary()}")
