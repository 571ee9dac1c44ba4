"""refconv.kernels against the serial reference: every kernel, both conv versions, both dtypes.

Runs under Numba's CUDA simulator on a machine without a GPU (tests/conftest.py
sets NUMBA_ENABLE_CUDASIM=1 there) and unchanged on a real GPU, where the inputs
become CuPy arrays.  The simulator runs every thread in Python, so problems
are tiny: a few blocks of 256 threads per launch.  Shapes are still chosen to
leave partial tiles (M, N and K not multiples of 64, 64, 16), several blocks
along each GEMM dimension, and every combination of stride, padding,
dilation and groups.
"""

import dataclasses
import re

import numpy
import pytest
from hypothesis import example, given, settings, strategies as st

from refconv import kernels, reference as ref
from refconv.arrays import to_host
from refconv.backend import NumpyBackend, get_backend
from refconv.kernels import batch_norm, conv_backward_data, conv_backward_filter, conv_forward, tiles_v3
from refconv.kernels.geometry import TARGET_BLOCKS
from refconv.testing.asserts import assert_close, default_tolerance
from refconv.testing.profiles import simulated_examples
from refconv.testing.strategies import ConvProblem, conv_problems

DEVICE = get_backend("cuda")  # CuPy arrays on a GPU, NumPy arrays under the simulator
HOST = NumpyBackend()  # the reference semantics of the non-conv pieces
VERSIONS = kernels.VERSIONS
DTYPES = ("float64", "float32")
# 10 examples a property test on a GPU and in make explore; 3 under the simulator in make test (each thread a
# Python call there), where the explicit @example rows of each test keep every code path: both dtypes, the
# padding strings, groups.  The fixed EXAMPLES below cover several blocks, partial tiles and split-K.
FAST = settings(max_examples=simulated_examples(10, reduced=3), deadline=None)


def test_the_simulator_draws_fewer_examples_under_ci_and_fast_only(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    for profile, expected in (("ci", 3), ("fast", 3), ("explore", 10)):
        monkeypatch.setenv("HYPOTHESIS_PROFILE", profile)
        assert simulated_examples(10, reduced=3) == expected, profile
    monkeypatch.delenv("HYPOTHESIS_PROFILE")
    assert simulated_examples(10, reduced=3) == 3  # ci, the default
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")  # a GPU: every example
    assert simulated_examples(10, reduced=3) == 10
    with pytest.raises(ValueError, match=r"reduced: expected 1 <= reduced <= full = 10, got 11"):
        simulated_examples(10, reduced=11)


def dev(*arrays):
    """Host arrays -> device arrays (a tuple, or one array); always copies, so that
    in-place kernels cannot write into the host array (under the simulator both are NumPy)."""
    out = tuple(DEVICE.asarray(numpy.array(a)) for a in arrays)
    return out if len(out) > 1 else out[0]


def check(actual, expected, reduction_length=1, name=""):
    """float64: 1e-10 relative; float32: grows with sqrt(reduction length), as rounding does."""
    expected = numpy.asarray(expected)
    actual = to_host(actual)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype}, expected {expected.dtype}"
    if expected.dtype == numpy.float64:
        tol = 1e-10
    else:
        tol = default_tolerance(numpy.float32, reduction_length, factor=32)[0]
    assert_close(actual, expected, rtol=tol, atol=tol, reduction_length=reduction_length, name=name)


# ------------------------------------------------------------------- convolution


