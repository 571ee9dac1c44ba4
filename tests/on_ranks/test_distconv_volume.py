"""Communication volume per rank, from CommStats, equals docs/algorithms.md section 4 exactly.

Expected figures are written here from the local block sizes and the paper's
closed forms, on purpose: they are an oracle independent of the algorithm
modules' own ``records()`` (which the measurement is also compared with, call
for call).  CommStats records, per call, the full (gathered or reduced) buffer
``m`` (see refconv.collectives).  On 1 to 8 simulated ranks (refconv.simulated): Hypothesis
draws each example in the test's thread, then every rank runs it.
"""

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import collectives, simulated
from refconv.layers import DistConv2d
from refconv.distribution import block_size
from refconv.grid import ProcessGrid
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import check_records
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem, DistConvCase, dist_conv_cases

SIZES = (1, 2, 3, 4, 5, 6, 7, 8)


blk = block_size  # the length of block i of ``length`` split ``parts`` ways


def expected_records(comm, case):
    """(kind, comm size, bytes) of every call one forward + backward makes on this rank, per the formulas."""
    p, (P_N, P_c, P_H, P_W) = case.problem, case.grid_shape
    assert P_H == P_W == 1, "spatial halos are checked separately"
    grid_coords = numpy.unravel_index(comm.rank, case.grid_shape)
    n_, c_ = int(grid_coords[0]), int(grid_coords[1])
    isz = numpy.dtype(p.dtype).itemsize
    n = blk(p.N, P_N, n_)
    Ho, Wo = p.out_hw
    KK = p.Kh * p.Kw
    peers = P_N * P_H * P_W
    C_i, F_i = blk(p.C, P_c, c_), blk(p.F, P_c, c_)
    if P_c == 1:  # sample parallelism: replicated weights
        return sorted([("allreduce", peers, p.F * p.C // p.groups * KK * isz), ("allreduce", peers, p.F * isz)])
    Cg, Fg = p.C // p.groups, p.F // p.groups
    if p.groups > 1 and p.groups % P_c == 0:  # whole groups per rank: no channel collective, w[F_i] allreduced
        return sorted([("allreduce", peers, F_i * Cg * KK * isz), ("allreduce", peers, F_i * isz)])
    if p.groups > 1:  # a group on q = P_c / groups ranks: X or Y among them, on the group's channels only
        q = P_c // p.groups
        if case.algorithm == "stationary-w":  # q = p_f x p_c': C_b is p_f blocks of C/P_c, F_a p_c' blocks of F/P_c
            p_f = case.filter_groups
            C_b, F_a = p_f * (p.C // P_c), q // p_f * (p.F // P_c)
            x_m, y_m = n * C_b * p.H * p.W * isz, n * F_a * Ho * Wo * isz
            return sorted([("allgather", p_f, x_m), ("reduce_scatter", q // p_f, y_m), ("allgather", q // p_f, y_m),
                           ("reduce_scatter", p_f, x_m), ("allreduce", peers, F_a * C_b * KK * isz),
                           ("allreduce", peers, F_i * isz)])
        if case.algorithm == "stationary-x":
            m = n * Fg * Ho * Wo * isz
            return sorted([("reduce_scatter", q, m), ("allgather", q, m), ("allreduce", peers, Fg * C_i * KK * isz),
                           ("allreduce", peers, F_i * isz)])
        m = n * Cg * p.H * p.W * isz
        return sorted([("allgather", q, m), ("reduce_scatter", q, m), ("allreduce", peers, F_i * Cg * KK * isz),
                       ("allreduce", peers, F_i * isz)])
    if case.algorithm == "stationary-x":
        m = n * p.F * Ho * Wo * isz
        return sorted([("reduce_scatter", P_c, m), ("allgather", P_c, m),
                       ("allreduce", peers, p.F * C_i * KK * isz), ("allreduce", peers, F_i * isz)])
    if case.algorithm == "stationary-y":
        m = n * p.C * p.H * p.W * isz
        return sorted([("allgather", P_c, m), ("reduce_scatter", P_c, m),
                       ("allreduce", peers, F_i * p.C * KK * isz), ("allreduce", peers, F_i * isz)])
    p_f = case.filter_groups
    p_cp = P_c // p_f
    a, b = divmod(c_, p_cp)
    C_b = sum(blk(p.C, P_c, k * p_cp + b) for k in range(p_f))
    F_a = sum(blk(p.F, P_c, a * p_cp + j) for j in range(p_cp))
    x_m, y_m = n * C_b * p.H * p.W * isz, n * F_a * Ho * Wo * isz
    return sorted([("allgather", p_f, x_m), ("reduce_scatter", p_cp, y_m),      # forward
                   ("allgather", p_cp, y_m), ("reduce_scatter", p_f, x_m),      # backward
                   ("allreduce", peers, F_a * C_b * KK * isz), ("allreduce", peers, F_i * isz)])


def measured_records(comm, case):
    grid = ProcessGrid(comm, **case.grid_kwargs())
    p = case.problem
    layer = DistConv2d(p.C, p.F, (p.Kh, p.Kw), grid=grid, backend="numpy", input_shape=p.x_shape, **case.layer_kwargs())
    x, w, b, dy = p.arrays()
    x_loc = layer.input_distribution.extract(x, grid.rank)
    dy_loc = layer.output_distribution.extract(dy, grid.rank)
    measured = check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), layer.records(), str(case))
    grid.free()
    return sorted((c.kind, c.comm_size, c.bytes) for c in measured)


def volume_matches_the_formulas(comm, case):
    expected, measured = expected_records(comm, case), measured_records(comm, case)
    assert_all_ranks(comm, expected == measured, f"{case}\nexpected {expected}\nmeasured {measured}")


@on_ranks(*SIZES)
@settings(max_examples=40)
@given(st.data())
def test_volume_matches_the_formulas(ranks, data):
    case = data.draw(dist_conv_cases(ranks, axes=("sample", "channel"), dtypes=("float64", "float32"),
                                     grouped_channel_split=True))
    simulated.run(volume_matches_the_formulas, ranks, args=(case,))


@on_ranks(4)
def test_segmented_allreduce_moves_a_shard_not_the_whole_weight(comm):
    """X, Y and W with P_c = 4: each rank allreduces F C K K / 4 weights among 1 peer set."""
    problem = ConvProblem(N=2, C=8, F=8, H=5, W=5, Kh=3, Kw=3, padding=(1, 1))
    whole = 8 * 8 * 9 * 8
    for algorithm, p_f in (("stationary-x", None), ("stationary-y", None), ("stationary-w", 2)):
        case = DistConvCase(problem, (1, 4, 1, 1), algorithm, p_f)
        allreduced = [r for r in measured_records(comm, case) if r[0] == "allreduce"]
        weight_bytes = max(r[2] for r in allreduced)
        assert_all_ranks(comm, weight_bytes * 4 == whole, f"{algorithm}: allreduced {weight_bytes} B, whole weight {whole} B")


@on_ranks(2, 3, 4, 5, 6, 7, 8)
def test_halo_volume_same_padding(comm):
    """Stride 1, K=3, padding 1, H split P_H ways: interior ranks send one row each way, one
    message to each neighbour (counted by the exchange's Isends, ``Record.messages``)."""
    P_H = comm.size
    N, C, F, H, W = 2, 3, 4, 4 * P_H, 5
    grid = ProcessGrid(comm, height=P_H)
    layer = DistConv2d(C, F, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64, input_shape=(N, C, H, W))
    x = numpy.ones((N, C, H, W))
    h = grid.coords[2]
    neighbours = (h > 0) + (h < P_H - 1)
    with collectives.stats.recording() as region:
        y_loc = layer.forward(layer.input_distribution.extract(x, grid.rank))
        layer.backward(numpy.ones_like(y_loc))
    halo = [(r.bytes, r.messages) for r in region.records if r.kind == "halo"]
    row = N * C * W * 8
    assert_all_ranks(comm, halo == [(neighbours * row, neighbours)] * 2, f"halo records {halo}, row {row} B")
    grid.free()


@on_ranks(2, 3, 4, 5, 6, 7, 8)
def test_aligned_depthwise_moves_no_activation_data(comm):
    """A depthwise 3x3 conv (groups = C = F) on a channel split, with every channel algorithm asked
    for: each rank convolves its own channels; only dw and db (this rank's F/P_c filters) move."""
    P_c = comm.size
    C = 2 * P_c
    problem = ConvProblem(N=2, C=C, F=C, H=5, W=4, Kh=3, Kw=3, padding="same", groups=C)
    for algorithm, p_f in (("stationary-x", None), ("stationary-y", None), ("stationary-w", None)):
        records = measured_records(comm, DistConvCase(problem, (1, P_c, 1, 1), algorithm, p_f))
        expected = sorted([("allreduce", 1, 2 * 9 * 8), ("allreduce", 1, 2 * 8)])  # 2 filters of 1 x 3 x 3, float64
        assert_all_ranks(comm, records == expected, f"{algorithm}: {records}")


@on_ranks(8)
def test_stationary_w_within_a_group_moves_only_its_group(comm):
    """groups=2 on channel=8, p_f=2: each group's 4 ranks factored 2 x 2; every collective but the
    weight-gradient allreduce runs on 2 ranks and moves that group's channels only, as records() says."""
    problem = ConvProblem(N=2, C=8, F=16, H=5, W=4, Kh=3, Kw=3, padding=(1, 1), groups=2)
    case = DistConvCase(problem, (1, 8, 1, 1), "stationary-w", 2)
    expected, measured = expected_records(comm, case), measured_records(comm, case)
    sizes = {r[1] for r in measured if r[0] != "allreduce"}
    # x: n C_b h w = 2 x (2 blocks of C/8) x 5 x 4 x 8 bytes; y: 2 x (2 blocks of F/8) x 5 x 4 x 8
    moved = sorted(r[2] for r in measured if r[0] != "allreduce")
    assert_all_ranks(comm, expected == measured and sizes == {2} and moved == [640] * 2 + [1280] * 2,
                     f"expected {expected}\nmeasured {measured}")


@on_ranks(4)
def test_groups_spanning_ranks_move_only_their_group(comm):
    """groups=2 on channel=4: each group on 2 ranks; X and Y move that group's channels among those
    2 ranks (F/2 or C/2 channels, communicator of 2), as the formulas say."""
    problem = ConvProblem(N=2, C=8, F=12, H=5, W=4, Kh=3, Kw=3, padding=(1, 1), groups=2)
    for algorithm in ("stationary-x", "stationary-y"):
        case = DistConvCase(problem, (1, 4, 1, 1), algorithm)
        expected, measured = expected_records(comm, case), measured_records(comm, case)
        sizes = {r[1] for r in measured if r[0] != "allreduce"}
        assert_all_ranks(comm, expected == measured and sizes == {2}, f"{algorithm}\nexpected {expected}\n"
                                                                      f"measured {measured}")
