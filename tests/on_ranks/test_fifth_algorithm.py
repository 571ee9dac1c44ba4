"""A fifth algorithm, added without editing refconv: registered, priced, property-tested
against the serial reference and volume-checked, all from this one file, on 1 to 8
simulated ranks (refconv.simulated): plain ``pytest``, no mpiexec.

This is the worked example of docs/testing.md ("Adding an algorithm"); the class and the
first test below must stay identical to the ones on that page (tests/architecture/test_architecture.py
checks them).  tests/mpiexec/launched/test_algorithms.py runs the class once under mpiexec.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import DistConv2d, ProcessGrid, algorithms, collectives, cost_model, simulated
from refconv.algorithms.base import (Algorithm, Call, gradient_records, halo_records, local_blocks,
                                    segmented_allreduce)
from refconv.distribution import block_range, block_size
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import check_layer, check_records
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import ConvProblem, dist_conv_cases

SIZES = (1, 2, 3, 4, 5, 6, 7, 8)


# -- the algorithm (docs/testing.md shows this class) ------------------------------------
@algorithms.register
class AllreduceX(Algorithm):
    """Stationary-X written with allreduces only: forward sums the whole partial ``y``
    and keeps this rank's filters (for a reduce-scatter); backward assembles the whole
    ``dy`` by summing zero-padded blocks (for an allgather).  Correct, and each step
    moves about twice the bytes of Stationary-X's, which the cost model sees."""

    name = "allreduce-x"
    weight_layout = (None, "channel", None, None)  # w[:, C_i], as Stationary-X

    def __init__(self, grid, geom, backend, filter_groups=None):
        super().__init__(grid, geom, backend, filter_groups)
        self.comm = grid.channel_comm
        self.f_range = block_range(geom.F, grid.P_c, grid.coords[1])  # this rank's filters F_i

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F, C_i, Kh, Kw)
        self.x_win = self.halo.extend(x_loc, self.xp)  # halo exchange -> (n, C_i, h_win, w_win)
        y_full = collectives.allreduce(self.comm, self.conv(self.x_win, w_loc))  # (n, F, h', w'), summed over C
        f0, f1 = self.f_range
        return self.add_bias(self.xp.ascontiguousarray(y_full[:, f0:f1]), b_loc)  # (n, F_i, h', w')

    def backward(self, dy_loc, w_loc):
        # dy_loc: (n, F_i, h', w')
        n, _, ho, wo = dy_loc.shape
        f0, f1 = self.f_range
        dy_full = self.xp.zeros((n, self.geom.F, ho, wo), dy_loc.dtype)
        dy_full[:, f0:f1] = dy_loc  # this rank's block in place, zeros elsewhere
        dy_full = collectives.allreduce(self.comm, dy_full)  # (n, F, h', w'): every block in its place
        dx_loc = self.halo.reduce(self.conv_data(dy_full, w_loc, self.x_win.shape), self.xp)  # halo return
        dw_loc = self.conv_filter(self.x_win, dy_full, w_loc.shape)  # (F, C_i, Kh, Kw), partial
        return (dx_loc,) + segmented_allreduce(self.peers, dw_loc, self.bias_grad(dy_loc))

    @staticmethod
    def records(geom, grid_shape, coords, filter_groups=None):
        b, P_c = local_blocks(geom, grid_shape, coords), grid_shape[1]
        exchange, back = halo_records(geom, grid_shape, coords, b.C_i)
        y_full = b.n * geom.F * b.ho * b.wo * geom.itemsize
        return (exchange + [Call("allreduce", P_c, y_full), Call("allreduce", P_c, y_full)] + back
                + gradient_records(geom, grid_shape, coords, (geom.F, b.C_i) + geom.kernel))
# -- end of the algorithm -----------------------------------------------------------------
# Registered while this file's tests run only (the fixture below): pytest imports every test file
# into one process, and an "allreduce-x" left in the registry would be priced by every other test.
algorithms.REGISTRY.pop(AllreduceX.name)


@pytest.fixture(autouse=True)
def _registered():
    algorithms.register(AllreduceX)  # tests/conftest.py restores the registry after each test


# -- a test on simulated ranks (docs/testing.md shows it) ----------------------------------
def _layer(case, grid):
    p = case.problem
    return DistConv2d(p.C, p.F, (p.Kh, p.Kw), grid=grid, backend="numpy", input_shape=p.x_shape,
                      **case.layer_kwargs())


def matches_the_serial_reference(comm, case):
    """On every rank: the drawn case's layer against the serial reference (collective checks)."""
    grid = ProcessGrid(comm, **case.grid_kwargs())
    check_layer(_layer(case, grid), case.problem)
    grid.free()


@on_ranks(1, 2, 3, 4, 5, 6, 7, 8)
@settings(max_examples=25)
@given(st.data())
def test_matches_the_serial_reference(ranks, data):
    """Property-tested like the built-in algorithms: drawn problems and grids, uneven blocks.
    Hypothesis draws in the test's thread; then every rank runs the example."""
    case = data.draw(dist_conv_cases(ranks, algorithms=("allreduce-x",)))
    simulated.run(matches_the_serial_reference, ranks, args=(case,))
# -- end of the test -------------------------------------------------------------------------


def _records_are_what_it_moves(comm, case):
    grid = ProcessGrid(comm, **case.grid_kwargs())
    layer, p = _layer(case, grid), case.problem
    x, w, b, dy = p.arrays()
    x_loc, dy_loc = layer.input_distribution.extract(x, grid.rank), layer.output_distribution.extract(dy, grid.rank)
    measured = check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), layer.records(), str(case))
    P_N, P_c = case.grid_shape[:2]
    m = block_size(p.N, P_N, grid.coords[0]) * p.F * p.out_hw[0] * p.out_hw[1] * layer.dtype.itemsize
    pair = [Call("allreduce", P_c, m), Call("allreduce", P_c, m)]  # the closed form, an independent oracle
    closed_form = P_c == 1 or any(measured[i:i + 2] == pair for i in range(len(measured)))
    assert_all_ranks(comm, closed_form, f"{case}\nmeasured {measured}\nno two allreduces of {m} B on {P_c} ranks")
    grid.free()


@on_ranks(*SIZES)
@settings(max_examples=15)
@given(st.data())
def test_records_are_what_it_moves(ranks, data):
    """Volume: the calls measured equal records(), in order, and the closed form
    (two allreduces of the full n F h' w' on the channel group)."""
    case = data.draw(dist_conv_cases(ranks, algorithms=("allreduce-x",), axes=("sample", "channel")))
    simulated.run(_records_are_what_it_moves, ranks, args=(case,))


@on_ranks(4, 8)
def test_priced_and_never_chosen_over_stationary_x(comm):
    """The cost model prices it from its records() with no edit: twice X's forward bytes."""
    grid = ProcessGrid(comm, channel=comm.size)
    layer = DistConv2d(8, 8, 3, padding=1, grid=grid, algorithm="auto", backend="numpy",
                       input_shape=ConvProblem(N=2, C=8, F=8, H=6, W=6, Kh=3, Kw=3).x_shape)
    table = layer.cost_estimates
    assert_all_ranks(comm, ("allreduce-x", None) in table and layer.algorithm != "allreduce-x"
                     and table[("allreduce-x", None)] > table[("stationary-x", None)], f"table {table}")
    assert_all_ranks(comm, ("allreduce-x", None) in cost_model.candidates(comm.size), "not a candidate")
    grid.free()