def check_conv(problem, version, passes=("forward", "backward_data", "backward_filter"), splits=None):
    x, w, b, dy = problem.arrays(seed=7)
    g = problem.geometry
    N, C, H, W = problem.x_shape
    F, Cg, Kh, Kw = problem.w_shape
    Ho, Wo = problem.out_hw
    x_d, w_d, b_d, dy_d = dev(x, w, b, dy)
    if "forward" in passes:
        y = kernels.conv2d_forward(x_d, w_d, b_d, version=version, **g)
        check(y, ref.conv2d_forward(x, w, b, **g), Cg * Kh * Kw, f"forward v{version}")
    if "backward_data" in passes:
        dx = kernels.conv2d_backward_data(dy_d, w_d, x.shape, version=version, **g)
        check(dx, ref.conv2d_backward_data(dy, w, x.shape, **g), (F // problem.groups) * Kh * Kw, f"backward-data v{version}")
    if "backward_filter" in passes:
        extra = {} if splits is None else dict(splits=splits)
        dw = kernels.conv2d_backward_filter(x_d, dy_d, w.shape, version=version, **g, **extra)
        check(dw, ref.conv2d_backward_filter(x, dy, w.shape, **g), N * Ho * Wo, f"backward-filter v{version}")


def as_run(problem, version):
    """``problem`` as ``version`` runs it: version 3 in float32 (in float64 it would run version 2 again)."""
    return dataclasses.replace(problem, dtype="float32") if version == 3 else problem


# Run in every profile, before the drawn examples: each padding string, each dtype (version 3 runs float32),
# stride and dilation (groups: the EXAMPLES below, in every version; under version 3 each group is a launch).
PADDING_STRING_ROWS = (
    ConvProblem(1, 2, 3, 5, 4, 3, 2, padding="same", dilation=(2, 1), dtype="float32"),
    ConvProblem(2, 2, 3, 6, 5, 2, 3, stride=(2, 1), padding="valid"),
)


def padding_string_rows(test):
    """``test`` with an ``@example`` for each of :data:`PADDING_STRING_ROWS`."""
    for row in reversed(PADDING_STRING_ROWS):
        test = example(problem=row)(test)
    return test


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(conv_problems(dtypes=DTYPES, padding_strings=True))
@padding_string_rows
def test_conv_forward(version, problem):
    check_conv(as_run(problem, version), version, ["forward"])


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(conv_problems(dtypes=DTYPES, padding_strings=True))
@padding_string_rows
def test_conv_backward_data(version, problem):
    check_conv(as_run(problem, version), version, ["backward_data"])


@pytest.mark.parametrize("version", VERSIONS)
@FAST
@given(conv_problems(dtypes=DTYPES, padding_strings=True))
@padding_string_rows
def test_conv_backward_filter(version, problem):
    check_conv(as_run(problem, version), version, ["backward_filter"])


@pytest.mark.slow
@pytest.mark.extended  # 38 s of the default suite; the explicit EXAMPLES below cover several blocks per launch
@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=15, deadline=None)
@given(conv_problems(dtypes=DTYPES, max_batch=2, max_channels=6, max_kernel=4, max_extra=6, padding_strings=True))
def test_conv_all_passes_larger(version, problem):
    check_conv(as_run(problem, version), version)


def P(N, C, F, H, W, Kh, Kw, stride=1, padding=0, dilation=1, groups=1, dtype="float64"):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    return ConvProblem(N, C, F, H, W, Kh, Kw, pair(stride), pair(padding), pair(dilation), groups, dtype)


EXAMPLES = {
    "stride2-dilation2": P(1, 2, 3, 9, 8, 3, 3, stride=2, padding=1, dilation=2),
    "groups2": P(2, 4, 4, 5, 5, 3, 3, padding=1, groups=2, dtype="float32"),
    "kernel-larger-than-stride": P(1, 2, 2, 7, 7, 3, 3, stride=2),
    "kernel-smaller-than-stride": P(1, 2, 3, 7, 6, 1, 2, stride=(3, 3), padding=(0, 1)),
    "1x1": P(2, 3, 5, 4, 3, 1, 1, dtype="float32"),
    # M = 81 (two row blocks, the second partial), F = 5, K = 27 (two partial depth stages)
    "no-tile-multiple": P(1, 3, 5, 9, 9, 3, 3, padding=1),
    # F = 66 > 64: two column blocks in the forward GEMM
    "two-column-blocks": P(1, 1, 66, 3, 2, 1, 1),
    # C/g*Kh*Kw = 72 > 64: two column blocks in the backward-filter GEMM
    "two-filter-column-blocks": P(1, 8, 2, 3, 3, 3, 3, padding=1, dtype="float32"),
    "asymmetric": P(1, 2, 2, 6, 9, 2, 3, stride=(1, 2), padding=(0, 2), dilation=(2, 1)),
}


# Versions 1 and 2 here; version 3 runs float32 only (float64 runs version 2), so it takes every example
# again in float32 below (test_conv_examples_version3_float32), not a second run of version 2.
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_conv_examples(name, version):
    check_conv(EXAMPLES[name], version)


# Version 3 with 3 and 5 splits on this problem, against the reference: test_backward_filter_split_k_is_deterministic
# (version 3 is conv2d_backward_filter's default), which also checks the bits; not run twice.
@pytest.mark.parametrize("splits, version", [(2, 2), (3, 2), (5, 2), (2, 3)])
def test_backward_filter_split_k(splits, version):
    # K = N*Ho*Wo = 2*7*5 = 70: 5 stages of 16 (version 3: 9 of 8, rounded to 10); the last split may be short
    # or empty of whole stages.
    check_conv(P(2, 3, 4, 7, 5, 3, 3, padding=1, dtype="float32"), version, ["backward_filter"], splits=splits)


# Version 3 runs float32 only (float64 runs version 2), in 128 x 128 tiles: the named examples again in
# float32, and problems with two blocks along each of its GEMM dimensions.
VERSION3_EXAMPLES = {  # (version 2's two-column-blocks examples fit one 128-wide block: the 128 ones replace them)
    **{name: dataclasses.replace(problem, dtype="float32") for name, problem in EXAMPLES.items()
       if name not in ("two-column-blocks", "two-filter-column-blocks")},
    # M = 144 > 128: two row blocks in the forward and backward-data GEMMs
    "two-row-blocks-128": P(1, 1, 2, 12, 12, 1, 1, dtype="float32"),
    # F = 130 > 128: two column blocks in the forward and backward-filter GEMMs
    "two-column-blocks-128": P(1, 1, 130, 2, 1, 1, 1, dtype="float32"),
    # C/g*Kh*Kw = 135 > 128: two row blocks in backward-filter, and 18 stages of 8 (9 passes) in the forward
    "two-filter-row-blocks-128": P(1, 15, 2, 3, 3, 3, 3, padding=1, dtype="float32"),
    # stride 3 with dilation 2 and padding: backward-data's remainders (folded into its depth test)
    "stride3-dilation2": P(1, 2, 3, 11, 10, 3, 2, stride=3, padding=(2, 1), dilation=2, dtype="float32"),
}


@pytest.mark.parametrize("name", sorted(VERSION3_EXAMPLES))
def test_conv_examples_version3_float32(name):
    check_conv(VERSION3_EXAMPLES[name], 3)


@pytest.mark.parametrize("splits", [1, 3, 5])
def test_backward_filter_split_k_is_deterministic(splits):
    """dw is the split partials added in the order 0, 1, ..., splits-1, bit for bit, and the same on every run.

    With partial tiles added atomically the order of the additions (and so the float32
    rounding) would follow the order the blocks finish in.  The simulator runs blocks in a
    fixed order, so test_kernel_compile.py also checks that the compiled kernels hold no atomics.
    """
    problem = P(2, 3, 4, 7, 5, 3, 3, padding=1, groups=1, dtype="float32")  # K = 70: 5 stages of 16
    x, _, _, dy = problem.arrays(seed=11)
    x_d, dy_d = dev(x, dy)
    g = problem.geometry
    F, Cg, Kh, Kw = problem.w_shape
    partial = to_host(conv_backward_filter.backward_filter_partials(x_d, dy_d, problem.w_shape, splits=splits, **g))
    assert partial.shape == (splits, F, Cg * Kh * Kw) and partial.dtype == numpy.float32
    in_order = partial[0]
    for s in range(1, splits):
        in_order = in_order + partial[s]  # float32 + float32, rounded after each addition
    runs = [to_host(kernels.conv2d_backward_filter(x_d, dy_d, problem.w_shape, splits=splits, **g)) for _ in range(2)]
    assert numpy.array_equal(runs[0], in_order.reshape(problem.w_shape))
    assert numpy.array_equal(runs[0], runs[1])
    N, Ho, Wo = problem.x_shape[0], *problem.out_hw
    check(runs[0], ref.conv2d_backward_filter(x, dy, problem.w_shape, **g), N * Ho * Wo, "backward-filter")


def test_numpy_backend_is_bit_identical_run_to_run():
    """docs/kernels.md promises it: the three conv passes of the numpy backend, twice, bit for bit."""
    problem = P(2, 4, 6, 7, 6, 3, 3, stride=2, padding=1, groups=2, dtype="float32")
    x, w, _, dy = problem.arrays(seed=3)
    g = problem.geometry
    passes = lambda: (HOST.conv2d_forward(x, w, **g), HOST.conv2d_backward_data(dy, w, x.shape, **g),  # noqa: E731
                      HOST.conv2d_backward_filter(x, dy, w.shape, **g))
    first, second = passes(), passes()
    assert all(numpy.array_equal(a, b) for a, b in zip(first, second))


# ----------------------------------------------------- argument errors match the reference


def reference_error(fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return re.escape(str(info.value))


x4, w4 = numpy.zeros((1, 4, 5, 5)), numpy.zeros((2, 2, 3, 3))
BAD_CONV = {
    "stride-zero": (x4, w4, dict(stride=0, groups=2)),
    "negative-padding": (x4, w4, dict(padding=-1, groups=2)),
    "dilation-pair-of-three": (x4, w4, dict(dilation=(1, 1, 1), groups=2)),
    "groups-not-dividing": (x4, numpy.zeros((2, 4, 3, 3)), dict(groups=3)),
    "wrong-w-channels": (x4, w4, dict(groups=1)),
    "kernel-too-large": (x4, numpy.zeros((2, 4, 7, 7)), {}),
    "mixed-dtypes": (x4.astype(numpy.float32), numpy.zeros((2, 4, 3, 3)), {}),
    "int-input": (x4.astype(numpy.int64), numpy.zeros((2, 4, 3, 3)), {}),
}


def raises_like_reference(reference_call, kernel_call):
    """If ``reference_call()`` raises ValueError, ``kernel_call()`` raises the same; returns whether it did."""
    try:
        reference_call()
    except ValueError as error:
        with pytest.raises(ValueError, match=re.escape(str(error))):
            kernel_call()
        return True
    return False


def assert_errors_match_reference(name, dims, x, w, kw, dy):
    """Each version's ``dims``-D kernels raise the reference's ValueError, word for word, in every
    pass the reference refuses, and the reference refuses at least one (tests/cuda_kernels/test_kernels3d.py too)."""
    x_d, w_d, dy_d = dev(x, w, dy)
    conv = {step: (getattr(ref, f"conv{dims}d_{step}"), getattr(kernels, f"conv{dims}d_{step}"))
            for step in ("forward", "backward_data", "backward_filter")}
    for version in VERSIONS:
        (ref_fwd, fwd), (ref_data, data), (ref_filter, filt) = conv.values()
        raised = [
            raises_like_reference(lambda: ref_fwd(x, w, **kw), lambda: fwd(x_d, w_d, version=version, **kw)),
            raises_like_reference(lambda: ref_data(dy, w, x.shape, **kw),
                                  lambda: data(dy_d, w_d, x.shape, version=version, **kw)),
            raises_like_reference(lambda: ref_filter(x, dy, w.shape, **kw),
                                  lambda: filt(x_d, dy_d, w.shape, version=version, **kw)),
        ]
        assert any(raised), f"{name}: the reference accepted these arguments in every pass"


@pytest.mark.parametrize("name", sorted(BAD_CONV))
def test_conv_errors_match_reference(name):
    x, w, kw = BAD_CONV[name]
    assert_errors_match_reference(name, 2, x, w, kw, numpy.zeros((1, 2, 3, 3), dtype=x.dtype))


def test_conv_dy_shape_and_bias_errors_match_reference():
    x, w, dy = numpy.zeros((1, 2, 5, 5)), numpy.zeros((3, 2, 3, 3)), numpy.zeros((1, 3, 4, 3))
    x_d, w_d, dy_d = dev(x, w, dy)
    with pytest.raises(ValueError, match=reference_error(ref.conv2d_backward_data, dy, w, x.shape)):
        kernels.conv2d_backward_data(dy_d, w_d, x.shape)
    with pytest.raises(ValueError, match=reference_error(ref.conv2d_backward_filter, x, dy, w.shape)):
        kernels.conv2d_backward_filter(x_d, dy_d, w.shape)
    b = numpy.zeros(4)
    with pytest.raises(ValueError, match=reference_error(ref.conv2d_forward, x, w, b)):
        kernels.conv2d_forward(x_d, w_d, dev(b))


def test_grid_z_limit_is_checked_before_the_launch():
    """Grid z holds groups x splits slices; CUDA allows 65,535: a caller's ``splits`` past that is refused with
    the largest that fits, and the chosen split never passes it."""
    x, dy = dev(numpy.zeros((1, 4, 3, 3)), numpy.zeros((1, 4, 3, 3)))
    with pytest.raises(ValueError, match=re.escape("splits: 2 groups x 40000 splits = 80000 blocks along grid z, "
                                                   "above CUDA's 65535; pass splits <= 32767")):
        kernels.conv2d_backward_filter(x, dy, (4, 2, 1, 1), groups=2, splits=40000)
    with pytest.raises(ValueError, match="splits: expected a positive int"):
        kernels.conv2d_backward_filter(x, dy, (4, 2, 1, 1), groups=2, splits=0)
    assert conv_backward_filter.split_k(1, 10**9, 60000) == (1, 10**9)  # 65535 // 60000 = 1 split per group
    assert conv_backward_filter.split_k(1, 76800, 1) == conv_backward_filter.choose_splits(1, 76800)  # inside it
    with pytest.raises(ValueError, match="groups: at most 65535 on the cuda backend"):
        conv_backward_filter.split_k(1, 100, 70000)


def test_unknown_version():
    x, w = dev(numpy.zeros((1, 1, 3, 3)), numpy.zeros((1, 1, 1, 1)))
    with pytest.raises(ValueError, match="version: expected 1 .* or 3"):
        kernels.conv2d_forward(x, w, version=4)


def test_version3_refuses_sizes_past_its_32_bit_indices_naming_the_argument():
    """Version 3 indexes with int32: an operand of 2**31 elements or more is refused, by name, with the way out."""
    tiles_v3.check_int32(x=numpy.zeros(3), w=2 ** 31 - 1)  # fits: no error
    with pytest.raises(ValueError, match=r"dy: 2147483648 elements, more than version 3's 32-bit indices .* "
                                         r"use version=2"):
        tiles_v3.check_int32(x=numpy.zeros(3), dy=2 ** 31)
    tiles_v3.check_remainders((2, 2, 2), (1, 7, 7))
    with pytest.raises(ValueError, match=r"stride: \(1, 64, 32\) has more than 1024 remainders.*use version=2"):
        tiles_v3.check_remainders((1, 64, 32), (1, 7, 7))
    with pytest.raises(ValueError, match=r"dy: spatial size \(1, 524288, 1\) .*use version=2"):
        tiles_v3.check_remainders((1, 1, 1), (1, 2 ** 19, 1))


def test_version3_float32_runs_the_register_tiled_kernels(monkeypatch):
    """``version=3`` in float32 launches the three register-tiled kernels (and no version 2 kernel); the results
    are checked against the reference by every test above, which run each version."""
    launched = []
    for module, name in ((conv_forward, "forward_register_tiled"), (conv_backward_data, "backward_data_register_tiled"),
                         (conv_backward_filter, "backward_filter_register_tiled"),
                         (conv_forward, "forward_tiled"), (conv_backward_data, "backward_data_tiled"),
                         (conv_backward_filter, "backward_filter_tiled")):
        factory = getattr(module, name)
        monkeypatch.setattr(module, name, lambda dtype, f=factory, n=name: launched.append(n) or f(dtype))
    check_conv(EXAMPLES["1x1"], 3)  # float32
    assert launched == ["forward_register_tiled", "backward_data_register_tiled", "backward_filter_register_tiled"]


# -------------------------------------------------------------- bias and ReLU


def arrays4(draw_shape, dtype, seed):
    return numpy.random.default_rng(seed).standard_normal(draw_shape).astype(dtype)


shapes4 = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5))


