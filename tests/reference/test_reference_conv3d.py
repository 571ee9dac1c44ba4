"""The 3-D reference: the vectorised convolution, pooling and batch norm against their loop
oracles (refconv.reference.conv3d_loops), gradients against finite differences, and errors."""

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from conv_checks import assert_gradients_match_finite_differences, assert_vectorised_matches_loops
from finite_differences import check_gradient
from refconv import reference as ref
from refconv.reference import conv3d
from refconv.testing.strategies import PADDING_MODES, conv3d_problems


@pytest.mark.parametrize("per_sample_from", [1, None], ids=["per-sample", "whole-batch"])
@settings(max_examples=40, deadline=None)
@given(conv3d_problems(dtypes=("float64", "float32"), padding_strings=True, padding_modes=PADDING_MODES))
def test_vectorised_matches_loops(per_sample_from, problem):
    """Both ways forward and backward-data multiply (``conv3d.PER_SAMPLE_MIN_VOXELS``): sample by
    sample for every output, and the whole batch in one product for every output."""
    rule = conv3d.PER_SAMPLE_MIN_VOXELS
    conv3d.PER_SAMPLE_MIN_VOXELS = per_sample_from or float("inf")
    try:
        assert_vectorised_matches_loops(problem, 3)
    finally:
        conv3d.PER_SAMPLE_MIN_VOXELS = rule


@settings(max_examples=15, deadline=None)
@given(conv3d_problems(max_channels=2, max_kernel=2, max_extra=1, padding_strings=True, padding_modes=PADDING_MODES))
def test_conv3d_gradients_match_finite_differences(problem):
    assert_gradients_match_finite_differences(problem, 3)


@pytest.mark.parametrize(
    "x_shape, w_shape, kwargs, out",
    [
        ((1, 1, 5, 5, 5), (1, 1, 3, 3, 3), {}, (3, 3, 3)),
        ((1, 1, 5, 6, 7), (1, 1, 3, 3, 3), dict(padding=1), (5, 6, 7)),
        ((1, 1, 7, 6, 5), (1, 1, 3, 2, 1), dict(stride=(2, 3, 1), padding=(1, 0, 2)), (4, 2, 9)),
        ((1, 1, 9, 9, 9), (1, 1, 3, 3, 3), dict(dilation=(2, 1, 3)), (5, 7, 3)),
        ((1, 4, 5, 5, 5), (6, 2, 1, 1, 1), dict(groups=2), (5, 5, 5)),
        ((1, 4, 128, 128, 128), (16, 4, 3, 3, 3), dict(padding=1, stride=2), (64, 64, 64)),  # CosmoFlow's first layer
        ((1, 1, 7, 6, 5), (1, 1, 4, 2, 3), dict(padding="same"), (7, 6, 5)),  # even kernels: one more pad on the high side
        ((1, 1, 7, 6, 5), (1, 1, 3, 2, 2), dict(padding="same", dilation=(2, 3, 1)), (7, 6, 5)),
        ((1, 1, 7, 6, 5), (1, 1, 3, 2, 2), dict(padding="valid", dilation=(2, 1, 1)), (3, 5, 4)),
    ],
)
def test_output_size_follows_pytorch(x_shape, w_shape, kwargs, out):
    geometry = dict(dict(stride=1, padding=0, dilation=1, groups=1), **kwargs)
    assert ref.conv_geometry(x_shape, w_shape, dims=3, **geometry)[4] == out
    if numpy.prod(x_shape) < 10 ** 4:
        y = ref.conv3d_forward(numpy.zeros(x_shape), numpy.zeros(w_shape), **kwargs)
        assert y.shape == (x_shape[0], w_shape[0], *out)


def test_known_values_and_the_2d_case():
    x = numpy.arange(8, dtype=numpy.float64).reshape(1, 1, 2, 2, 2)
    y = ref.conv3d_forward(x, numpy.ones((1, 1, 2, 2, 2)), numpy.array([0.5]))
    assert y.shape == (1, 1, 1, 1, 1) and y.item() == 28.5
    # A depth-1 volume with a depth-1 kernel is the 2-D convolution of its one plane.
    rng = numpy.random.default_rng(0)
    x, w = rng.standard_normal((2, 4, 1, 6, 5)), rng.standard_normal((6, 2, 1, 3, 2))
    g = dict(stride=(1, 2, 1), padding=(0, 1, 1), dilation=(1, 1, 2), groups=2)
    g2 = {k: v[1:] if isinstance(v, tuple) else v for k, v in g.items()}
    numpy.testing.assert_allclose(ref.conv3d_forward(x, w, **g)[:, :, 0], ref.conv2d_forward(x[:, :, 0], w[:, :, 0], **g2))


