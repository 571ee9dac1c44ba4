"""The 3-D kernels against the serial reference: the convolutions (both versions, both dtypes, three
passes), max and average pooling of volumes, and batch norm of volumes on the cuda backend.

Runs under Numba's CUDA simulator on a machine without a GPU (tests/conftest.py sets
NUMBA_ENABLE_CUDASIM=1 there) and unchanged on a real GPU.  The simulator costs about
0.1 ms per thread, so the problems are tiny: the tiled kernels launch blocks of 256
threads, and a few blocks per launch.  The named examples still leave partial tiles,
two blocks along M, several 16-deep stages along K, groups, and uneven split-K slices.
"""

import dataclasses
import inspect
import math
import re

import numpy
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI

import refconv
from refconv import kernels
from refconv import reference as ref
from refconv.arrays import to_host
from refconv.backend import CudaBackend, NumpyBackend, get_backend
from refconv.layers import BatchNorm3d
from refconv.testing.profiles import simulated_examples
from refconv.testing.strategies import Conv3dProblem, conv3d_problems

from test_kernels import DEVICE, assert_errors_match_reference, check, check_pooling, dev, pool_problems, reference_error

VERSIONS = kernels.VERSIONS
DTYPES = ("float64", "float32")
PASSES = ("forward", "backward_data", "backward_filter")


