"""PyTorch interop, where torch is installed (skipped, not passed, where it is not).

refconv.scatter/gather take torch tensors without a copy; refconv.torch.Conv2d is a
torch.nn.Module; the multi-rank cases (tests/mpiexec/torch_mpi/torch_cases.py) compare it with
torch.nn.Conv2d at 1, 2 and 4 ranks, gradients and a torch optimizer included.
"""

import functools
import pathlib
import subprocess
import sys

import numpy
import pytest
from mpi4py import MPI

import refconv
from refconv.testing import mpirun

torch = pytest.importorskip("torch")
import refconv.torch  # noqa: E402  (needs torch)

CASES = str(pathlib.Path(__file__).parent / "torch_mpi" / "torch_cases.py")


@functools.cache
def listed_cases():
    """The cases' tests, listed once for the three world sizes (the listing imports torch in a child)."""
    return mpirun.list_tests([CASES])[CASES]


def test_import_refconv_does_not_import_torch():
    code = "import sys, numpy, refconv; from refconv import sharding; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_scatter_and_gather_take_tensors_without_a_copy():
    grid = refconv.ProcessGrid(MPI.COMM_SELF)
    x = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    dist = refconv.Distribution(grid.shape, tuple(x.shape), ("sample", "channel", "height", "width"))
    block = refconv.scatter(x, dist, grid)
    numpy.testing.assert_array_equal(block, x.numpy())
    y = refconv.gather(x, dist, grid)
    assert isinstance(y, numpy.ndarray) and numpy.array_equal(y, x.numpy())
    shared = torch.from_dlpack(y)  # what gather returns speaks DLPack: no copy back to torch
    shared[0, 0, 0, 0] = 100
    assert y[0, 0, 0, 0] == 100
    assert numpy.shares_memory(refconv.arrays.as_array(x), x.numpy())
    with pytest.raises(ValueError, match=r"global_array: cannot be read as an array .*tensor.detach\(\)"):
        refconv.scatter(x.clone().requires_grad_(), dist, grid)
    grid.free()


def test_one_rank_module_is_a_torch_module():
    grid = refconv.ProcessGrid(MPI.COMM_SELF)
    module = refconv.torch.Conv2d(3, 4, 3, padding="same", padding_mode="reflect", grid=grid, dtype=torch.float64)
    reference = torch.nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect", dtype=torch.float64)
    module.set_global_parameters(reference.weight, reference.bias)
    assert [name for name, _ in module.named_parameters()] == ["weight", "bias"]
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    module(x).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(module.weight.grad, reference.weight.grad)
    torch.testing.assert_close(module.bias.grad, reference.bias.grad)
    y_first = module(x)
    module(x).sum().backward()  # the second call's backward is fine
    with pytest.raises(ValueError, match="ran forward again before this backward"):
        y_first.sum().backward()
    with pytest.raises(ValueError, match="dtype: expected torch.float32 or torch.float64"):
        refconv.torch.Conv2d(3, 4, 3, grid=grid, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"algorithm: 'auto' needs input_shape=\(N, C, H, W\)"):
        refconv.torch.Conv2d(3, 4, 3, grid=grid, algorithm="auto")
    auto = refconv.torch.Conv2d(3, 4, 3, grid=grid, algorithm="auto", input_shape=(2, 3, 5, 5), machine="dev-cpu")
    assert auto.layer.algorithm == "sample-spatial" and auto.weight.shape == (4, 3, 3, 3)
    assert auto.layer.machine == "dev-cpu"  # what 'auto' prices with where channel > 1
    grid.free()


@pytest.mark.mpi
@pytest.mark.parametrize("size", (1, 2, 4))
def test_against_torch_conv2d_under_mpi(size):
    tests = [t for t in listed_cases() if size in t.sizes]
    assert [t.name for t in tests] == ["test_forward_and_gradients_match_torch",
                                       "test_trains_with_a_torch_optimizer_inside_a_torch_model"]
    outcomes = mpirun.run_file(CASES, size, tests)
    failed = {name: o.output for name, o in outcomes.items() if not o.passed}
    assert not failed, "\n".join(f"{name}:\n{output}" for name, output in failed.items())