def each_dtype(test):
    """``test`` with an ``@example`` in each dtype, run in every profile (the drawn examples may repeat one)."""
    return example(shape=(2, 3, 4, 5), dtype="float64", seed=1)(example(shape=(1, 2, 5, 3), dtype="float32", seed=2)(test))


@FAST
@given(shapes4, st.sampled_from(DTYPES), st.integers(0, 2**16))
@each_dtype
def test_bias_and_relu(shape, dtype, seed):
    y, dy = arrays4(shape, dtype, seed), arrays4(shape, dtype, seed + 1)
    y[..., 0] = 0.0  # the subgradient at exactly 0
    b = arrays4(shape[1], dtype, seed + 2)
    y_d, dy_d, b_d = dev(y, dy, b)
    out = kernels.bias_add(y_d, b_d)
    assert out is y_d  # in place
    check(y_d, HOST.bias_add(y.copy(), b), 1, "bias_add")
    check(kernels.bias_grad(dy_d), ref.conv2d_backward_bias(dy), shape[0] * shape[2] * shape[3], "bias_grad")
    check(kernels.relu_forward(dy_d), ref.relu_forward(dy), 1, "relu_forward")
    check(kernels.relu_backward(dy_d, dev(y)), ref.relu_backward(dy, y), 1, "relu_backward")


