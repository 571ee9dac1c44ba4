"""Cross-check the 3-D reference against PyTorch, where PyTorch is installed.

Where torch is not installed these tests are reported as skipped (not passed); CI
installs the CPU build (``.ci/run``).  ``TORCH_CONV3D_CASES`` are torch's own Conv3d
test configurations: a second copy kept on purpose (torch's list lives in
``torch/testing/_internal/common_nn.py`` and ``common_modules.py``, which import test-only
packages), and ``test_the_torch_cases_are_all_transcribed`` fails when torch's list grows.
3-D pooling and batch norm are checked with their 2-D forms, in tests/reference/test_against_torch.py.
"""

import pathlib

import numpy
import pytest
from hypothesis import given, settings

from refconv import reference as ref
from test_against_torch import assert_conv_matches_torch
from refconv.testing.strategies import PADDING_MODES, conv3d_problems

torch = pytest.importorskip("torch")
F = torch.nn.functional
ROUND_OFF = dict(rtol=1e-12, atol=1e-12)  # fp64: a few dozen terms per sum


def t(a):
    return torch.tensor(a, requires_grad=True)


def check_module(conv, x, padding_mode="zeros"):
    """``conv`` (a float64 torch.nn.Conv3d) against the reference: forward, and the gradients of
    x, w and b for a random dy."""
    w = conv.weight.detach().numpy()
    b = None if conv.bias is None else conv.bias.detach().numpy()
    g = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
             padding_mode=padding_mode)
    xt = t(x)
    yt = conv(xt)
    dy = numpy.random.default_rng(1).standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(dy))
    numpy.testing.assert_allclose(ref.conv3d_forward(x, w, b, **g), yt.detach().numpy(), **ROUND_OFF)
    numpy.testing.assert_allclose(ref.conv3d_backward_data(dy, w, x.shape, **g), xt.grad.numpy(), **ROUND_OFF)
    numpy.testing.assert_allclose(ref.conv3d_backward_filter(x, dy, w.shape, **g), conv.weight.grad.numpy(),
                                  **ROUND_OFF)
    if b is not None:
        numpy.testing.assert_allclose(ref.conv3d_backward_bias(dy), conv.bias.grad.numpy(), **ROUND_OFF)


# name: (nn.Conv3d positional and keyword arguments, input size), from torch 2.13's common_nn.py
# (module_tests and the padding-mode loop of new_module_tests) and common_modules.py
# (module_inputs_torch_nn_ConvNd, N=3).  Those refconv refuses are in TORCH_CONV3D_REFUSED.
TORCH_CONV3D_CASES = {
    "Conv3d": ((2, 3, (2, 3, 2)), {}, (1, 2, 4, 5, 4)),
    "Conv3d_no_bias": ((2, 3, (2, 3, 4), 1, 0, 1, 1, False), {}, (1, 2, 3, 4, 5)),
    "Conv3d_1x1x1_no_bias": ((2, 3, (1, 1, 1), 1, 0, 1, 1, False), {}, (1, 2, 3, 4, 5)),
    "Conv3d_stride": ((3, 4, 2, 2), {}, (2, 3, 5, 5, 5)),
    "Conv3d_stride_padding": ((3, 4, 2, 2, 1), {}, (2, 3, 5, 5, 5)),
    "Conv3d_groups": ((2, 4), dict(kernel_size=3, groups=2), (1, 2, 4, 5, 4)),
    "Conv3d_dilated": ((3, 4), dict(kernel_size=2, dilation=2), (2, 3, 5, 5, 5)),
    "Conv3d_dilated_strided": ((3, 4), dict(kernel_size=2, dilation=2, stride=2), (2, 3, 5, 5, 5)),
    "Conv3d_pad_valid": ((3, 4, (2, 3, 4)), dict(padding="valid"), (2, 3, 6, 5, 4)),
    "Conv3d_pad_same": ((3, 4, (2, 3, 4)), dict(padding="same"), (2, 3, 6, 5, 4)),
    "Conv3d_pad_same_dilated": ((3, 4, (2, 3, 4)), dict(padding="same", dilation=2), (2, 3, 6, 5, 4)),
    "Conv3d_circular_stride2_pad2": ((2, 3, 3, 2, (1, 2, 3), 1, 1, True, "circular"), {}, (2, 2, 4, 4, 4)),
    "Conv3d_replicate_stride2_pad2": ((2, 3, 3, 2, (1, 2, 3), 1, 1, True, "replicate"), {}, (2, 2, 4, 4, 4)),
    "Conv3d_zeros_stride2_pad2": ((2, 3, 3, 2, (1, 2, 3), 1, 1, True, "zeros"), {}, (2, 2, 4, 4, 4)),
    # torch skips reflect in 3-D there (a FIXME from before reflection_pad3d existed); torch 2.13 has it
    "Conv3d_reflect_stride2_pad2": ((2, 3, 3, 2, (1, 2, 3), 1, 1, True, "reflect"), {}, (2, 2, 4, 4, 4)),
    "ModuleInfo_Conv3d": ((4, 5, 3), {}, (2, 4, 3, 4, 5)),
    "ModuleInfo_Conv3d_same": ((4, 5, 3), dict(padding="same"), (2, 4, 3, 4, 5)),
}

