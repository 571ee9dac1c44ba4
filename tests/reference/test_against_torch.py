"""Cross-check the reference against PyTorch, where PyTorch is installed.

Where torch is not installed these tests are reported as skipped (not passed);
CI installs the CPU build (``.ci/run``), and so can a developer:
``pip install torch==2.13.0`` in the venv.
"""

import numpy
import pytest
from hypothesis import given, settings

from conv_checks import passes
from refconv import reference as ref
from refconv.testing.strategies import PADDING_MODES, conv_problems

torch = pytest.importorskip("torch")
F = torch.nn.functional


def t(a):
    return torch.tensor(a, requires_grad=True)


def assert_conv_matches_torch(problem, close):
    """The reference's passes of ``problem`` (2-D or 3-D) against torch's functional conv2d/conv3d
    and autograd: forward, the gradients of x, w and b (tests/reference/test_against_torch3d.py too)."""
    x, w, b, dy = problem.arrays(seed=3)
    g, dims = problem.geometry, x.ndim - 2
    xt, wt, bt = t(x), t(w), t(b)
    yt = getattr(F, f"conv{dims}d")(xt, wt, bt, **g)
    yt.backward(torch.tensor(dy))
    forward, backward_data, backward_filter = passes(dims)
    numpy.testing.assert_allclose(forward(x, w, b, **g), yt.detach().numpy(), **close)
    numpy.testing.assert_allclose(backward_data(dy, w, x.shape, **g), xt.grad.numpy(), **close)
    numpy.testing.assert_allclose(backward_filter(x, dy, w.shape, **g), wt.grad.numpy(), **close)
    numpy.testing.assert_allclose(getattr(ref, f"conv{dims}d_backward_bias")(dy), bt.grad.numpy(), **close)


@settings(max_examples=60)
@given(conv_problems(max_channels=6, max_kernel=4, padding_strings=True))
def test_conv_matches_torch(problem):
    assert_conv_matches_torch(problem, dict(rtol=1e-10, atol=1e-10))


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


# (dims, kernel, stride, padding): 2-D pooling and 3-D pooling (refconv.reference's *3d functions)
POOLS = [(2, 2, None, 0), (2, 3, 2, 1), (2, 3, 1, 1), (2, 2, 3, 1),
         (3, 2, None, 0), (3, 3, 2, 1), (3, (3, 1, 2), (1, 2, 1), (1, 0, 1)), (3, 2, 3, 1)]


@pytest.mark.parametrize("dims, k, s, p", POOLS)
def test_pooling_matches_torch(dims, k, s, p):
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6) if dims == 2 else (2, 3, 5, 7, 6))
    for kind in ("max", "avg"):
        xt = t(x)
        yt = getattr(F, f"{kind}_pool{dims}d")(xt, k, s, p)
        dy = rng.standard_normal(tuple(yt.shape))
        yt.backward(torch.tensor(dy))
        forward, backward = (getattr(ref, f"{kind}_pool{dims}d_{step}") for step in ("forward", "backward"))
        if kind == "max":
            y, arg = forward(x, k, s, p)
            dx = backward(dy, arg, x.shape, k, s, p)
        else:
            y = forward(x, k, s, p)
            dx = backward(dy, x.shape, k, s, p)
        numpy.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12)
        numpy.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (3, 4, 3, 5, 2)], ids=["2d", "3d"])
def test_batch_norm_matches_torch(shape):
    rng = numpy.random.default_rng(1)
    C = shape[1]
    x, gamma, beta = rng.standard_normal(shape), rng.standard_normal(C), rng.standard_normal(C)
    dy = rng.standard_normal(x.shape)
    rm, rv = numpy.zeros(C), numpy.ones(C)
    xt, gt, bt = t(x), t(gamma), t(beta)
    rmt, rvt = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
    yt = F.batch_norm(xt, rmt, rvt, gt, bt, training=True, momentum=0.1, eps=1e-5)
    yt.backward(torch.tensor(dy))
    suffix = "" if len(shape) == 4 else "3d"
    y, saved = getattr(ref, f"batch_norm{suffix}_forward")(x, gamma, beta, running_mean=rm, running_var=rv)
    dx, dgamma, dbeta = getattr(ref, f"batch_norm{suffix}_backward")(dy, x, gamma, saved)
    for ours, theirs in [(y, yt.detach()), (dx, xt.grad), (dgamma, gt.grad), (dbeta, bt.grad), (rm, rmt), (rv, rvt)]:
        numpy.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-10, atol=1e-12)


def test_cross_entropy_matches_torch():
    rng = numpy.random.default_rng(1)
    logits, labels = rng.standard_normal((6, 4)), rng.integers(0, 4, 6)
    lt = t(logits)
    loss_t = F.cross_entropy(lt, torch.tensor(labels))
    loss_t.backward()
    loss, probs = ref.softmax_cross_entropy_forward(logits, labels)
    assert loss == pytest.approx(loss_t.item(), rel=1e-12)
    numpy.testing.assert_allclose(ref.softmax_cross_entropy_backward(probs, labels), lt.grad.numpy(), rtol=1e-10)