def test_relu_special_values():
    x = numpy.array([[[[-numpy.inf, numpy.inf, numpy.nan, -0.0, 0.0, -1.0, 2.0]]]])
    assert numpy.array_equal(to_host(kernels.relu_forward(dev(x))), ref.relu_forward(x), equal_nan=True)
    dy = numpy.ones_like(x)
    assert numpy.array_equal(to_host(kernels.relu_backward(dev(dy), dev(x))), ref.relu_backward(dy, x))


def test_relu_backward_shape_error_matches_reference():
    dy, x = numpy.zeros((1, 2, 3, 3)), numpy.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match=reference_error(ref.relu_backward, dy, x)):
        kernels.relu_backward(*dev(dy, x))


# ---------------------------------------------------------- batch normalization


@FAST
@given(shapes4, st.sampled_from(DTYPES), st.integers(0, 2**16))
@each_dtype
def test_batch_norm_pieces(shape, dtype, seed):
    N, C, H, W = shape
    rng = numpy.random.default_rng(seed)
    x, dy = (rng.standard_normal(shape) * 3 + 1).astype(dtype), rng.standard_normal(shape).astype(dtype)
    mean, gamma, beta = (rng.standard_normal(C).astype(dtype) for _ in range(3))
    invstd = (rng.random(C) + 0.5).astype(dtype)
    dbeta, dgamma = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    count = 2 * N * H * W  # the global count: as if a second rank held as many samples
    d = dev(x, dy, mean, invstd, gamma, beta, dbeta, dgamma)
    x_d, dy_d, mean_d, invstd_d, gamma_d, beta_d, dbeta_d, dgamma_d = d
    L = N * H * W
    for got, want, name in zip(kernels.batch_norm_sums(x_d), (HOST.batch_norm_sum(x), (x * x).sum(axis=(0, 2, 3))),
                               ("sum x", "sum x^2")):
        check(got, want, L * 10, name)  # x ~ N(1, 9): the sums are larger than the terms' spread
    for got, want, name in zip(kernels.batch_norm_grad_sums(dy_d, x_d, mean_d, invstd_d),
                               HOST.batch_norm_grad_sums(dy, x, mean, invstd), ("sum dy", "sum dy xhat")):
        check(got, want, L * 10, name)
    check(kernels.batch_norm_apply(x_d, mean_d, invstd_d, gamma_d, beta_d),
          HOST.batch_norm_apply(x, mean, invstd, gamma, beta), 4, "batch_norm_apply")
    check(kernels.batch_norm_backward_apply(dy_d, x_d, mean_d, invstd_d, gamma_d, dbeta_d, dgamma_d, count),
          HOST.batch_norm_backward_apply(dy, x, mean, invstd, gamma, dbeta, dgamma, count), 16, "batch_norm_backward_apply")


