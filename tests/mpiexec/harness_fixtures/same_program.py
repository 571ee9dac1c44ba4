"""One program, run under mpiexec and on simulated ranks, to compare their bits (not collected).

``program(comm)`` returns this rank's results: every data-moving wrapper on uneven blocks and a
convolution layer's forward and backward on a sample x channel grid.  Under mpiexec
(``mpiexec -n K python -m mpi4py same_program.py OUT``) each rank saves them to OUT/rank<r>.npz.
"""

import sys

import numpy

from refconv import DistConv2d, ProcessGrid, collectives
from refconv.testing.check import run_layer
from refconv.testing.strategies import ConvProblem

ALLREDUCED = ("allreduce", "dw", "db")  # sums MPI may take in another order than rank order


def program(comm):
    r, p = comm.Get_rank(), comm.Get_size()
    rng = numpy.random.default_rng(r)
    x = rng.standard_normal(1000) * 10.0 ** rng.integers(-3, 4, 1000)    # rounding shows the order
    counts = [i % 3 + 1 for i in range(p)]
    base = rng.standard_normal((2, sum(counts), 3))
    out = {
        "allreduce": collectives.allreduce(comm, x),
        "reduce_scatter": collectives.reduce_scatter(comm, base, counts, axis=1),
        "allgather": collectives.allgather(comm, numpy.ascontiguousarray(base[:, :counts[r]]), counts, axis=1),
        "halo": collectives.exchange(comm, {(r + 1) % p: x[:7]}, {(r - 1) % p: (7,)}, numpy.float64)[(r - 1) % p],
    }
    samples = 2 if p % 2 == 0 else 1
    problem = ConvProblem(N=4, C=5, F=7, H=6, W=5, Kh=3, Kw=3, padding=(1, 1))
    for algorithm in ("stationary-x", "stationary-y"):
        grid = ProcessGrid(comm, sample=samples, channel=p // samples)
        layer = DistConv2d(5, 7, 3, padding=1, grid=grid, algorithm=algorithm, backend="numpy", dtype=numpy.float64)
        actual, _ = run_layer(layer, problem, seed=3)
        out.update({f"{algorithm} {name}": value for name, value in actual.items()})
        grid.free()
    return out


if __name__ == "__main__":
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    numpy.savez(f"{sys.argv[1]}/rank{world.Get_rank()}.npz", **program(world))