def check_conv3d(problem, version, passes=PASSES, splits=None):
    x, w, b, dy = problem.arrays(seed=7)
    g = problem.geometry
    F, Cg, Kd, Kh, Kw = problem.w_shape
    taps = Kd * Kh * Kw
    x_d, w_d, b_d, dy_d = dev(x, w, b, dy)
    if "forward" in passes:
        y = kernels.conv3d_forward(x_d, w_d, b_d, version=version, **g)
        check(y, ref.conv3d_forward(x, w, b, **g), Cg * taps, f"forward v{version}")
    if "backward_data" in passes:
        dx = kernels.conv3d_backward_data(dy_d, w_d, x.shape, version=version, **g)
        check(dx, ref.conv3d_backward_data(dy, w, x.shape, **g), F // problem.groups * taps, f"backward-data v{version}")
    if "backward_filter" in passes:
        extra = {} if splits is None else dict(splits=splits)
        dw = kernels.conv3d_backward_filter(x_d, dy_d, w.shape, version=version, **g, **extra)
        reduction = problem.N * int(numpy.prod(problem.out))
        check(dw, ref.conv3d_backward_filter(x, dy, w.shape, **g), reduction, f"backward-filter v{version}")


SMALL = conv3d_problems(max_channels=2, max_kernel=2, max_extra=1, dtypes=DTYPES, padding_strings=True)


# Fewer draws under the simulator in make test (refconv.testing.profiles.simulated_examples; the full number on
# a GPU and in make explore): the named EXAMPLES below take every version through both dtypes, a padding
# string, groups, stride and dilation per dim, and several blocks.
@settings(max_examples=simulated_examples(8, reduced=3), deadline=None)
@given(SMALL)
def test_direct_kernels(problem):
    check_conv3d(problem, 1)


@settings(max_examples=3, deadline=None)
@given(SMALL)
def test_tiled_kernels(problem):
    check_conv3d(problem, 2)


def P(N, C, F, size, kernel, stride=1, padding=0, dilation=1, groups=1, dtype="float64"):
    triple = lambda v: (v,) * 3 if isinstance(v, int) else tuple(v)  # noqa: E731
    return Conv3dProblem(N, C, F, triple(size), triple(kernel), triple(stride),
                         padding if isinstance(padding, str) else triple(padding), triple(dilation), groups, dtype)


EXAMPLES = {
    # M = N*Do*Ho*Wo = 75 and N*D*H*W = 90: two blocks along M; K = Cg*Kd*Kh*Kw = 2*12 = 24: two stages
    "two-blocks-two-stages": P(1, 2, 3, (5, 6, 3), (2, 3, 2), padding=(0, 1, 0)),
    "stride-dilation-per-dim": P(1, 2, 2, (5, 4, 6), (2, 2, 2), stride=(2, 1, 3), padding=(1, 0, 1),
                                 dilation=(1, 2, 2), dtype="float32"),
    "groups2-same": P(1, 4, 4, (3, 3, 3), (3, 1, 2), padding="same", groups=2),
    "1x1x1": P(2, 3, 5, (2, 3, 2), 1, dtype="float32"),
}


@pytest.mark.parametrize("name, version", [(name, v) for name in sorted(EXAMPLES) for v in (1, 2)])
def test_examples(name, version):
    """Every named example through versions 1 and 2 and all three passes (version 3: the next test, in float32;
    in float64 it would run version 2 again)."""
    check_conv3d(EXAMPLES[name], version)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_version3_float32(name):
    """Version 3 runs float32 only (float64 runs version 2): every named example again in float32."""
    check_conv3d(dataclasses.replace(EXAMPLES[name], dtype="float32"), 3)


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_backward_filter_split_k(splits, version):
    """Each split count agrees with the reference, and two runs agree bit for bit (the splits' partials
    are added in a fixed order, as in 2-D).  K = N*Do*Ho*Wo = 2*4*3*3 = 72: 5 stages of 16; the last
    split may be short or empty of whole stages."""
    problem = P(2, 2, 3, (4, 3, 3), 3, padding=1, dtype="float32")
    x, w, _, dy = problem.arrays(seed=7)
    x_d, dy_d = dev(x, dy)
    g = problem.geometry
    runs = [kernels.conv3d_backward_filter(x_d, dy_d, w.shape, version=version, splits=splits, **g) for _ in range(2)]
    check(runs[0], ref.conv3d_backward_filter(x, dy, w.shape, **g), 2 * 4 * 3 * 3, f"backward-filter, {splits} splits")
    assert numpy.array_equal(to_host(runs[0]), to_host(runs[1]))


x5, w5 = numpy.zeros((1, 4, 4, 5, 5)), numpy.zeros((2, 2, 3, 3, 3))
BAD_CONV3D = {
    "stride-zero": (x5, w5, dict(stride=0, groups=2)),
    "stride-pair": (x5, w5, dict(stride=(1, 1), groups=2)),
    "negative-padding": (x5, w5, dict(padding=(0, -1, 0), groups=2)),
    "same-strided": (x5, w5, dict(padding="same", stride=2, groups=2)),
    "groups-not-dividing": (x5, numpy.zeros((2, 4, 3, 3, 3)), dict(groups=3)),
    "wrong-w-channels": (x5, w5, dict(groups=1)),
    "kernel-too-large": (x5, numpy.zeros((2, 4, 5, 3, 3)), {}),
    "mixed-dtypes": (x5.astype(numpy.float32), numpy.zeros((2, 4, 3, 3, 3)), {}),
    "4-d-input": (x5[:, :, 0], numpy.zeros((2, 4, 3, 3, 3)), {}),
}


@pytest.mark.parametrize("name", sorted(BAD_CONV3D))
def test_conv3d_errors_match_reference(name):
    x, w, kw = BAD_CONV3D[name]
    assert_errors_match_reference(name, 3, x, w, kw, numpy.zeros((1, 2, 2, 3, 3), dtype=x.dtype))


def test_dy_shape_and_version_errors():
    x, w, dy = numpy.zeros((1, 2, 3, 5, 5)), numpy.zeros((3, 2, 3, 3, 3)), numpy.zeros((1, 3, 1, 3, 2))
    x_d, w_d, dy_d = dev(x, w, dy)
    with pytest.raises(ValueError, match=re.escape("dy: expected shape (1, 3, 1, 3, 3) (N, F, Do, Ho, Wo)")):
        kernels.conv3d_backward_data(dy_d, w_d, x.shape)
    with pytest.raises(ValueError, match=re.escape("dy: expected shape (1, 3, 1, 3, 3) (N, F, Do, Ho, Wo)")):
        kernels.conv3d_backward_filter(x_d, dy_d, w.shape)
    with pytest.raises(ValueError, match="version: expected 1 .* or 3"):
        kernels.conv3d_forward(x_d, w_d, version=4)


def test_both_backends_expose_the_3d_passes():
    problem = P(1, 2, 3, (3, 4, 3), 2, padding=(1, 0, 1))
    x, w, b, dy = problem.arrays(seed=2)
    g = problem.geometry
    expected = {"forward": ref.conv3d_forward(x, w, b, **g), "backward_data": ref.conv3d_backward_data(dy, w, x.shape, **g),
                "backward_filter": ref.conv3d_backward_filter(x, dy, w.shape, **g), "bias": ref.conv3d_backward_bias(dy)}
    for backend in (NumpyBackend(), get_backend("cuda", 1), get_backend("cuda", 2)):
        x_b, w_b, b_b, dy_b = (backend.asarray(a) for a in (x, w, b, dy))
        got = {"forward": backend.conv3d_forward(x_b, w_b, b_b, **g),
               "backward_data": backend.conv3d_backward_data(dy_b, w_b, x.shape, **g),
               "backward_filter": backend.conv3d_backward_filter(x_b, dy_b, w.shape, **g),
               "bias": backend.conv3d_backward_bias(dy_b)}
        for name, want in expected.items():
            check(got[name], want, 64, f"{backend!r} {name}")


# --------------------------------------------------------------------- pooling


@settings(max_examples=simulated_examples(8, reduced=3), deadline=None)  # and POOL3D_EXAMPLES, in both dtypes
@given(pool_problems(dims=3, max_kernel=2), st.sampled_from(DTYPES), st.integers(0, 2**16), st.booleans())
def test_pooling3d(problem, dtype, seed, ties):
    """Max and average pooling of volumes, forward and backward: ``y`` and ``argmax`` exactly (first maximum,
    padding ``-inf``), the rest to rounding; the 2-D test's body (tests/cuda_kernels/test_kernels.py) on volumes."""
    check_pooling(problem, dtype, seed, ties)


POOL3D_EXAMPLES = {
    # a 3-deep window along depth only, padded: the argmax offset a*Kh*Kw must count depth first
    "depth-window-padded": ((1, 2, 4, 3, 3), (3, 1, 1), None, (1, 0, 0)),
    # every dim its own kernel, stride and padding; two blocks of threads along the input (2*2*5*4*5 = 400)
    "per-dim": ((2, 2, 5, 4, 5), (2, 3, 2), (1, 2, 2), (1, 1, 0)),
    # overlapping windows (stride < kernel): an input voxel is the maximum of several windows
    "overlapping": ((1, 1, 4, 4, 4), 3, 1, 1),
}


@pytest.mark.parametrize("name", sorted(POOL3D_EXAMPLES))
def test_pooling3d_examples(name):
    """With ties (rounded values) in float64, and again in float32 without them."""
    check_pooling(POOL3D_EXAMPLES[name], "float64", 1, True)
    check_pooling(POOL3D_EXAMPLES[name], "float32", 2, False)


def test_max_pool3d_special_values_match_the_reference():
    """NaN is never the maximum, a window of -inf and NaN keeps offset 0 (and its dy is dropped where offset 0
    is padding), equal maxima go to the first offset, and an infinite dy reaches only its maximum."""
    x = numpy.full((1, 1, 3, 3, 3), -numpy.inf)
    x[0, 0, 0, 0, 0] = numpy.nan
    x[0, 0, 2, 2, 2] = x[0, 0, 2, 2, 1] = 1.0  # a tie, in one window
    x[0, 0, 1, 1, 1] = numpy.nan
    args = ((2, 2, 2), (1, 1, 1), (1, 1, 1))
    y, argmax = ref.max_pool3d_forward(x, *args)
    y_d, argmax_d = kernels.max_pool3d_forward(dev(x), *args)
    assert numpy.array_equal(to_host(y_d), y) and numpy.array_equal(to_host(argmax_d), argmax)
    assert (argmax == 0).any() and numpy.isneginf(y).any()  # the cases named above occur
    dy = numpy.arange(y.size, dtype=float).reshape(y.shape)
    dy[0, 0, 3, 3, 3] = numpy.inf
    dx = ref.max_pool3d_backward(dy, argmax, x.shape, *args)
    assert numpy.array_equal(to_host(kernels.max_pool3d_backward(dev(dy), argmax_d, x.shape, *args)), dx)


def test_pooling3d_errors_match_reference():
    x = numpy.zeros((1, 1, 4, 4, 4))
    for args in [(3, 1, 2), (0, None, 0), (5, None, 0), ((2, 2), None, 0), ((3, 3, 3), 1, (1, 2, 1))]:
        for name in ("max_pool3d_forward", "avg_pool3d_forward"):
            with pytest.raises(ValueError, match=reference_error(getattr(ref, name), x, *args)):
                getattr(kernels, name)(dev(x), *args)
    with pytest.raises(ValueError, match=reference_error(ref.max_pool3d_forward, x[0], 2)):
        kernels.max_pool3d_forward(dev(x[0]), 2)
    dy = dev(numpy.zeros((1, 1, 2, 2, 1)))
    with pytest.raises(ValueError, match=re.escape("dy: expected shape (1, 1, 2, 2, 2) (N, C, Do, Ho, Wo)")):
        kernels.avg_pool3d_backward(dy, x.shape, 2)


# ------------------------------------------------------------ the cuda backend keeps volumes on the device


def test_cuda_backend_pools_volumes_with_the_kernels(monkeypatch):
    """With the way to the host (to_host) and the reference's pooling of volumes closed, the cuda backend's
    3-D pooling still agrees with the reference: it runs the kernels on the device."""
    x_shape, args = (1, 2, 4, 3, 5), ((2, 2, 3), (2, 1, 2), (1, 0, 1))
    rng = numpy.random.default_rng(4)
    x = rng.standard_normal(x_shape)
    y, argmax = ref.max_pool3d_forward(x, *args)
    dy = rng.standard_normal(y.shape)
    expected = {"max forward": y, "max backward": ref.max_pool3d_backward(dy, argmax, x_shape, *args),
                "avg forward": ref.avg_pool3d_forward(x, *args),
                "avg backward": ref.avg_pool3d_backward(dy, x_shape, *args)}

    def closed(*_, **__):
        raise AssertionError("a volume left the device")

    monkeypatch.setattr(refconv.arrays, "to_host", closed)
    for name in ("max_pool3d_forward", "max_pool3d_backward", "avg_pool3d_forward", "avg_pool3d_backward"):
        monkeypatch.setattr(ref, name, closed)
    for version in kernels.VERSIONS:
        backend = get_backend("cuda", version)
        x_d, dy_d = dev(x, dy)
        y_d, argmax_d = backend.max_pool3d_forward(x_d, *args)
        got = {"max forward": y_d, "max backward": backend.max_pool3d_backward(dy_d, argmax_d, x_shape, *args),
               "avg forward": backend.avg_pool3d_forward(x_d, *args),
               "avg backward": backend.avg_pool3d_backward(dy_d, x_shape, *args)}
        for name, want in expected.items():
            check(got[name], want, 12, f"{backend!r} {name}")


def test_batch_norm3d_on_the_cuda_backend_is_the_reference():
    """BatchNorm3d on the cuda backend hands the 2-D batch-norm kernels the volume as (N, C, D*H, W): a
    channel's statistics still run over all of (N, D, H, W).  y, dx, dgamma, dbeta and the running
    statistics of one training step against refconv.reference.batch_norm3d_*, on a volume whose D, H and W
    differ and whose channels differ in mean and spread (a sum over the wrong axes would not agree)."""
    x_shape = (2, 2, 3, 2, 4)  # each channel a block of 256 threads in the sums: C = 2 keeps the simulator quick
    rng = numpy.random.default_rng(8)
    x = rng.standard_normal(x_shape) * numpy.array([3, 0.5]).reshape(1, 2, 1, 1, 1) + numpy.array([0, 1]).reshape(
        1, 2, 1, 1, 1)
    dy, gamma, beta = rng.standard_normal(x_shape), rng.standard_normal(2), rng.standard_normal(2)
    running_mean, running_var = numpy.zeros(2), numpy.ones(2)
    y, saved = ref.batch_norm3d_forward(x, gamma, beta, running_mean=running_mean, running_var=running_var)
    dx, dgamma, dbeta = ref.batch_norm3d_backward(dy, x, gamma, saved)

    grid = refconv.ProcessGrid(MPI.COMM_SELF)
    layer = BatchNorm3d(2, grid=grid, backend="cuda", dtype=numpy.float64).bind(x_shape)
    layer.weight[...], layer.bias[...] = dev(gamma, beta)
    y_d = layer.forward(DEVICE.asarray(x))
    dx_d = layer.backward(DEVICE.asarray(dy))
    count = math.prod(x_shape) // 2
    for name, got, want in [("y", y_d, y), ("dx", dx_d, dx), ("dgamma", layer.weight_grad, dgamma),
                            ("dbeta", layer.bias_grad, dbeta), ("running_mean", layer.running_mean, running_mean),
                            ("running_var", layer.running_var, running_var)]:
        check(got, want, count, name)


# A volume goes through these backend methods in a 3-D CNN (conv3d, batch norm, ReLU, pooling); global
# average pooling and the MSE head use backend.xp, the device's array module.
VOLUME_METHODS = ("conv3d_forward", "conv3d_backward_data", "conv3d_backward_filter", "conv3d_backward_bias",
                  "max_pool3d_forward", "max_pool3d_backward", "avg_pool3d_forward", "avg_pool3d_backward",
                  "batch_norm_sum", "batch_norm_centered_sum_squares", "batch_norm_apply", "batch_norm_grad_sums",
                  "batch_norm_backward_apply", "relu_forward", "relu_backward")


@pytest.mark.parametrize("name", VOLUME_METHODS)
def test_the_cuda_backend_keeps_every_volume_method_on_the_device(name):
    """docs/volumes.md: no layer of a 3-D CNN leaves the device.  Each method is CudaBackend's own (not the
    NumPy backend's, inherited) and neither copies to the host nor calls the host reference."""
    assert name in CudaBackend.__dict__, f"CudaBackend.{name} is inherited from NumpyBackend"
    source = inspect.getsource(CudaBackend.__dict__[name])
    assert "self.k." in source and "to_host" not in source and "ref." not in source, source