def test_batch_norm_pieces_recover_the_reference_layer():
    """sums -> mean, invstd -> apply, and grad sums -> backward apply, compose to ref.batch_norm_*."""
    rng = numpy.random.default_rng(3)
    x, dy = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 4, 5))
    gamma, beta = rng.standard_normal(3), rng.standard_normal(3)
    y_ref, saved = ref.batch_norm_forward(x, gamma, beta)
    dx_ref, dgamma_ref, dbeta_ref = ref.batch_norm_backward(dy, x, gamma, saved)
    x_d, dy_d, gamma_d, beta_d = dev(x, dy, gamma, beta)
    count = x.size // x.shape[1]
    s, ss = (to_host(a) for a in kernels.batch_norm_sums(x_d))
    mean = s / count
    invstd = 1.0 / numpy.sqrt(ss / count - mean * mean + 1e-5)
    mean_d, invstd_d = dev(mean, invstd)
    check(kernels.batch_norm_apply(x_d, mean_d, invstd_d, gamma_d, beta_d), y_ref, count, "y")
    dbeta, dgamma = kernels.batch_norm_grad_sums(dy_d, x_d, mean_d, invstd_d)
    check(dbeta, dbeta_ref, count, "dbeta")
    check(dgamma, dgamma_ref, count, "dgamma")
    dx = kernels.batch_norm_backward_apply(dy_d, x_d, mean_d, invstd_d, gamma_d, dbeta, dgamma, count)
    check(dx, dx_ref, count, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_channel_sums_split_across_blocks(dtype):
    """Three blocks per channel (a large GPU's launch), then the fixed-order pass: the sums are right and repeat."""
    rng = numpy.random.default_rng(5)
    x, dy = (rng.standard_normal((2, 2, 5, 7)) * 3 + 1).astype(dtype), rng.standard_normal((2, 2, 5, 7)).astype(dtype)
    mean, invstd = rng.standard_normal(2).astype(dtype), (rng.random(2) + 0.5).astype(dtype)
    x_d, dy_d, mean_d, invstd_d = dev(x, dy, mean, invstd)
    runs = [batch_norm.channel_sums(dy_d, x_d, mean_d, invstd_d, x.dtype, per_channel=3) for _ in range(2)]
    want = HOST.batch_norm_grad_sums(dy, x, mean, invstd)
    for got, again, expected, name in zip(runs[0], runs[1], want, ("sum dy", "sum dy xhat")):
        check(got, expected, 70 * 10, name)
        assert numpy.array_equal(to_host(got), to_host(again)), name
    check(batch_norm.channel_sums(x_d, None, mean_d, invstd_d, x.dtype, per_channel=3), x.sum(axis=(0, 2, 3)), 700, "sum x")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_backward_apply_passes_count_in_the_data_dtype(dtype, monkeypatch):
    """A Python float would reach the kernel as a float64 argument and make the float32 kernel compute in float64
    (test_kernel_compile.py checks the float32 PTX, compiled with the inventory's 's': a scalar in the data's dtype)."""
    launches = []

    class Recorder:
        def __getitem__(self, geometry):
            return lambda *args: launches.append(args)

    monkeypatch.setattr(batch_norm, "batch_norm_backward_apply_kernel", Recorder())
    x = dev(numpy.zeros((1, 2, 2, 2), dtype=dtype))
    v = dev(numpy.zeros(2, dtype=dtype))
    batch_norm.batch_norm_backward_apply(x, x, v, v, v, v, v, 8)
    count = launches[0][7]
    assert type(count) is numpy.dtype(dtype).type and count == 8


def test_channel_sums_fill_the_gpu():
    """C = 64 channels of a ResNet layer at batch 32: about TARGET_BLOCKS blocks, not 64; tiny inputs stay at one."""
    assert 64 * batch_norm.blocks_per_channel(64, 32 * 56 * 56) == TARGET_BLOCKS
    assert batch_norm.blocks_per_channel(2048, 32 * 7 * 7) == 1
    assert batch_norm.blocks_per_channel(3, 2 * 5 * 5) == 1


def test_batch_norm_channel_vector_error():
    x = dev(numpy.zeros((1, 3, 2, 2)))
    v = dev(numpy.zeros(3))
    with pytest.raises(ValueError, match=re.escape("gamma: expected shape (3,) for C=3 channels, got (2,)")):
        kernels.batch_norm_apply(x, v, v, dev(numpy.zeros(2)), v)


# --------------------------------------------------------------------- pooling


@st.composite
def pool_problems(draw, dims=2, max_kernel=3):
    """``(x_shape, kernel, stride or None, padding)`` valid for PyTorch pooling (padding <= kernel / 2), for
    images (``dims=2``) or volumes (``dims=3``, tests/cuda_kernels/test_kernels3d.py)."""
    kernel = draw(st.tuples(*[st.integers(1, max_kernel)] * dims))
    stride = draw(st.none() | st.tuples(*[st.integers(1, 3)] * dims))
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    extra = 4 if dims == 2 else 2  # a volume's threads grow with the cube
    sizes = tuple(draw(st.integers(max(1, k - 2 * p), k - 2 * p + extra)) for k, p in zip(kernel, padding))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3 if dims == 2 else 2)), *sizes), kernel, stride, padding


