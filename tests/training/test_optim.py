"""refconv.optim.SGD against a hand-written PyTorch-semantics update (and torch if present)."""

import numpy
import pytest

from refconv.optim import SGD


class Layer:
    """The layer protocol SGD reads: parameters() and gradients()."""

    def __init__(self, **params):
        self.params = params
        self.grads = {k: None for k in params}

    def parameters(self):
        return self.params

    def gradients(self):
        return self.grads


def reference_sgd(p, grads, lr, momentum, weight_decay, nesterov):
    """torch.optim.SGD's documented loop, written out (dampening 0)."""
    p, buf, out = p.copy(), None, []
    for g in grads:
        d_p = g + weight_decay * p
        if momentum:
            buf = d_p.copy() if buf is None else momentum * buf + d_p
            d_p = d_p + momentum * buf if nesterov else buf
        p = p - lr * d_p
        out.append(p)
    return out


CONFIGS = [dict(momentum=0.0, weight_decay=0.0, nesterov=False),
           dict(momentum=0.9, weight_decay=0.0, nesterov=False),
           dict(momentum=0.9, weight_decay=1e-2, nesterov=False),
           dict(momentum=0.5, weight_decay=1e-3, nesterov=True)]


def _run(config, steps=4):
    rng = numpy.random.default_rng(1)
    w0, b0 = rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)
    grads = [(rng.standard_normal(w0.shape), rng.standard_normal(b0.shape)) for _ in range(steps)]
    layer = Layer(weight=w0.copy(), bias=b0.copy())
    weight = layer.params["weight"]                       # updated in place, never rebound
    opt = SGD([("l.weight", layer, "weight"), ("l.bias", layer, "bias")], lr=0.1, **config)
    got = []
    for gw, gb in grads:
        layer.grads = {"weight": gw, "bias": gb}
        opt.step()
        got.append((layer.params["weight"].copy(), layer.params["bias"].copy()))
    assert layer.params["weight"] is weight
    return w0, b0, grads, got, opt


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sgd_matches_pytorch_semantics(config):
    w0, b0, grads, got, _ = _run(config)
    ref_w = reference_sgd(w0, [g for g, _ in grads], 0.1, **config)
    ref_b = reference_sgd(b0, [g for _, g in grads], 0.1, **config)
    for (w, b), rw, rb in zip(got, ref_w, ref_b):
        numpy.testing.assert_allclose(w, rw, rtol=1e-12, atol=1e-14)
        numpy.testing.assert_allclose(b, rb, rtol=1e-12, atol=1e-14)


def test_first_step_by_hand():
    layer = Layer(w=numpy.array([1.0, 2.0]))
    layer.grads = {"w": numpy.array([0.5, -1.0])}
    opt = SGD([("w", layer, "w")], lr=0.1, momentum=0.9, weight_decay=0.1)
    opt.step()                       # d_p = g + 0.1 p = [0.6, -0.8]; buf = d_p; p -= 0.1 buf
    numpy.testing.assert_allclose(layer.params["w"], [0.94, 2.08])
    numpy.testing.assert_allclose(opt.state()["w"], [0.6, -0.8])
    layer.grads = {"w": numpy.array([0.0, 0.0])}
    opt.step()                       # d_p = 0.1 p = [0.094, 0.208]; buf = 0.9 buf + d_p
    numpy.testing.assert_allclose(opt.state()["w"], [0.634, -0.512])
    numpy.testing.assert_allclose(layer.params["w"], [0.94 - 0.0634, 2.08 + 0.0512])


def test_sgd_matches_torch():
    torch = pytest.importorskip("torch")
    for config in CONFIGS:
        w0, b0, grads, got, _ = _run(config)
        w = torch.tensor(w0, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1, **config)
        for (gw, _), (mine, _) in zip(grads, got):
            w.grad = torch.tensor(gw)
            opt.step()
            numpy.testing.assert_allclose(w.detach().numpy(), mine, rtol=1e-12, atol=1e-14)


def test_state_round_trip_continues_exactly():
    config = dict(momentum=0.9, weight_decay=1e-2, nesterov=False)
    _, _, grads, got, opt = _run(config, steps=4)
    # replay: 2 steps, save state, new optimizer from it, 2 more steps
    rng = numpy.random.default_rng(1)
    w0, b0 = rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)
    layer = Layer(weight=w0.copy(), bias=b0.copy())
    entries = [("l.weight", layer, "weight"), ("l.bias", layer, "bias")]
    first = SGD(entries, lr=0.1, **config)
    for gw, gb in grads[:2]:
        layer.grads = {"weight": gw, "bias": gb}
        first.step()
    state = {k: v.copy() for k, v in first.state().items()}
    second = SGD(entries, lr=0.1, **config)
    second.load_state(state)
    for gw, gb in grads[2:]:
        layer.grads = {"weight": gw, "bias": gb}
        second.step()
    assert numpy.array_equal(layer.params["weight"], got[-1][0])


def test_accepts_a_model_and_checks_arguments():
    layer = Layer(w=numpy.zeros(2))

    class Model:
        def named_parameters(self):
            return [("m.w", layer, "w")]

    opt = SGD(Model(), lr=0.1)
    assert list(opt.state()) == ["m.w"]
    assert SGD(Model(), lr=0.1, momentum=0).state() == {}
    with pytest.raises(ValueError, match="no gradient"):
        opt.step()
    with pytest.raises(ValueError, match="lr"):
        SGD(Model(), lr=-1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD(Model(), lr=0.1, momentum=0, nesterov=True)
    with pytest.raises(ValueError, match="expected buffers"):
        opt.load_state({"other": numpy.zeros(2)})
    with pytest.raises(ValueError, match="shape"):
        opt.load_state({"m.w": numpy.zeros(3)})
    with pytest.raises(ValueError, match="unique"):
        SGD([("a", layer, "w"), ("a", layer, "w")], lr=0.1)
