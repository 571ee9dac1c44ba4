"""refconv.torch.Conv2d against torch.nn.Conv2d, under mpiexec at 1, 2 and 4 ranks.

These need torch, so they are not in tests/mpiexec/launched/ (which runs without it):
tests/mpiexec/test_torch_interop.py launches them, and is skipped where torch is missing.
"""

import numpy
import torch
from mpi4py import MPI

import refconv
import refconv.torch
from refconv.testing.asserts import collective_assert_close
from refconv.testing.mpirun import mpi_test

comm = MPI.COMM_WORLD
AXES = ("sample", "channel", "height", "width")
GRIDS = {1: [(1, 1, 1, 1)], 2: [(1, 2, 1, 1), (1, 1, 2, 1)], 4: [(1, 4, 1, 1), (2, 2, 1, 1), (1, 2, 2, 1)]}
N, C, F, H, W = 2, 4, 8, 7, 6
CONFIGS = [  # torch.nn.Conv2d's arguments, one padding mode each; groups=4 runs "grouped" on a channel split
    dict(kernel_size=3, padding=1),
    dict(kernel_size=(2, 3), padding="same", dilation=(2, 1), padding_mode="reflect"),
    dict(kernel_size=3, stride=2, padding=2, padding_mode="circular", bias=False),
    dict(kernel_size=3, padding="same", groups=4, padding_mode="replicate"),
]


def _grids():
    for shape in GRIDS[comm.size]:
        grid = refconv.ProcessGrid(comm, **dict(zip(AXES, shape)))
        yield grid
        grid.free()


def _both(config, grid, algorithm):
    """A torch.nn.Conv2d and a refconv.torch.Conv2d with the same parameters (same seed everywhere)."""
    torch.manual_seed(0)
    reference = torch.nn.Conv2d(C, F, **config, dtype=torch.float64)
    module = refconv.torch.Conv2d(C, F, **config, grid=grid, algorithm=algorithm, dtype=torch.float64)
    module.set_global_parameters(reference.weight, reference.bias)
    return reference, module


@mpi_test(sizes=(1, 2, 4), timeout=180)
def test_forward_and_gradients_match_torch():
    """y, dx, dw and db of a scatter -> module -> backward, gathered, equal torch's."""
    for grid in _grids():
        for algorithm in ("stationary-x", "stationary-y", "stationary-w"):
            for config in CONFIGS:
                reference, module = _both(config, grid, algorithm)
                layer = module.layer
                x = torch.randn(N, C, H, W, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
                x_ref = x.clone().requires_grad_()
                y_ref = reference(x_ref)
                dy = torch.randn(y_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
                y_ref.backward(dy)

                x_loc = torch.from_dlpack(layer.scatter_input(x)).requires_grad_()  # binds the layer
                y_loc = module(x_loc)
                y_loc.backward(torch.from_dlpack(layer.output_distribution.extract(dy.numpy(), grid.rank)))
                y = refconv.allgather(y_loc.detach(), layer.output_distribution, grid)
                dx = refconv.allgather(x_loc.grad, layer.input_distribution, grid)
                dw, db = module.global_parameter_grads()
                where = f"{config} {algorithm} on {grid.shape}"
                close = dict(rtol=1e-10, atol=1e-10)
                collective_assert_close(comm, y, y_ref.detach().numpy(), name=f"y {where}", **close)
                collective_assert_close(comm, dx, x_ref.grad.numpy(), name=f"dx {where}", **close)
                collective_assert_close(comm, dw.numpy(), reference.weight.grad.numpy(), name=f"dw {where}", **close)
                if reference.bias is not None:
                    collective_assert_close(comm, db.numpy(), reference.bias.grad.numpy(), name=f"db {where}",
                                            **close)


@mpi_test(sizes=(1, 2, 4), timeout=120)
def test_trains_with_a_torch_optimizer_inside_a_torch_model():
    """conv -> ReLU -> conv with torch.optim.SGD (momentum), 5 steps: the losses and the trained
    weights equal torch's own model.  The ReLU is plain torch on this rank's block."""
    for grid in _grids():
        torch.manual_seed(0)
        ref = torch.nn.Sequential(torch.nn.Conv2d(C, F, 3, padding=1, dtype=torch.float64), torch.nn.ReLU(),
                                  torch.nn.Conv2d(F, C, 3, padding="same", padding_mode="circular",
                                                  dtype=torch.float64))
        dist = torch.nn.Sequential(
            refconv.torch.Conv2d(C, F, 3, padding=1, grid=grid, dtype=torch.float64), torch.nn.ReLU(),
            refconv.torch.Conv2d(F, C, 3, padding="same", padding_mode="circular", grid=grid, algorithm="stationary-y",
                                 dtype=torch.float64))
        for r, d in zip(ref[::2], dist[::2]):
            d.set_global_parameters(r.weight, r.bias)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        opt_dist = torch.optim.SGD(dist.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(N, C, H, W, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        losses_ref, losses_dist = [], []
        for _ in range(5):
            opt_ref.zero_grad()
            loss = (ref(x) ** 2).mean()
            loss.backward()
            opt_ref.step()
            losses_ref.append(loss.item())
            opt_dist.zero_grad()
            x_loc = torch.from_dlpack(dist[0].layer.scatter_input(x))
            y_loc = dist(x_loc)
            local = (y_loc ** 2).sum() / x.numel()  # this rank's part of the mean over the global y
            local.backward()
            opt_dist.step()
            losses_dist.append(comm.allreduce(local.item()))  # every element of y is on one rank
        collective_assert_close(comm, numpy.array(losses_dist), numpy.array(losses_ref), rtol=1e-10, name="losses")
        for r, d in zip(ref[::2], dist[::2]):
            w = refconv.allgather(d.weight.detach(), d.layer.weight_distribution, grid)
            collective_assert_close(comm, w, r.weight.detach().numpy(), rtol=1e-10, atol=1e-12, name="trained w")
