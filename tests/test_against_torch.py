"""Cross-check the reference against PyTorch, where PyTorch is installed.

Where torch is not installed these tests are reported as skipped (not passed);
CI installs the CPU build (``.ci/run``), and so can a developer:
``pip install torch==2.13.0`` in the venv.
"""

import numpy
import pytest
from hypothesis import given, settings

from refconv import reference as ref
from refconv.testing.strategies import PADDING_MODES, conv_problems

torch = pytest.importorskip("torch")
F = torch.nn.functional


def t(a):
    return torch.tensor(a, requires_grad=True)


@settings(max_examples=60)
@given(conv_problems(max_channels=6, max_kernel=4, padding_strings=True))
def test_conv_matches_torch(problem):
    x, w, b, dy = problem.arrays(seed=3)
    g = problem.geometry
    xt, wt, bt = t(x), t(w), t(b)
    yt = F.conv2d(xt, wt, bt, **g)
    yt.backward(torch.tensor(dy))
    numpy.testing.assert_allclose(ref.conv2d_forward(x, w, b, **g), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    numpy.testing.assert_allclose(ref.conv2d_backward_data(dy, w, x.shape, **g), xt.grad.numpy(), rtol=1e-10, atol=1e-10)
    numpy.testing.assert_allclose(ref.conv2d_backward_filter(x, dy, w.shape, **g), wt.grad.numpy(), rtol=1e-10, atol=1e-10)
    numpy.testing.assert_allclose(ref.conv2d_backward_bias(dy), bt.grad.numpy(), rtol=1e-10, atol=1e-10)


@settings(max_examples=40)
@given(conv_problems(max_channels=4, padding_strings=True, padding_modes=PADDING_MODES))
def test_conv_module_padding_modes_match_torch(problem):
    """torch.nn.Conv2d(padding_mode=...) against the reference with the same padding_mode."""
    p = problem
    x, w, b, dy = p.arrays(seed=4)
    conv = torch.nn.Conv2d(p.C, p.F, (p.Kh, p.Kw), p.stride, p.padding, p.dilation, p.groups,
                           padding_mode=p.padding_mode, dtype=torch.float64)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(w))
        conv.bias.copy_(torch.tensor(b))
    xt = t(x)
    yt = conv(xt)
    yt.backward(torch.tensor(dy))
    g = dict(p.geometry, padding_mode=p.padding_mode)
    close = dict(rtol=1e-10, atol=1e-10)
    numpy.testing.assert_allclose(ref.conv2d_forward(x, w, b, **g), yt.detach().numpy(), **close)
    numpy.testing.assert_allclose(ref.conv2d_backward_data(dy, w, x.shape, **g), xt.grad.numpy(), **close)
    numpy.testing.assert_allclose(ref.conv2d_backward_filter(x, dy, w.shape, **g), conv.weight.grad.numpy(), **close)


@pytest.mark.parametrize("k, s, p", [(2, None, 0), (3, 2, 1), (3, 1, 1), (2, 3, 1)])
def test_pooling_matches_torch(k, s, p):
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6))
    for kind in ("max", "avg"):
        xt = t(x)
        yt = (F.max_pool2d if kind == "max" else F.avg_pool2d)(xt, k, s, p)
        dy = rng.standard_normal(tuple(yt.shape))
        yt.backward(torch.tensor(dy))
        if kind == "max":
            y, arg = ref.max_pool2d_forward(x, k, s, p)
            dx = ref.max_pool2d_backward(dy, arg, x.shape, k, s, p)
        else:
            y = ref.avg_pool2d_forward(x, k, s, p)
            dx = ref.avg_pool2d_backward(dy, x.shape, k, s, p)
        numpy.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12)
        numpy.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12)


def test_batch_norm_and_cross_entropy_match_torch():
    rng = numpy.random.default_rng(1)
    x, gamma, beta = rng.standard_normal((4, 3, 5, 5)), rng.standard_normal(3), rng.standard_normal(3)
    dy = rng.standard_normal(x.shape)
    rm, rv = numpy.zeros(3), numpy.ones(3)
    xt, gt, bt = t(x), t(gamma), t(beta)
    rmt, rvt = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    yt = F.batch_norm(xt, rmt, rvt, gt, bt, training=True, momentum=0.1, eps=1e-5)
    yt.backward(torch.tensor(dy))
    y, saved = ref.batch_norm_forward(x, gamma, beta, running_mean=rm, running_var=rv)
    dx, dgamma, dbeta = ref.batch_norm_backward(dy, x, gamma, saved)
    for ours, theirs in [(y, yt.detach()), (dx, xt.grad), (dgamma, gt.grad), (dbeta, bt.grad), (rm, rmt), (rv, rvt)]:
        numpy.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-10, atol=1e-12)
    logits, labels = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    lt = t(logits)
    loss_t = F.cross_entropy(lt, torch.tensor(labels))
    loss_t.backward()
    loss, probs = ref.softmax_cross_entropy_forward(logits, labels)
    assert loss == pytest.approx(loss_t.item(), rel=1e-12)
    numpy.testing.assert_allclose(ref.softmax_cross_entropy_backward(probs, labels), lt.grad.numpy(), rtol=1e-10)
