"""Every algorithm once under real MPI, at 4 ranks: the same code as on simulated ranks, through
mpi4py and MPICH.

tests/on_ranks/ property-tests the algorithms on drawn problems and grids at 1 to 8 simulated
ranks (test_distconv.py, test_distconv3d.py, test_fifth_algorithm.py); here each runs once on a
fixed problem with uneven blocks, so that MPI itself (its datatypes, its matching of messages,
its collectives) moves their data: Stationary-X, -Y and -W (p_f = 2) on 4 channel ranks, a
sample x height grid (halo exchange), a grouped layer, a DistConv3d on a depth split and the
fifth algorithm of docs/testing.md.
"""

import numpy
from mpi4py import MPI

from refconv import algorithms
from refconv.grid import ProcessGrid
from refconv.layers import DistConv2d, DistConv3d
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import check_layer
from refconv.testing.mpirun import mpi_test
from refconv.testing.strategies import Conv3dProblem, ConvProblem

from on_ranks_checks import load

comm = MPI.COMM_WORLD
# C = 6 and F = 10 on 4 channel ranks: blocks of 2, 2, 1, 1 and 3, 3, 2, 2; 9 rows on 2: 5 and 4
PROBLEM = ConvProblem(N=3, C=6, F=10, H=9, W=7, Kh=3, Kw=3, stride=(1, 2), padding=(1, 1))


def _check(problem, algorithm="stationary-x", filter_groups=None, **grid):
    """check_layer of ``problem``'s layer on ``grid``; the algorithm that ran."""
    grid = ProcessGrid(comm, **grid)
    layer = DistConv2d(problem.C, problem.F, (problem.Kh, problem.Kw), stride=problem.stride, padding=problem.padding,
                       groups=problem.groups, grid=grid, algorithm=algorithm, filter_groups=filter_groups,
                       backend="numpy", dtype=numpy.float64)
    check_layer(layer, problem)
    grid.free()
    return layer.algorithm


@mpi_test(sizes=(4,), timeout=60)
def test_stationary_x():
    _check(PROBLEM, "stationary-x", channel=4)


@mpi_test(sizes=(4,), timeout=60)
def test_stationary_y():
    _check(PROBLEM, "stationary-y", channel=4)


@mpi_test(sizes=(4,), timeout=60)
def test_stationary_w_with_two_filter_groups():
    _check(PROBLEM, "stationary-w", 2, channel=4)


@mpi_test(sizes=(4,), timeout=60)
def test_sample_by_height():
    """2 samples x 2 row blocks: the halo exchange and the weight-gradient allreduce."""
    _check(PROBLEM, sample=2, height=2)


@mpi_test(sizes=(4,), timeout=60)
def test_grouped():
    """groups=4 on 4 channel ranks: whole groups per rank (the "grouped" algorithm)."""
    ran = _check(ConvProblem(N=2, C=8, F=12, H=5, W=6, Kh=3, Kw=3, padding=(1, 1), groups=4), channel=4)
    assert_all_ranks(comm, ran == "grouped", f"ran {ran}")


@mpi_test(sizes=(4,), timeout=60)
def test_distconv3d_on_a_depth_split():
    """9 planes on 4 depth ranks (3, 2, 2, 2): the halo exchange of volumes."""
    problem = Conv3dProblem(N=2, C=3, F=4, size=(9, 5, 4), kernel=(3, 3, 3), padding=(1, 1, 1))
    grid = ProcessGrid(comm, depth=4)
    layer = DistConv3d(3, 4, 3, padding=1, grid=grid, backend="numpy", dtype=numpy.float64)
    check_layer(layer, problem)
    grid.free()


@mpi_test(sizes=(4,), timeout=60)
def test_the_fifth_algorithm():
    """AllreduceX (tests/on_ranks/test_fifth_algorithm.py, docs/testing.md) on 2 channels x 2 row
    blocks: its allreduces and its halo exchange."""
    algorithms.register(load("test_fifth_algorithm").AllreduceX)
    _check(PROBLEM, "allreduce-x", channel=2, height=2)
