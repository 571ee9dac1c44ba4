"""Tutorial 2: one convolution layer on 4 MPI ranks, under every parallel algorithm.

Run from the repository root:

    mpiexec -n 4 python -m mpi4py tutorials/distconv_four_ranks.py

For each strategy below this script:

1. builds ``refconv.DistConv2d`` on a ``ProcessGrid`` of the 4 ranks;
2. scatters a global ``x`` and ``dy`` from rank 0 (``refconv.scatter``), runs
   forward and backward, and gathers ``y``, ``dx`` (``refconv.gather``), ``dw``
   and ``db`` (``layer.global_parameter_grads``);
3. compares them with the serial reference (``refconv.reference``) on rank 0;
4. records every collective the layer made (``collectives.stats.recording()``),
   prints it per rank, and checks each buffer size against the formulas of
   ALGORITHMS.md section 4.

It exits non-zero (every rank) on any mismatch; the "OK" lines are printed only
after the comparisons have passed.
"""

import numpy
from mpi4py import MPI

import refconv
from refconv import collectives
from refconv import reference as ref
from refconv.distribution import block_range
from refconv.testing.asserts import assert_all_ranks, close_message

comm = MPI.COMM_WORLD
if comm.size != 4:
    raise SystemExit(f"run this with 4 ranks (mpiexec -n 4 ...), not {comm.size}")

# The layer: C and F do not divide by 4, so channel blocks are uneven (2,2,1,1 and 3,3,2,2).
N, C, F, H, W, K = 4, 6, 10, 8, 8, 3
geometry = dict(padding=1)                          # "same" 3x3: H' = H, W' = W
Ho, Wo = H, W

# label, grid sizes, algorithm, filter_groups (p_f, Stationary-W only)
STRATEGIES = [
    ("sample parallel", dict(sample=4), "stationary-x", None),   # P_c = 1: the algorithm is ignored
    ("stationary-x", dict(channel=4), "stationary-x", None),
    ("stationary-y", dict(channel=4), "stationary-y", None),
    ("stationary-w", dict(channel=4), "stationary-w", 2),        # p_f = 2, p_c' = 2
    ("stationary-x", dict(sample=2, channel=2), "stationary-x", None),
]


def sizes(length, parts):
    """Block lengths of ``length`` split ``parts`` ways (numpy.array_split)."""
    return [e - s for s, e in (block_range(length, parts, i) for i in range(parts))]


def expected_records(grid, algorithm, p_f):
    """(kind, comm size, elements) of each collective, in call order, from ALGORITHMS.md section 4.

    ``elements`` is the size m of the full (gathered or reduced) buffer, which is what
    CommStats records.
    """
    s, c = grid.coords[0], grid.coords[1]
    P, P_c = grid.size, grid.P_c
    n = sizes(N, grid.P_N)[s]                        # local samples
    C_i, F_i = sizes(C, P_c)[c], sizes(F, P_c)[c]
    q = P // P_c                                     # weight peers
    if P_c == 1:                                     # sample parallel: the whole dw, over every rank
        return [("allreduce", P, F * C * K * K), ("allreduce", P, F)]
    if algorithm == "stationary-x":
        return [("reduce_scatter", P_c, n * F * Ho * Wo),      # forward: partial y over all F
                ("allgather", P_c, n * F * Ho * Wo),           # backward: dy
                ("allreduce", q, F * C_i * K * K), ("allreduce", q, F_i)]
    if algorithm == "stationary-y":
        return [("allgather", P_c, n * C * H * W),             # forward: x
                ("reduce_scatter", P_c, n * C * H * W),        # backward: partial dx over all C
                ("allreduce", q, F_i * C * K * K), ("allreduce", q, F_i)]
    p_cp = P_c // p_f                                          # stationary-w: c = a * p_c' + b
    a, b = divmod(c, p_cp)
    C_b = sum(sizes(C, P_c)[k * p_cp + b] for k in range(p_f))
    F_a = sum(sizes(F, P_c)[a * p_cp + j] for j in range(p_cp))
    return [("allgather", p_f, n * C_b * H * W), ("reduce_scatter", p_cp, n * F_a * Ho * Wo),
            ("allgather", p_cp, n * F_a * Ho * Wo), ("reduce_scatter", p_f, n * C_b * H * W),
            ("allreduce", q, F_a * C_b * K * K), ("allreduce", q, F_i)]


