"""The reference layers: gradients match finite differences on every entry (float64)."""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import reference as ref

from finite_differences import check_gradient


@st.composite
def pool_cases(draw):
    k = draw(st.integers(1, 3))
    s = draw(st.integers(1, 3))
    p = draw(st.integers(0, k // 2))
    H = draw(st.integers(max(1, k - 2 * p), k + 4))
    W = draw(st.integers(max(1, k - 2 * p), k + 4))
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), H, W), k, s, p


def rand(shape, seed):
    return numpy.random.default_rng(seed).standard_normal(shape)


def test_relu():
    x = rand((2, 3, 4, 5), 0)
    x[numpy.abs(x) < 1e-3] = 0.5  # keep finite differences away from the kink
    dy = rand(x.shape, 1)
    numpy.testing.assert_array_equal(ref.relu_forward(x), numpy.where(x > 0, x, 0))
    check_gradient(lambda x_: float((ref.relu_forward(x_) * dy).sum()), x, ref.relu_backward(dy, x))


@settings(max_examples=20)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_batch_norm(N, C, H, W):
    if N * H * W == 1:
        N = 2  # one element per channel has zero variance: the gradient is 0/0-sensitive
    x, gamma, beta, dy = rand((N, C, H, W), 0), rand(C, 1), rand(C, 2), rand((N, C, H, W), 3)
    y, saved = ref.batch_norm_forward(x, gamma, beta)
    numpy.testing.assert_allclose(y.mean(axis=(0, 2, 3)), beta, atol=1e-12)
    dx, dgamma, dbeta = ref.batch_norm_backward(dy, x, gamma, saved)
    loss = lambda x_, g_, b_: float((ref.batch_norm_forward(x_, g_, b_)[0] * dy).sum())  # noqa: E731
    check_gradient(lambda x_: loss(x_, gamma, beta), x, dx, rtol=1e-5, atol=1e-7)
    check_gradient(lambda g_: loss(x, g_, beta), gamma, dgamma)
    check_gradient(lambda b_: loss(x, gamma, b_), beta, dbeta)


def test_batch_norm_running_statistics():
    x = rand((4, 3, 2, 2), 0)
    rm, rv = numpy.zeros(3), numpy.ones(3)
    ref.batch_norm_forward(x, numpy.ones(3), numpy.zeros(3), running_mean=rm, running_var=rv, momentum=0.1)
    numpy.testing.assert_allclose(rm, 0.1 * x.mean(axis=(0, 2, 3)))
    numpy.testing.assert_allclose(rv, 0.9 + 0.1 * x.var(axis=(0, 2, 3), ddof=1))


@settings(max_examples=30)
@given(pool_cases())
def test_max_pool(case):
    shape, k, s, p = case
    x = rand(shape, 4)
    y, argmax = ref.max_pool2d_forward(x, k, s, p)
    dy = rand(y.shape, 5)
    dx = ref.max_pool2d_backward(dy, argmax, x.shape, k, s, p)
    check_gradient(lambda x_: float((ref.max_pool2d_forward(x_, k, s, p)[0] * dy).sum()), x, dx)


@settings(max_examples=30)
@given(pool_cases())
def test_avg_pool(case):
    shape, k, s, p = case
    x = rand(shape, 6)
    y = ref.avg_pool2d_forward(x, k, s, p)
    dy = rand(y.shape, 7)
    dx = ref.avg_pool2d_backward(dy, x.shape, k, s, p)
    check_gradient(lambda x_: float((ref.avg_pool2d_forward(x_, k, s, p) * dy).sum()), x, dx)


def test_max_pool_known_values():
    x = numpy.arange(16.0).reshape(1, 1, 4, 4)
    y, _ = ref.max_pool2d_forward(x, 2)
    numpy.testing.assert_array_equal(y[0, 0], [[5, 7], [13, 15]])
    y, _ = ref.max_pool2d_forward(x, 3, stride=2, padding=1)
    numpy.testing.assert_array_equal(y[0, 0], [[5, 7], [13, 15]])
    numpy.testing.assert_array_equal(ref.avg_pool2d_forward(x, 2)[0, 0], [[2.5, 4.5], [10.5, 12.5]])


def test_global_avg_pool():
    x, dy = rand((2, 3, 4, 5), 8), rand((2, 3), 9)
    numpy.testing.assert_allclose(ref.global_avg_pool_forward(x), x.mean(axis=(2, 3)))
    check_gradient(lambda x_: float((ref.global_avg_pool_forward(x_) * dy).sum()), x, ref.global_avg_pool_backward(dy, x.shape))


def test_linear():
    x, w, b, dy = rand((3, 4), 10), rand((5, 4), 11), rand(5, 12), rand((3, 5), 13)
    dx, dw, db = ref.linear_backward(dy, x, w)
    loss = lambda x_, w_, b_: float((ref.linear_forward(x_, w_, b_) * dy).sum())  # noqa: E731
    check_gradient(lambda x_: loss(x_, w, b), x, dx)
    check_gradient(lambda w_: loss(x, w_, b), w, dw)
    check_gradient(lambda b_: loss(x, w, b_), b, db)


@pytest.mark.parametrize("N, K", [(1, 2), (4, 3), (7, 10)])
def test_softmax_cross_entropy(N, K):
    logits = rand((N, K), 14) * 3
    labels = numpy.random.default_rng(15).integers(0, K, N)
    loss, probs = ref.softmax_cross_entropy_forward(logits, labels)
    expected = -numpy.mean([logits[n, labels[n]] - numpy.log(numpy.exp(logits[n]).sum()) for n in range(N)])
    assert loss == pytest.approx(expected, rel=1e-12)
    check_gradient(lambda l_: float(ref.softmax_cross_entropy_forward(l_, labels)[0]), logits,
                   ref.softmax_cross_entropy_backward(probs, labels))
