"""Every wrapper in refconv.collectives, uneven counts, expected values derived from the size,
on 1 to 8 simulated ranks (refconv.simulated).

Each check is a function of the rank's communicator; tests/mpiexec/launched/test_collectives.py runs the same
functions under mpiexec at 2 and 3 ranks, the real check of the wrappers against MPI.  Two
checks live there only, because only a real MPI shows what they check: the MPI datatypes' cache
(``test_block_types_of_a_call_outlive_the_cache_limit``) and the copies the datatypes avoid
(``test_split_axis_copies_nothing_it_can_avoid``: tracemalloc counts the whole process, every
rank thread and the simulated world's own buffers with it).  So does ``test_timeout_setting``:
the deadline is the process's (``collectives.set_timeout``), one for every rank thread.
"""

import itertools

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import collectives as coll
from refconv import simulated
from refconv.testing.asserts import assert_all_ranks, close_message, collective_assert_close
from refconv.testing.ranks import on_ranks

ALL = (1, 2, 3, 4, 5, 6, 7, 8)


def allreduce_sum_max_noncontiguous(comm):
    r, p = comm.rank, comm.size
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


def reduce_scatter_uneven_any_axis(comm):
    r, p = comm.rank, comm.size
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


def allgather_uneven(comm):
    r, p = comm.rank, comm.size
    counts = [q + 1 for q in range(p)]
    x = numpy.full((2, r + 1, 3), r, dtype=numpy.int64)
    out = coll.allgather(comm, x, counts, axis=1)
    expected = numpy.concatenate([numpy.full((2, q + 1, 3), q) for q in range(p)], axis=1)
    assert_all_ranks(comm, numpy.array_equal(out, expected), f"got {out}")
    # a zero-length block is allowed
    counts = [0 if q == 0 else 2 for q in range(p)]
    y = coll.allgather(comm, numpy.full((counts[r],), r, numpy.int32), counts)
    assert_all_ranks(comm, numpy.array_equal(y, numpy.repeat(numpy.arange(p), counts)), str(y))


def split_axis_every_layout(comm):
    """reduce_scatter and allgather along axes 0, 1, 3 and -1 of a 4-d array, float32, float64
    and int16, uneven counts (a zero-length block too) and even ones (allgather's Allgather
    branch), contiguous and strided input: all match numpy.  An axis out of range is named."""
    r, p = comm.rank, comm.size
    problems = []
    layouts = ([q % 3 + 1 for q in range(p)], [0] + [2] * (p - 1), [2] * p)   # the last even: Allgather
    for dtype, axis, counts in itertools.product((numpy.float32, numpy.float64, numpy.int16), (0, 1, 3, -1),
                                                 layouts):
        problems += _split_axis_problems(comm, dtype, axis, counts)
    for call in (coll.reduce_scatter, coll.allgather):
        try:
            call(comm, numpy.zeros((2, p)), [1] * p, axis=2)
            problems.append(f"{call.__name__}: no error for axis=2 of a 2-d x")
        except ValueError as exc:
            if "axis must be an int in [-2, 2) for x of shape (2, " not in str(exc):
                problems.append(str(exc))
    assert_all_ranks(comm, not problems, str(problems))


