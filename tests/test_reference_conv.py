"""The reference convolution: two formulations agree, and gradients match finite differences."""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import reference as ref
from refconv.testing.strategies import conv_problems

from finite_differences import check_gradient


@settings(max_examples=150)
@given(conv_problems(dtypes=("float64", "float32")))
def test_vectorised_matches_loops(problem):
    x, w, b, dy = problem.arrays(seed=1)
    g = problem.geometry
    tol = dict(rtol=1e-12, atol=1e-12) if problem.dtype == "float64" else dict(rtol=1e-4, atol=1e-4)
    y = ref.conv2d_forward(x, w, b, **g)
    assert y.shape == problem.y_shape and y.dtype == x.dtype
    numpy.testing.assert_allclose(y, ref.loops.conv2d_forward(x, w, b, **g), **tol)
    dx = ref.conv2d_backward_data(dy, w, x.shape, **g)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    numpy.testing.assert_allclose(dx, ref.loops.conv2d_backward_data(dy, w, x.shape, **g), **tol)
    dw = ref.conv2d_backward_filter(x, dy, w.shape, **g)
    assert dw.shape == w.shape and dw.dtype == x.dtype
    numpy.testing.assert_allclose(dw, ref.loops.conv2d_backward_filter(x, dy, w.shape, **g), **tol)


@settings(max_examples=40)
@given(conv_problems(max_channels=3, max_extra=2))
def test_conv_gradients_match_finite_differences(problem):
    x, w, b, dy = problem.arrays(seed=2)
    g = problem.geometry
    loss = lambda x_, w_, b_: float((ref.conv2d_forward(x_, w_, b_, **g) * dy).sum())  # noqa: E731
    check_gradient(lambda x_: loss(x_, w, b), x, ref.conv2d_backward_data(dy, w, x.shape, **g))
    check_gradient(lambda w_: loss(x, w_, b), w, ref.conv2d_backward_filter(x, dy, w.shape, **g))
    check_gradient(lambda b_: loss(x, w, b_), b, ref.conv2d_backward_bias(dy))


@pytest.mark.parametrize(
    "x_shape, w_shape, kwargs, out_hw",
    [
        ((1, 1, 5, 5), (1, 1, 3, 3), {}, (3, 3)),
        ((1, 1, 5, 5), (1, 1, 3, 3), dict(padding=1), (5, 5)),
        ((1, 1, 7, 6), (1, 1, 3, 2), dict(stride=(2, 3), padding=(1, 0)), (4, 2)),
        ((1, 1, 9, 9), (1, 1, 3, 3), dict(dilation=2), (5, 5)),
        ((1, 4, 5, 5), (6, 2, 1, 1), dict(groups=2), (5, 5)),
        ((1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3), (112, 112)),
    ],
)
def test_output_size_follows_pytorch(x_shape, w_shape, kwargs, out_hw):
    y = ref.conv2d_forward(numpy.zeros(x_shape), numpy.zeros(w_shape), **kwargs)
    assert y.shape == (x_shape[0], w_shape[0], *out_hw)


def test_known_values():
    x = numpy.arange(16, dtype=numpy.float64).reshape(1, 1, 4, 4)
    w = numpy.ones((1, 1, 2, 2))
    y = ref.conv2d_forward(x, w, numpy.array([0.5]), stride=2)
    numpy.testing.assert_array_equal(y[0, 0], [[10.5, 18.5], [42.5, 50.5]])
    # A grouped conv is the per-group conv of the channel slices.
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 5))
    w = rng.standard_normal((6, 2, 3, 3))
    y = ref.conv2d_forward(x, w, groups=2)
    numpy.testing.assert_allclose(y[:, :3], ref.conv2d_forward(x[:, :2], w[:3]))
    numpy.testing.assert_allclose(y[:, 3:], ref.conv2d_forward(x[:, 2:], w[3:]))


@given(st.sampled_from(["float32", "float64"]))
def test_dtype_is_preserved(dtype):
    x = numpy.ones((1, 2, 4, 4), dtype=dtype)
    w = numpy.ones((3, 2, 3, 3), dtype=dtype)
    assert ref.conv2d_forward(x, w).dtype == dtype
