"""Overlapped communication: the nonblocking collectives, and gradient allreduces left in
flight behind backward, give the same bits as the blocking path and record what they overlap,
on simulated ranks (refconv.simulated) of 1 to 8.  tests/mpiexec/launched/test_overlap.py runs the
nonblocking calls under real MPI progress (the same function), and the gradient buckets.

The blocking path is the oracle: every comparison here is exact (``array_equal``), since
both paths make the same MPI calls in the same order (refconv/algorithms/base.py,
``segmented_allreduce``).
"""

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import collectives as coll
from refconv import simulated
from refconv.algorithms.base import BEHIND_EXCHANGE, BEHIND_NEXT, BEHIND_RETURN, BEHIND_RETURN_OWN, BEHIND_RETURN_WHOLE
from refconv.grid import AXES, ProcessGrid
from refconv.layers import DistConv2d
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks, assert_close
from refconv.testing.check import reduction_lengths, run_layer
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem, dist_conv_cases
from refconv.train import step

ALL = (1, 2, 3, 4, 5, 6, 7, 8)


def _recorded(run):
    with coll.stats.recording() as region:
        out = run()
    return out, region.records


@on_ranks(*ALL)
def test_each_nonblocking_call_gives_its_blocking_result_and_records_its_overlap(comm):
    nonblocking_calls_give_their_blocking_results(comm)


def nonblocking_calls_give_their_blocking_results(comm):
    """Each nonblocking collective, polled with ``test()`` until done: its blocking call's result
    and calls, recorded with its overlap.  Collective (tests/mpiexec/launched/test_overlap.py runs it too)."""
    r, p = comm.rank, comm.size
    rng = numpy.random.default_rng(r)
    x = rng.standard_normal((3, 2 * p + 1, 4))                      # (outer, L, inner)
    counts = [2 + (q == 0) for q in range(p)]                        # uneven: rank 0 holds one more
    mine = numpy.ascontiguousarray(x[:, sum(counts[:r]):sum(counts[:r + 1])])
    peers = [q for q in (r - 1, r, r + 1) if 0 <= q < p]
    sends = {q: numpy.full((2, q + 1), 10.0 * r + q) for q in peers}
    problems = []
    for name, blocking, start in [
        ("allreduce", lambda: coll.allreduce(comm, x),
         lambda: coll.iallreduce_(comm, x.copy(), overlap="test")),
        ("reduce_scatter", lambda: coll.reduce_scatter(comm, x, counts, axis=1),
         lambda: coll.ireduce_scatter(comm, x, counts, axis=1, overlap="test")),
        ("allgather", lambda: coll.allgather(comm, mine, counts, axis=1),
         lambda: coll.iallgather(comm, mine, counts, axis=1, overlap="test")),
        ("halo", lambda: coll.exchange(comm, sends, {q: (2, r + 1) for q in peers}, numpy.float64),
         lambda: coll.iexchange(comm, sends, {q: (2, r + 1) for q in peers}, numpy.float64, overlap="test")),
    ]:
        expected, blocking_records = _recorded(blocking)
        request, started = _recorded(start)
        while not request.test():                                   # MPI_Test polling until it is done
            coll.progress()
        got = request.wait()
        if request.wait() is not got:
            problems.append(f"{name}: a second wait() gave another result")
        same = (sorted(got) == sorted(expected) and all(numpy.array_equal(got[q], expected[q]) for q in got)) \
            if isinstance(got, dict) else numpy.array_equal(got, expected)
        if not same:
            problems.append(f"{name}: {got} != {expected}")
        moved = lambda calls: [(c.kind, c.bytes, c.messages) for c in calls]  # noqa: E731
        if moved(started) != moved(blocking_records):
            problems.append(f"{name}: started {started}, blocking {blocking_records}")
        if [c.overlap for c in started] != ["test"] or [c.overlap for c in blocking_records] != [""]:
            problems.append(f"{name}: overlap recorded {started} / {blocking_records}")
    assert_all_ranks(comm, not problems and coll.progress() == 0, str(problems))


