"""A tiny CNN with every layer type on the cuda backend equals the numpy backend.

Under the CUDA simulator in CI (a few hundred threads per kernel), on the device
on a GPU: the Numba kernels for conv, bias, ReLU, batch norm and pooling,
composed with the collectives of a 2-rank grid.
"""

import numpy
from mpi4py import MPI

from refconv.arrays import to_host
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import collective_assert_close
from refconv.testing.mpirun import mpi_test
from refconv.train import step

comm = MPI.COMM_WORLD

SPEC = {
    "in_channels": 2,
    "layers": [
        {"type": "conv", "out": 2, "kernel": 3, "padding": 1},
        {"type": "batchnorm"},
        {"type": "relu"},
        {"type": "residual", "layers": [{"type": "conv", "out": 2, "kernel": 3, "padding": 1, "bias": False}]},
        {"type": "maxpool", "kernel": 2},
        {"type": "conv", "out": 2, "kernel": 1},
        {"type": "avgpool", "kernel": 2},
        {"type": "gap"},
        {"type": "linear", "out": 3},
    ],
}


def one_step(backend, grid):
    """The loss of one training step and every parameter after it (the backward passes and the update)."""
    model = Model.from_spec(SPEC, comm=comm, backend=backend, dtype="float64", seed=0, defaults={"grid": grid},
                            num_classes=3)
    optimizer = SGD(model, lr=0.1, momentum=0.9)
    rng = numpy.random.default_rng(0)
    x, y = rng.standard_normal((2, 2, 8, 8)), numpy.array([0, 2])
    loss = step(model, optimizer, x, y)
    return numpy.concatenate([[loss]] + [to_host(getattr(layer, name)).ravel() for _, layer, name in model.named_parameters()])


@mpi_test(sizes=(2,), timeout=600)
def test_every_layer_on_the_cuda_backend_matches_numpy():
    for grid in ({"channel": 2}, {"height": 2}):
        collective_assert_close(comm, one_step("cuda", grid), one_step("numpy", grid), rtol=1e-10, atol=1e-12,
                                name=f"loss and parameters after a step on {grid}")
