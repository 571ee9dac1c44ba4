"""Overlapped communication: the nonblocking collectives, and gradient allreduces left in
flight behind backward, give the same bits as the blocking path and record what they overlap.

The blocking path is the oracle: every comparison here is exact (``array_equal``), since
both paths make the same MPI calls in the same order (refconv/algorithms/base.py,
``segmented_allreduce``).
"""

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from refconv import collectives as coll
from refconv.grid import ProcessGrid
from refconv.layers import DistConv2d
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.testing.strategies import dist_conv_cases
from refconv.train import step

comm = MPI.COMM_WORLD
ALL = (1, 2, 3, 4)


def _recorded(run):
    with coll.stats.recording() as region:
        out = run()
    return out, region.records


@mpi_test(sizes=ALL, timeout=60)
def test_each_nonblocking_call_gives_its_blocking_result_and_records_its_overlap():
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
        if [(c.kind, c.bytes, c.messages) for c in started] != [(c.kind, c.bytes, c.messages) for c in blocking_records]:
            problems.append(f"{name}: started {started}, blocking {blocking_records}")
        if [c.overlap for c in started] != ["test"] or [c.overlap for c in blocking_records] != [""]:
            problems.append(f"{name}: overlap recorded {started} / {blocking_records}")
    assert_all_ranks(comm, not problems and coll.progress() == 0, str(problems))


def _layer_run(case, overlap):
    """forward and backward of a fresh layer; returns (y, dx, dw, db, calls recorded, records())."""
    grid = ProcessGrid(comm, **case.grid_kwargs())
    layer = DistConv2d(case.problem.C, case.problem.F, (case.problem.Kh, case.problem.Kw), grid=grid,
                       backend="numpy", **case.layer_kwargs())
    layer.overlap_gradients = overlap
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


@mpi_test(sizes=ALL, timeout=180)
@settings(max_examples=20)
@given(st.data())
def test_a_layer_with_its_gradient_allreduce_in_flight_gives_the_blocking_bits(data):
    """Every algorithm, drawn grids and problems: the same y, dx, dw and db, bit for bit; the
    overlapped calls are exactly the ones ``records()`` marks ``grad``, and only with overlap on."""
    case = data.draw(dist_conv_cases(comm.size, dtypes=("float32", "float64"), grouped_channel_split=True))
    blocking, overlapped = _layer_run(case, False), _layer_run(case, True)
    problems = [name for name, a, b in zip(("y", "dx", "dw", "db"), blocking, overlapped)
                if not (a is None and b is None or numpy.array_equal(a, b))]
    records = overlapped[5]
    marked = [c.kind == "allreduce" and c.grad for c in records]
    if [bool(c.overlap) for c in overlapped[4]] != marked:
        problems.append(f"overlapped calls {overlapped[4]} vs records {records}")
    if any(c.overlap for c in blocking[4]):
        problems.append(f"the blocking run recorded an overlap: {blocking[4]}")
    if blocking[6] != 0:
        problems.append(f"the blocking run left {blocking[6]} calls in flight")
    assert_all_ranks(comm, not problems, f"{case}: {problems}")


# grids per world size for the training comparison: every algorithm where it can run
GRIDS = {1: [({"sample": 1}, "stationary-x")],
         2: [({"sample": 2}, "stationary-x"), ({"channel": 2}, "stationary-x"), ({"channel": 2}, "stationary-y"),
             ({"height": 2}, "stationary-x")],
         3: [({"sample": 3}, "stationary-x"), ({"channel": 3}, "stationary-y"), ({"height": 3}, "stationary-x")],
         4: [({"sample": 2, "channel": 2}, "stationary-x"), ({"sample": 2, "channel": 2}, "stationary-y"),
             ({"channel": 4}, "stationary-w"), ({"height": 2, "width": 2}, "stationary-x")],
         8: [({"sample": 2, "channel": 2, "height": 2}, "stationary-y"), ({"channel": 4, "height": 2}, "stationary-w"),
             ({"sample": 2, "channel": 4}, "stationary-x")]}
STEPS = 3


def _train(grid, algorithm, overlap):
    model = Model.from_spec("digits-cnn", comm=comm, backend="numpy", seed=0,
                            defaults={"grid": grid, "algorithm": algorithm}).set_overlap(overlap)
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((8, 1, 16, 16)).astype(numpy.float32), rng.integers(0, 10, 8)
    optimizer = SGD(model.bind(x.shape), 0.1, momentum=0.9, weight_decay=1e-4)
    losses = [step(model, optimizer, x, y) for _ in range(STEPS)]
    return losses, [layer.parameters()[p].copy() for _, layer, p in model.named_parameters()]


@mpi_test(sizes=ALL + (8,), timeout=300)
def test_training_with_the_gradient_allreduce_overlapped_gives_the_blocking_bits():
    problems = []
    for grid, algorithm in GRIDS[comm.size]:
        (l0, p0), (l1, p1) = _train(grid, algorithm, False), _train(grid, algorithm, True)
        if l0 != l1 or not all(numpy.array_equal(a, b) for a, b in zip(p0, p1)):
            problems.append(f"{grid} {algorithm}: losses {l0} vs {l1}")
    assert_all_ranks(comm, not problems, str(problems))
