"""A wrong slot planted on rank 2 only, checked with check_layer on 3 MPI ranks (issue 41, point 5):
every rank fails alike, and the report, which blames rank 2's block, must appear once."""

import numpy
from mpi4py import MPI

import refconv
from refconv.testing.check import check_layer
from refconv.testing.mpirun import mpi_test
from refconv.testing.strategies import ConvProblem

PROBLEM = ConvProblem(N=2, C=6, F=6, H=5, W=4, Kh=3, Kw=3, padding=(1, 1))


class WrongSlotOnRank2(refconv.DistConv2d):
    """Stationary-X whose rank 2 adds 1 to its own y_loc[0, 0, 0, 0] (tests/simulator/test_check_layer_blame.py
    checks the same mistake on simulated ranks)."""

    def forward(self, x_loc):
        y_loc = super().forward(x_loc)
        if self.grid.rank == 2:
            y_loc[0, 0, 0, 0] += 1.0
        return y_loc


@mpi_test(sizes=(3,), timeout=60)
def test_wrong_slot_on_rank_2():
    grid = refconv.ProcessGrid(MPI.COMM_WORLD, channel=3)
    layer = WrongSlotOnRank2(PROBLEM.C, PROBLEM.F, 3, padding=1, grid=grid, backend="numpy",
                             dtype=numpy.float64, algorithm="stationary-x")
    check_layer(layer, PROBLEM)