def _layer_run(comm, case, overlap):
    """forward and backward of a fresh layer; returns (y, dx, dw, db, calls recorded, records())."""
    grid = ProcessGrid(comm, **case.grid_kwargs())
    layer = DistConv2d(case.problem.C, case.problem.F, (case.problem.Kh, case.problem.Kw), grid=grid,
                       backend="numpy", **case.layer_kwargs())
    layer.overlap_gradients = layer.overlap_halo = overlap
    x, w, b, dy = case.problem.arrays(0)
    layer.set_global_parameters(w, b)
    layer.bind(x.shape)

    def run():
        y_loc = layer.forward(layer.input_distribution.extract(x, grid.rank))
        dx_loc = layer.backward(layer.output_distribution.extract(dy, grid.rank))
        return y_loc, dx_loc

    (y_loc, dx_loc), calls = _recorded(run)
    in_flight = coll.progress()     # the gradients' allreduces may still be in flight here
    out = (y_loc, dx_loc, layer.weight_grad, layer.bias_grad, calls, layer.records(), in_flight)
    grid.free()
    return out


def _layer_overlap(comm, case):
    blocking, overlapped = _layer_run(comm, case, False), _layer_run(comm, case, True)
    problems = [name for name, a, b in zip(("y", "dx", "dw", "db"), blocking, overlapped)
                if not (a is None and b is None or numpy.array_equal(a, b))]
    records = overlapped[5]
    marked = [c.kind == "allreduce" and c.grad for c in records]
    if [c.kind == "allreduce" and bool(c.overlap) for c in overlapped[4]] != marked:
        problems.append(f"overlapped calls {overlapped[4]} vs records {records}")
    if any(c.overlap for c in blocking[4]):
        problems.append(f"the blocking run recorded an overlap: {blocking[4]}")
    if blocking[6] != 0:
        problems.append(f"the blocking run left {blocking[6]} calls in flight")
    assert_all_ranks(comm, not problems, f"{case}: {problems}")


@on_ranks(*ALL)
@settings(max_examples=30)
@given(st.data())
def test_a_layer_with_its_gradient_allreduce_in_flight_gives_the_blocking_bits(ranks, data):
    """Every algorithm, drawn grids and problems, with the gradient and halo overlaps on and off:
    the same y, dx, dw and db, bit for bit; the overlapped allreduces are exactly the ones
    ``records()`` marks ``grad``, and only with overlap on."""
    case = data.draw(dist_conv_cases(ranks, dtypes=("float32", "float64"), grouped_channel_split=True))
    simulated.run(_layer_overlap, ranks, args=(case,))


# grids per world size for the training comparison: every algorithm where it can run
GRIDS = {1: [({"sample": 1}, "stationary-x")],
         2: [({"sample": 2}, "stationary-x"), ({"channel": 2}, "stationary-x"), ({"channel": 2}, "stationary-y"),
             ({"height": 2}, "stationary-x")],
         3: [({"sample": 3}, "stationary-x"), ({"channel": 3}, "stationary-y"), ({"height": 3}, "stationary-x")],
         4: [({"sample": 2, "channel": 2}, "stationary-x"), ({"sample": 2, "channel": 2}, "stationary-y"),
             ({"channel": 4}, "stationary-w"), ({"height": 2, "width": 2}, "stationary-x")],
         6: [({"sample": 2, "channel": 3}, "stationary-y"), ({"channel": 2, "height": 3}, "stationary-x")],
         8: [({"sample": 2, "channel": 2, "height": 2}, "stationary-y"), ({"channel": 4, "height": 2}, "stationary-w"),
             ({"sample": 2, "channel": 4}, "stationary-x")]}
STEPS = 3