def test_vol2col_and_col2vol_are_adjoint():
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 5, 3))
    geometry = dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2))
    cols = ref.vol2col(x, (2, 3, 2), out=(5, 2, 3), **geometry)
    assert cols.shape == (2, 3, 2, 3, 2, 5, 2, 3)
    c = rng.standard_normal(cols.shape)
    # <vol2col(x), c> == <x, col2vol(c)>
    assert numpy.isclose((cols * c).sum(), (x * ref.col2vol(c, x.shape, **geometry)).sum())


x5 = numpy.zeros((2, 4, 6, 6, 6))
w5 = numpy.zeros((4, 4, 3, 3, 3))
dy5 = numpy.zeros((2, 4, 4, 4, 4))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ref.conv3d_forward(x5, numpy.zeros((4, 3, 3, 3, 3))), r"w: expected w.shape\[1\] = C/groups = 4"),
        (lambda: ref.conv3d_forward(x5, w5, numpy.zeros(3)), r"b: expected shape \(4,\)"),
        (lambda: ref.conv3d_forward(x5, w5, stride=0), r"stride: expected positive integers, got \(0, 0, 0\)"),
        (lambda: ref.conv3d_forward(x5, w5, stride=(1, 2)), r"stride: expected an int or a \(d, h, w\) triple"),
        (lambda: ref.conv3d_forward(x5, w5, padding=(1, 1)), r"padding: expected an int or a \(d, h, w\) triple"),
        (lambda: ref.conv3d_forward(x5, w5, dilation=(1, 0, 1)), r"dilation: expected positive"),
        (lambda: ref.conv3d_forward(x5, w5, padding=-1), r"padding: expected non-negative"),
        (lambda: ref.conv3d_forward(x5, w5, padding="full"), r"padding: expected one of \('same', 'valid'\)"),
        (lambda: ref.conv3d_forward(x5, w5, padding="same", stride=(1, 1, 2)),
         r"padding: padding='same' is not supported for strided convolutions \(got stride=\(1, 1, 2\)\)"),
        (lambda: ref.conv3d_forward(x5, numpy.zeros((4, 4, 7, 3, 3))), r"kernel: the dilated kernel spans 7 along D"),
        (lambda: ref.conv3d_forward(x5, w5, dilation=(1, 1, 3)), r"kernel: the dilated kernel spans 7 along W"),
        (lambda: ref.conv3d_forward(x5, w5, groups=3), r"groups: 3 does not divide the input channels C=4"),
        (lambda: ref.conv3d_forward(x5[0], w5), r"x: expected 5 dimensions \(N, C, D, H, W\).*unbatched \(C, D, H, W\)"),
        (lambda: ref.conv3d_forward(x5[:, :, 0], w5), r"x: expected 5 dimensions"),
        (lambda: ref.conv3d_forward(x5, w5[:, :, 0]), r"w: expected 5 dimensions"),
        (lambda: ref.conv3d_forward(x5[:0], w5), r"x_shape: expected 5 positive sizes.*skip the call when a size is 0"),
        (lambda: ref.conv3d_forward(x5, w5.astype(numpy.float32)), r"mixed dtypes"),
        (lambda: ref.conv3d_forward(x5, w5, padding_mode="mirror"), r"padding_mode: expected one of"),
        (lambda: ref.conv3d_forward(x5, w5, padding=(6, 0, 0), padding_mode="reflect"),
         r"padding: padding_mode='reflect' needs pads shorter than the input along D \(6\)"),
        (lambda: ref.conv3d_backward_data(dy5, w5, (2, 4, 6, 6)), r"x_shape: expected 5 positive sizes"),
        (lambda: ref.conv3d_backward_data(dy5[:, :3], w5, x5.shape), r"dy: expected shape \(2, 4, 4, 4, 4\) \(N, F, Do, Ho, Wo\)"),
        (lambda: ref.conv3d_backward_filter(x5, dy5, (4, 4, 3, 3)), r"w_shape: expected 5 positive sizes"),
        (lambda: ref.conv3d_backward_filter(x5, dy5[..., :3], w5.shape), r"dy: expected shape"),
        (lambda: ref.max_pool3d_forward(x5, 2, padding=2), r"padding: expected at most half the kernel size"),
        (lambda: ref.avg_pool3d_forward(x5, (2, 2, 7)), r"kernel: the dilated kernel spans 7 along W"),
        (lambda: ref.max_pool3d_forward(x5[0], 2), r"x: expected 5 dimensions"),
        (lambda: ref.batch_norm3d_forward(x5, numpy.ones(3), numpy.zeros(4)), r"gamma: expected shape \(4,\)"),
        (lambda: ref.batch_norm3d_forward(x5[0], numpy.ones(4), numpy.zeros(4)), r"x: expected 5 dimensions"),
    ],
)
def test_invalid_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ pooling and batch norm


