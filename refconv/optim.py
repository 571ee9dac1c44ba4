"""SGD with momentum on local parameter shards (PyTorch semantics, no dampening).

Each rank updates only the shards it holds; the gradients are already the full
sums (the layers' segmented allreduce), so no communication happens here::

    d_p = grad + weight_decay * p
    buf = momentum * buf + d_p              (first step: buf = d_p)
    d_p = d_p + momentum * buf  if nesterov else buf
    p  -= lr * d_p                          (in place)

The momentum buffer of a parameter has the parameter's local shape and is
sharded by the parameter's distribution, so a checkpoint saves and reshards it
exactly like the parameter.  Buffers start at zero, which makes the first step
``buf = d_p`` as in PyTorch.
"""

import numbers

from refconv.arrays import array_module
from refconv.shapes import memory

__all__ = ["SGD", "named_parameters"]


def named_parameters(params):
    """``[(qualified_name, layer, param_name), ...]`` of a model or of such a list."""
    entries = list(params.named_parameters() if hasattr(params, "named_parameters") else params)
    names = [q for q, _, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"params: qualified names must be unique, got {names}")
    return entries


class SGD:
    """``SGD(params, lr, momentum=0.9, weight_decay=0.0, nesterov=False)``.

    ``params``: a model (anything with ``named_parameters()``) or a list of
    ``(qualified_name, layer, param_name)``.  ``lr`` may be changed between steps.
    """

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, nesterov=False):
        for name, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0:
                raise ValueError(f"{name}: expected a number >= 0, got {v!r}")
        if nesterov and momentum == 0:
            raise ValueError("nesterov: needs momentum > 0")
        self.entries = named_parameters(params)
        self.lr, self.momentum = float(lr), float(momentum)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)
        self._buffers = {}
        if self.momentum:
            for qname, layer, pname in self.entries:
                p = layer.parameters()[pname]
                self._buffers[qname] = array_module(p).zeros_like(p)   # buf: p's local shape
                memory.claim(self._buffers[qname], "optimizer", layer)  # counted with the parameters

    def step(self):
        """Update every parameter shard in place from its layer's current gradient."""
        for qname, layer, pname in self.entries:
            p = layer.parameters()[pname]
            grad = layer.gradients()[pname]
            if grad is None:
                raise ValueError(f"SGD.step: {qname} has no gradient; run backward first")
            if grad.shape != p.shape:
                raise ValueError(f"SGD.step: {qname}: gradient shape {grad.shape} != "
                                 f"parameter shape {p.shape}")
            d_p = grad + self.weight_decay * p if self.weight_decay else grad
            if self.momentum:
                buf = self._buffers[qname]
                buf *= self.momentum
                buf += d_p
                d_p = d_p + self.momentum * buf if self.nesterov else buf
            p -= self.lr * d_p

    def state(self):
        """``{qualified_name: momentum buffer}`` (the live local shards; empty without momentum)."""
        return dict(self._buffers)

    def load_state(self, state):
        """Copy ``{qualified_name: buffer}`` into the buffers (same names and local shapes)."""
        if set(state) != set(self._buffers):
            raise ValueError(f"load_state: expected buffers {sorted(self._buffers)}, "
                             f"got {sorted(state)}")
        for qname, value in state.items():
            buf = self._buffers[qname]
            if tuple(value.shape) != tuple(buf.shape):
                raise ValueError(f"load_state: {qname}: shape {tuple(value.shape)} != "
                                 f"this rank's shard {tuple(buf.shape)}")
        for qname, value in state.items():
            buf = self._buffers[qname]
            buf[...] = array_module(buf).asarray(value, dtype=buf.dtype)