def train_steps(comm, grid, algorithm, overlap, bucket=None):
    """STEPS steps of the digits CNN on ``grid``: (losses, parameters, (allreduces that overlapped,
    the gradients' calls records() marks, calls unbucketed and in buckets of ``bucket`` bytes or None)).
    tests/mpiexec/launched/test_overlap.py trains with buckets through it."""
    model = Model.from_spec("digits-cnn", comm=comm, backend="numpy", seed=0,
                            defaults={"grid": grid, "algorithm": algorithm}).set_overlap(overlap)
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 16, 16)).astype(numpy.float32), rng.integers(0, 10, 8)
    optimizer = SGD(model.bind(x.shape), 0.1, momentum=0.9, weight_decay=1e-4)
    model.set_buckets(bucket)
    losses = [step(model, optimizer, x, y) for _ in range(STEPS - 1)]
    loss, calls = _recorded(lambda: step(model, optimizer, x, y))
    overlapped = sorted((c.kind, c.comm_size, c.bytes) for c in calls if c.overlap and c.kind == "allreduce")
    marked = sorted((c.kind, c.comm_size, c.bytes) for c in model.records() if c.grad) if overlap else []
    counts = [len(model.set_buckets(b).bucket_plan()[0]) for b in (0, bucket)] if bucket is not None else None
    model.close()
    return losses + [loss], [layer.parameters()[p].copy() for _, layer, p in model.named_parameters()], \
        (overlapped, marked, counts)


@on_ranks(*GRIDS)
def test_training_with_the_gradient_allreduce_overlapped_gives_the_blocking_bits(comm):
    """The same losses and parameters, bit for bit, with every overlap on and off; with it on,
    the allreduces that ran behind compute are exactly the ones the model's ``records()`` marks
    (``grad``: the gradients'); batch normalization's and the loss's are waited for at once."""
    problems = []
    for grid, algorithm in GRIDS[comm.size]:
        (l0, p0, c0), (l1, p1, c1) = train_steps(comm, grid, algorithm, False), train_steps(comm, grid, algorithm, True)
        if l0 != l1 or not all(numpy.array_equal(a, b) for a, b in zip(p0, p1)):
            problems.append(f"{grid} {algorithm}: losses {l0} vs {l1}")
        for what, (made, marked, _) in (("blocking", c0), ("overlapped", c1)):
            if made != marked:  # the model's records() mark (grad) exactly the calls that overlapped
                problems.append(f"{grid} {algorithm} {what}: overlapped {made}, records() mark {marked}")
    assert_all_ranks(comm, not problems, str(problems))


# -- the halo: interior behind the exchange, backward-filter behind the return -------------------------
def _halo_run(comm, problem, shape, algorithm, p_f, overlap):
    """``(actual, expected, exchange records of forward, the layer's halo)`` of one forward and backward."""
    grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
    layer = DistConv2d(problem.C, problem.F, (problem.Kh, problem.Kw), stride=problem.stride,
                       padding=problem.padding, dilation=problem.dilation, padding_mode=problem.padding_mode,
                       grid=grid, algorithm=algorithm, filter_groups=p_f, backend="numpy", dtype=problem.dtype)
    layer.overlap_halo = overlap
    (actual, expected), calls = _recorded(lambda: run_layer(layer, problem))
    halo = layer._algo.halo
    grid.free()
    return actual, expected, [c for c in calls if c.kind == "halo" or c.kind == "reduce_scatter" and c.overlap], halo


# (problem, [(grid shape, algorithm, p_f)]) at 4 ranks: H and W split together, with X, Y and W
HALO_CASES = [
    (ConvProblem(N=2, C=4, F=6, H=13, W=12, Kh=3, Kw=3, padding=(1, 1)),
     [((1, 1, 2, 2), "stationary-x", None), ((1, 2, 2, 1), "stationary-x", None),
      ((1, 2, 1, 2), "stationary-y", None), ((2, 1, 2, 1), "stationary-x", None), ((1, 2, 2, 1), "stationary-w", 2)]),
    (ConvProblem(N=1, C=4, F=4, H=16, W=14, Kh=3, Kw=5, stride=(2, 1), padding=(2, 2), dilation=(2, 1),
                 padding_mode="reflect"),
     [((1, 1, 2, 2), "stationary-x", None), ((1, 2, 2, 1), "stationary-y", None)]),
    (ConvProblem(N=1, C=4, F=4, H=14, W=14, Kh=3, Kw=3, padding=(1, 1), padding_mode="circular"),
     [((1, 4, 1, 1), "stationary-w", 2), ((1, 1, 4, 1), "stationary-x", None)]),
]