def check_pooling(problem, dtype, seed, ties):
    """Max and average pooling, forward and backward, of ``problem`` (a ``pool_problems`` draw) against the
    reference: ``y`` and ``argmax`` exactly (the first maximum of each window, padding ``-inf``), the rest
    to rounding (the kernels add a window's terms in another order)."""
    x_shape, kernel, stride, padding = problem
    pool = lambda module, name: getattr(module, name.format(len(x_shape) - 2))  # noqa: E731  max_pool{}d_forward
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    if ties:  # few distinct values: windows hold several maxima, and the first must win
        x = numpy.round(x).astype(dtype)
    y, argmax = pool(ref, "max_pool{}d_forward")(x, kernel, stride, padding)
    dy = rng.standard_normal(y.shape).astype(dtype)
    x_d, dy_d = dev(x, dy)
    y_d, argmax_d = pool(kernels, "max_pool{}d_forward")(x_d, kernel, stride, padding)
    assert numpy.array_equal(to_host(y_d), y) and to_host(y_d).dtype == y.dtype, "max pooling forward"
    assert numpy.array_equal(to_host(argmax_d), argmax) and to_host(argmax_d).dtype == numpy.int64, "argmax"
    window, args = int(numpy.prod(kernel)), (kernel, stride, padding)
    check(pool(kernels, "max_pool{}d_backward")(dy_d, argmax_d, x_shape, *args),
          pool(ref, "max_pool{}d_backward")(dy, argmax, x_shape, *args), window, "max pooling backward")
    check(pool(kernels, "avg_pool{}d_forward")(x_d, *args),
          pool(ref, "avg_pool{}d_forward")(x, *args), window, "average pooling forward")
    check(pool(kernels, "avg_pool{}d_backward")(dy_d, x_shape, *args),
          pool(ref, "avg_pool{}d_backward")(dy, x_shape, *args), window, "average pooling backward")