@st.composite
def pool3d_problems(draw):
    """``(x_shape, kernel, stride or None, padding)`` valid for torch's 3-D pooling (padding <= kernel / 2)."""
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(3))
    stride = draw(st.none() | st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)))
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)
    size = tuple(draw(st.integers(max(1, k - 2 * p), k - 2 * p + 3)) for k, p in zip(kernel, padding))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 2)), *size), kernel, stride, padding


@settings(max_examples=40, deadline=None)
@given(pool3d_problems(), st.integers(0, 2 ** 16), st.booleans())
def test_pooling3d_matches_loops(problem, seed, ties):
    x_shape, kernel, stride, padding = problem
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    if ties:  # few distinct values: windows hold several maxima, and the first must win
        x = numpy.round(x)
    k, s, p, out = ref.pool3d_geometry(x_shape, kernel, stride, padding)
    y, argmax = ref.max_pool3d_forward(x, kernel, stride, padding)
    y_loop, argmax_loop = ref.loops3d.max_pool3d_forward(x, k, s, p, out)
    numpy.testing.assert_array_equal(y, y_loop)
    numpy.testing.assert_array_equal(argmax, argmax_loop)
    dy = rng.standard_normal(y.shape)
    numpy.testing.assert_allclose(ref.max_pool3d_backward(dy, argmax, x_shape, kernel, stride, padding),
                                  ref.loops3d.max_pool3d_backward(dy, argmax, x_shape, k, s, p, out), rtol=1e-12)
    numpy.testing.assert_allclose(ref.avg_pool3d_forward(x, kernel, stride, padding),
                                  ref.loops3d.avg_pool3d_forward(x, k, s, p, out), rtol=1e-12, atol=1e-15)
    numpy.testing.assert_allclose(ref.avg_pool3d_backward(dy, x_shape, kernel, stride, padding),
                                  ref.loops3d.avg_pool3d_backward(dy, x_shape, k, s, p, out), rtol=1e-12, atol=1e-15)


def test_avg_pool3d_backward_matches_finite_differences():
    rng = numpy.random.default_rng(4)
    x = rng.standard_normal((1, 2, 4, 3, 5))
    dy = rng.standard_normal(ref.avg_pool3d_forward(x, 3, 2, 1).shape)
    loss = lambda x_: float((ref.avg_pool3d_forward(x_, 3, 2, 1) * dy).sum())  # noqa: E731
    check_gradient(loss, x, ref.avg_pool3d_backward(dy, x.shape, 3, 2, 1))


@pytest.mark.parametrize("shape", [(2, 3, 2, 3, 4), (1, 2, 1, 1, 2), (3, 1, 2, 2, 2)])
def test_batch_norm3d_matches_loops_and_finite_differences(shape):
    rng = numpy.random.default_rng(6)
    x, dy = rng.standard_normal(shape) * 2 + 1, rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    y, saved = ref.batch_norm3d_forward(x, gamma, beta)
    numpy.testing.assert_allclose(y, ref.loops3d.batch_norm3d_forward(x, gamma, beta), rtol=1e-10, atol=1e-12)
    dx, dgamma, dbeta = ref.batch_norm3d_backward(dy, x, gamma, saved)
    loss = lambda x_, g_, b_: float((ref.batch_norm3d_forward(x_, g_, b_)[0] * dy).sum())  # noqa: E731
    check_gradient(lambda x_: loss(x_, gamma, beta), x, dx, rtol=1e-5, atol=1e-7)
    check_gradient(lambda g_: loss(x, g_, beta), gamma, dgamma, rtol=1e-5, atol=1e-7)
    check_gradient(lambda b_: loss(x, gamma, b_), beta, dbeta, rtol=1e-5, atol=1e-7)


def test_batch_norm3d_running_stats_use_every_voxel():
    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((2, 3, 2, 3, 4))
    mean, var = numpy.zeros(3), numpy.ones(3)
    ref.batch_norm3d_forward(x, numpy.ones(3), numpy.zeros(3), running_mean=mean, running_var=var, momentum=1.0)
    per_channel = x.transpose(1, 0, 2, 3, 4).reshape(3, -1)
    numpy.testing.assert_allclose(mean, per_channel.mean(axis=1))
    numpy.testing.assert_allclose(var, per_channel.var(axis=1, ddof=1))
