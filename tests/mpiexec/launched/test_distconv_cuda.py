"""Each algorithm on the cuda backend: the Numba kernels composed with the collectives.

Under the CUDA simulator in CI (tiny shapes: the simulator runs ~0.1 ms per
thread); on a real GPU the same tests run on device arrays.
"""

import numpy
from mpi4py import MPI

from refconv.layers import DistConv2d
from refconv.grid import ProcessGrid
from refconv.testing.check import check_layer
from refconv.testing.mpirun import mpi_test
from refconv.testing.strategies import ConvProblem

comm = MPI.COMM_WORLD
PROBLEM = ConvProblem(N=2, C=4, F=4, H=5, W=4, Kh=3, Kw=3, stride=(1, 1), padding=(1, 1), dilation=(1, 1))
AXES = ("sample", "channel", "height", "width")


def check(shape, algorithm, filter_groups=None, problem=PROBLEM):
    grid = ProcessGrid(comm, **dict(zip(AXES, shape)))
    p = problem
    layer = DistConv2d(p.C, p.F, (p.Kh, p.Kw), stride=p.stride, padding=p.padding, dilation=p.dilation,
                       grid=grid, algorithm=algorithm, filter_groups=filter_groups, backend="cuda", dtype=numpy.float64)
    check_layer(layer, p)
    grid.free()


@mpi_test(sizes=(2,), timeout=300)
def test_cuda_stationary_x_and_y():
    check((1, 2, 1, 1), "stationary-x")
    check((1, 2, 1, 1), "stationary-y")


@mpi_test(sizes=(2,), timeout=300)
def test_cuda_spatial_with_stride_and_dilation():
    check((1, 1, 2, 1), "stationary-x",
          problem=ConvProblem(N=1, C=2, F=3, H=7, W=4, Kh=3, Kw=2, stride=(2, 1), padding=(2, 0), dilation=(2, 1)))


@mpi_test(sizes=(4,), timeout=300)
def test_cuda_stationary_w():
    check((1, 4, 1, 1), "stationary-w", filter_groups=2)