@FAST
@given(pool_problems(), st.sampled_from(DTYPES), st.integers(0, 2**16), st.booleans())
@example(problem=((2, 3, 5, 4), (3, 2), None, (1, 1)), dtype="float32", seed=1, ties=True)  # stride = kernel
@example(problem=((1, 2, 6, 5), (2, 3), (1, 2), (1, 0)), dtype="float64", seed=2, ties=False)  # overlapping
def test_pooling(problem, dtype, seed, ties):
    check_pooling(problem, dtype, seed, ties)


def test_pooling_errors_match_reference():
    x = numpy.zeros((1, 1, 4, 4))
    for args in [(3, 1, 2), (0, None, 0), (5, None, 0)]:
        with pytest.raises(ValueError, match=reference_error(ref.max_pool2d_forward, x, *args)):
            kernels.max_pool2d_forward(dev(x), *args)
        with pytest.raises(ValueError, match=reference_error(ref.avg_pool2d_forward, x, *args)):
            kernels.avg_pool2d_forward(dev(x), *args)


# ---------------------------------------------------------------- the backend wires them up


def test_cuda_backend_calls_the_kernels():
    x, w = numpy.ones((1, 2, 4, 4)), numpy.ones((3, 2, 3, 3))
    for version in VERSIONS:
        backend = get_backend("cuda", version)
        y = backend.conv2d_forward(backend.asarray(x), backend.asarray(w), padding=1)
        check(y, ref.conv2d_forward(x, w, padding=1), 18, f"CudaBackend(version={version})")