@on_ranks(4)
def test_halo_overlap_computes_the_interior_behind_the_exchange_and_gives_the_blocking_results(comm):
    """Forward, backward-data and backward-filter match the reference, and are the blocking run's
    bits.  The forward exchange records the overlap exactly where the halo has an interior to
    compute, the return where backward-data is split, and Stationary-Y's and -W's reduce-scatter
    of dx runs behind backward-filter."""
    problems = []
    for problem, runs in HALO_CASES:
        for shape, algorithm, p_f in runs:
            (a0, e0, calls0, _), (a1, e1, calls1, halo) = (_halo_run(comm, problem, shape, algorithm, p_f, on)
                                                           for on in (False, True))
            what = f"{problem} on {shape} {algorithm}"
            try:
                lengths = reduction_lengths(problem)  # dw and db sum N Ho Wo products, not C Kh Kw
                for name in ("y", "dx", "dw", "db"):
                    assert_close(a1[name], e1[name], reduction_length=lengths[name], name=f"{what} {name}")
            except AssertionError as exc:
                problems.append(str(exc))
            if not all(numpy.array_equal(a0[n], a1[n]) for n in ("y", "dx", "dw", "db")):
                problems.append(f"{what}: backward differs from the blocking run")
            # backward-filter behind the reduce-scatter of dx
            behind_next = algorithm in ("stationary-y", "stationary-w")
            wanted = []
            if halo.size > 1 and behind_next:  # then only the own cells of backward-data behind the return
                wanted = [BEHIND_EXCHANGE if halo.interior else "", BEHIND_RETURN_OWN if halo.interior else ""]
            elif halo.size > 1:
                wanted = [BEHIND_EXCHANGE if halo.interior else "",
                          BEHIND_RETURN if halo.interior else BEHIND_RETURN_WHOLE]
            wanted += [BEHIND_NEXT] if behind_next else []
            if [c.overlap for c in calls1] != wanted:
                problems.append(f"{what}: recorded {[c.overlap for c in calls1]}, expected {wanted}")
            if any(c.overlap for c in calls0):
                problems.append(f"{what}: the blocking run recorded an overlap")
    assert_all_ranks(comm, not problems, "\n".join(problems))


@on_ranks(2, 3, 4, 8)
def test_a_block_too_small_for_the_halo_overlap_falls_back_and_says_why(comm):
    """Forward's interior and backward-data's split into the cells sent back and the own cells
    are both skipped for a block too small (only backward-filter then runs behind the return),
    and both taken for a large one: what the exchange and the return record says which."""
    P = comm.size
    small = ConvProblem(N=1, C=2, F=2, H=2 * P, W=4, Kh=3, Kw=3, padding=(1, 1))   # 2 rows a rank, 1-2 need the halo
    large = ConvProblem(N=1, C=2, F=2, H=8 * P, W=4, Kh=3, Kw=3, padding=(1, 1))   # 8 rows, at most 2 do
    _, _, small_calls, small_halo = _halo_run(comm, small, (1, 1, P, 1), "stationary-x", None, True)
    _, _, large_calls, large_halo = _halo_run(comm, large, (1, 1, P, 1), "stationary-x", None, True)
    ok = (small_halo.interior is None and "too small a block" in small_halo.no_overlap
          and [c.overlap for c in small_calls] == ["", BEHIND_RETURN_WHOLE]
          and large_halo.interior is not None and large_halo.no_overlap is None
          and [c.overlap for c in large_calls] == [BEHIND_EXCHANGE, BEHIND_RETURN])
    assert_all_ranks(comm, ok, f"small: {small_halo.interior} {small_halo.no_overlap!r} {small_calls}; "
                               f"large: {large_halo.interior} {large_halo.no_overlap!r} {large_calls}")