# What torch's cases also run and refconv refuses, with the error refconv gives.
TORCH_CONV3D_REFUSED = {
    "Conv3d_zero_batch": ((3, 4, (2, 3, 4)), {}, (0, 3, 3, 4, 5), r"x_shape: .*refconv does not run empty"),
    "ModuleInfo_Conv3d_no_batch_dim": ((4, 5, 3), {}, (4, 3, 4, 5), r"x: expected 5 dimensions .* pass x\[None\]"),
    "check_with_long_tensor": ((2, 3, (2, 3, 2)), {}, (1, 2, 4, 5, 4), r"x: expected float32 or float64, got int64"),
}


@pytest.mark.parametrize("name", sorted(TORCH_CONV3D_CASES))
def test_torch_conv3d_cases(name):
    args, kwargs, input_size = TORCH_CONV3D_CASES[name]
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(*args, **kwargs, dtype=torch.float64)
    x = numpy.random.default_rng(0).standard_normal(input_size)
    check_module(conv, x, conv.padding_mode)


@pytest.mark.parametrize("name", sorted(TORCH_CONV3D_REFUSED))
def test_torch_conv3d_cases_refconv_refuses(name):
    args, kwargs, input_size, error = TORCH_CONV3D_REFUSED[name]
    conv = torch.nn.Conv3d(*args, **kwargs, dtype=torch.float64)
    dtype = numpy.int64 if name == "check_with_long_tensor" else numpy.float64
    x = numpy.zeros(input_size, dtype=dtype)
    assert conv(torch.tensor(x, dtype=torch.float64)).ndim == len(input_size)  # torch runs it
    w = conv.weight.detach().numpy()
    with pytest.raises(ValueError, match=error):
        ref.conv3d_forward(x, w, padding=conv.padding)


def test_the_torch_cases_are_all_transcribed():
    """torch 2.13's common_nn.py spells 12 Conv3d cases out and makes 4 more in its padding-mode
    loop (3 in 3-D, reflect skipped there, added here); common_modules.py makes 4 from
    ``module_inputs_torch_nn_ConvNd``.  A new torch with more cases fails here until they are added."""
    source = pathlib.Path(torch.__file__).parent / "testing" / "_internal" / "common_nn.py"
    spelled_out = source.read_text().count("torch::nn::Conv3dOptions(")
    assert spelled_out == 12, f"torch's common_nn.py now has {spelled_out} Conv3d cases: transcribe the new ones"
    assert len(TORCH_CONV3D_CASES) + len(TORCH_CONV3D_REFUSED) == 11 + 4 + 2 + 3  # 12 spelled out, one refused


@settings(max_examples=60, deadline=None)
@given(conv3d_problems(max_channels=4, max_kernel=3, padding_strings=True))
def test_conv3d_matches_torch(problem):
    assert_conv_matches_torch(problem, ROUND_OFF)


@settings(max_examples=30, deadline=None)
@given(conv3d_problems(max_channels=4, padding_strings=True, padding_modes=PADDING_MODES))
def test_conv3d_module_padding_modes_match_torch(problem):
    p = problem
    conv = torch.nn.Conv3d(p.C, p.F, p.kernel, p.stride, p.padding, p.dilation, p.groups,
                           padding_mode=p.padding_mode, dtype=torch.float64)
    check_module(conv, p.arrays(seed=4)[0], p.padding_mode)