def _split_axis_problems(comm, dtype, axis, counts, shape=(2, 3, 2, 3)):
    """What reduce_scatter and allgather of ``counts`` along ``axis`` of a ``shape`` array get wrong
    (the length along ``axis`` is ``sum(counts)``), contiguous and strided input, against numpy."""
    r, p = comm.rank, comm.size
    L, start = sum(counts), sum(counts[:r])
    shape = list(shape)
    shape[axis] = L
    full = numpy.arange(numpy.prod(shape), dtype=dtype).reshape(shape) % 11
    mine = numpy.take(full, numpy.arange(start, start + counts[r]), axis=axis)
    strided = numpy.repeat(full * (r + 1), 2, axis=-1)[..., ::2]  # not contiguous
    problems = []
    for x in (full * (r + 1), strided):
        got = coll.reduce_scatter(comm, x, counts, axis=axis)
        if got.dtype != dtype or not got.flags.c_contiguous or \
                close_message(got, mine * (p * (p + 1) // 2), reduction_length=p):
            problems.append(f"reduce_scatter {numpy.dtype(dtype).name} axis={axis} counts={counts}")
    gathered = coll.allgather(comm, numpy.repeat(mine, 2, axis=-1)[..., ::2], counts, axis=axis)
    if gathered.dtype != dtype or not gathered.flags.c_contiguous or not numpy.array_equal(gathered, full):
        problems.append(f"allgather {numpy.dtype(dtype).name} axis={axis} counts={counts}")
    return problems


def exchange_reaches_two_neighbours(comm):
    r, p = comm.rank, comm.size
    peers = [q for q in (r - 2, r - 1, r, r + 1, r + 2) if 0 <= q < p]
    sends = {q: numpy.full((q + 1,), 100 * r + q, numpy.float64) for q in peers}
    got = coll.exchange(comm, sends, {q: (r + 1,) for q in peers}, numpy.float64)
    ok = sorted(got) == peers and all(
        numpy.array_equal(got[q], numpy.full((r + 1,), 100 * q + r)) for q in peers)
    assert_all_ranks(comm, ok, f"got {got}")


def alltoallv_uneven(comm):
    r, p = comm.rank, comm.size
    send = [numpy.full((r + 1, q + 1), 10 * r + q, numpy.float32) for q in range(p)]
    got = coll.alltoallv(comm, send, [(s + 1, r + 1) for s in range(p)])
    ok = all(numpy.array_equal(got[s], numpy.full((s + 1, r + 1), 10 * s + r)) for s in range(p))
    assert_all_ranks(comm, ok, f"got {got}")


def bcast_scatter_gather(comm):
    r, p = comm.rank, comm.size
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


def stats_exact_figures(comm):
    r, p = comm.rank, comm.size
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


# the checks above, on every size of simulated world (tests/mpiexec/launched/test_collectives.py runs them under mpiexec)
test_allreduce_sum_max_noncontiguous = on_ranks(*ALL)(allreduce_sum_max_noncontiguous)
test_reduce_scatter_uneven_any_axis = on_ranks(*ALL)(reduce_scatter_uneven_any_axis)
test_allgather_uneven = on_ranks(*ALL)(allgather_uneven)
test_split_axis_every_layout = on_ranks(*ALL)(split_axis_every_layout)
test_exchange_reaches_two_neighbours = on_ranks(*ALL)(exchange_reaches_two_neighbours)
test_alltoallv_uneven = on_ranks(*ALL)(alltoallv_uneven)
test_bcast_scatter_gather = on_ranks(*ALL)(bcast_scatter_gather)
test_stats_exact_figures = on_ranks(*ALL)(stats_exact_figures)


@st.composite
def split_cases(draw, ranks):
    """(dtype, axis, counts, shape): a split of one axis of a 1- to 4-d array into ``ranks``
    blocks of drawn lengths, zero-length ones among them."""
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    axis = draw(st.integers(-ndim, ndim - 1))
    counts = draw(st.lists(st.integers(0, 3), min_size=ranks, max_size=ranks))
    dtype = draw(st.sampled_from(("float32", "float64", "int16", "int64")))
    return numpy.dtype(dtype).type, axis, counts, tuple(shape)


def _check_split(comm, dtype, axis, counts, shape):
    problems = _split_axis_problems(comm, dtype, axis, counts, shape)
    assert_all_ranks(comm, not problems, str(problems))


@on_ranks(*ALL)
@settings(max_examples=30)
@given(st.data())
def test_split_axis_drawn(ranks, data):
    """reduce_scatter and allgather on drawn arrays, axes and block lengths (an empty block, or
    every block empty, too): both match numpy."""
    simulated.run(_check_split, ranks, args=data.draw(split_cases(ranks)))


@on_ranks(1, 2)
def test_stats_folds_old_records_into_exact_totals(comm):
    """A long run keeps only the recent records; summary() still counts every call since reset()."""
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