def ring_volume(records):
    """Elements a rank sends with ring collectives: (q-1)/q m, twice that for an allreduce."""
    total = 0.0
    for kind, q, m in records:
        total += (2 if kind == "allreduce" else 1) * (q - 1) / q * m
    return total


# The global problem.  Every rank draws the same numbers (same seed), so every rank has w and b;
# only rank 0 keeps x and dy, and the others receive their blocks by scatter.
rng = numpy.random.default_rng(0)
x = rng.standard_normal((N, C, H, W))
w = rng.standard_normal((F, C, K, K))                # parameters: the same draw on every rank
b = rng.standard_normal(F)
dy = rng.standard_normal((N, F, Ho, Wo))
if comm.rank != 0:
    x = dy = None

for label, grid_sizes, algorithm, p_f in STRATEGIES:
    grid = refconv.ProcessGrid(comm, **grid_sizes)
    layer = refconv.DistConv2d(C, F, K, **geometry, grid=grid, algorithm=algorithm, filter_groups=p_f,
                               backend="numpy", dtype=numpy.float64)
    layer.set_global_parameters(w, b)                # each rank keeps its shard: layer.weight

    x_loc = refconv.scatter(x, layer.input_distribution, grid)     # (n, C_i, H, W); binds the layer
    dy_loc = refconv.scatter(dy, layer.output_distribution, grid)  # (n, F_i, H', W')
    with collectives.stats.recording() as region:
        y_loc = layer.forward(x_loc)                 # (n, F_i, H', W')
        dx_loc = layer.backward(dy_loc)              # (n, C_i, H, W); also weight_grad, bias_grad
    records = [(r.kind, r.comm_size, r.elements) for r in region.records]

    y = refconv.gather(y_loc, layer.output_distribution, grid)
    dx = refconv.gather(dx_loc, layer.input_distribution, grid)
    dw, db = layer.global_parameter_grads()

    # Rank 0 compares with the serial reference; every rank learns the verdict.
    problems = []
    if grid.rank == 0:
        checks = [("y", y, ref.conv2d_forward(x, w, b, **geometry), C * K * K),
                  ("dx", dx, ref.conv2d_backward_data(dy, w, x.shape, **geometry), F * K * K),
                  ("dw", dw, ref.conv2d_backward_filter(x, dy, w.shape, **geometry), N * Ho * Wo),
                  ("db", db, ref.conv2d_backward_bias(dy), N * Ho * Wo)]
        problems = [m for name, got, want, L in checks
                    if (m := close_message(got, want, reduction_length=L, name=name)) is not None]
    assert_all_ranks(comm, not problems, "\n".join(problems))
    expected = expected_records(grid, algorithm, p_f)
    assert_all_ranks(comm, records == expected,
                     f"rank {grid.rank}: recorded {records}, ALGORITHMS.md section 4 gives {expected}")

    # Print, in rank order: shapes, then each collective as kind(q=comm size) m.
    line = (f"  rank {grid.rank} {grid.coords}: x_loc {x_loc.shape} w {layer.weight.shape} y_loc {y_loc.shape}\n"
            f"      " + "  ".join(f"{k}(q={q}) {m}" for k, q, m in records)
            + f"   ring volume {ring_volume(records):.0f}")
    lines = comm.gather(line)
    summary = comm.gather(region.summary())
    if grid.rank == 0:
        shape = " x ".join(f"{k}={v}" for k, v in grid_sizes.items())
        print(f"{label} on {shape}" + (f", filter_groups={p_f}" if p_f else "") + f": {layer.algorithm}")
        print("\n".join(lines))
        total = {kind: sum(s.get(kind, {}).get("bytes", 0) for s in summary) for kind in summary[0]}
        print("  summary, bytes over all ranks: " + ", ".join(f"{k} {v}" for k, v in total.items()))
        print(f"  OK: y, dx, dw, db match the reference; buffer sizes match ALGORITHMS.md section 4")
    grid.free()

if comm.rank == 0:
    print("all strategies match the reference")
