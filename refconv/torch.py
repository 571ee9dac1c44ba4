"""PyTorch interop: a channel-parallel convolution as a ``torch.nn.Module``.

:class:`Conv2d` takes ``torch.nn.Conv2d``'s arguments plus a refconv grid and
algorithm, and runs a :class:`refconv.DistConv2d` inside a
``torch.autograd.Function``: torch's autograd calls the layer's backward, which
leaves ``weight.grad`` and ``bias.grad`` (this rank's shards, already summed over
the weight peers by the segmented allreduce), so torch's optimizers train it like
any other module.  Every rank runs the same torch program on its own blocks:

=================  ===============================================================
module             this rank's tensor
=================  ===============================================================
input              its block of ``x``: ``layer.input_distribution`` (e.g. ``x[:, C_i]``)
output             its block of ``y``: ``layer.output_distribution`` (``y[:, F_i]``)
``weight``         its shard of ``w``: ``layer.weight_distribution`` (per algorithm)
``bias``           its block ``b[F_i]``
=================  ===============================================================

``refconv.scatter`` and ``refconv.gather`` accept torch tensors, so the ends of a
model move between global and local tensors in one call each (see docs/torch.md).

Tensors cross to refconv through DLPack without a copy: CPU tensors become NumPy
arrays (backend ``"numpy"``), CUDA tensors CuPy arrays (backend ``"cuda"``); the
results come back the same way.  Like every refconv layer, one forward is followed
by its backward before the next forward (a backward after a later forward raises
ValueError), and there is no second derivative.

This module imports torch; ``import refconv`` never does.
"""

import numpy
import torch
from torch.autograd.function import once_differentiable

from refconv import checks
from refconv.arrays import as_array
from refconv.layers import DistConv2d

__all__ = ["Conv2d"]


def _array(tensor):
    """A torch tensor as a NumPy or CuPy array sharing its memory."""
    return as_array(tensor.detach().contiguous(), "tensor")


def _tensor(array):
    """A NumPy or CuPy array as a torch tensor sharing its memory (None stays None)."""
    return None if array is None else torch.from_dlpack(array)


def _host(value):
    """A tensor or array (or None) as a NumPy array, for parameters given globally."""
    if torch.is_tensor(value):
        return value.detach().cpu().numpy()
    return None if value is None else numpy.asarray(value)


class _DistConv2dFunction(torch.autograd.Function):
    """forward: ``layer.forward`` of this rank's block · backward: ``layer.backward``, which also
    finishes the weight and bias gradients (all of the layer's communication is its algorithm's)."""

    @staticmethod
    def forward(ctx, x_loc, weight, bias, module):
        # x_loc: (n, C_i, h, w) for example; weight, bias: this rank's shards (torch Parameters)
        layer = module.layer
        layer.weight = _array(weight)  # the layer reads the parameters torch's optimizer updates
        layer.bias = None if bias is None else _array(bias)
        module.forwards += 1
        ctx.module, ctx.forward = module, module.forwards
        return _tensor(layer.forward(_array(x_loc)))  # (n, F_i, h', w')

    @staticmethod
    @once_differentiable  # a second derivative through refconv is refused by torch, with its message
    def backward(ctx, dy_loc):
        module, layer = ctx.module, ctx.module.layer
        if ctx.forward != module.forwards:  # the layer now holds a later forward's input
            raise ValueError("refconv.torch.Conv2d: this module ran forward again before this backward; a refconv "
                             "layer keeps one forward's state, so use one module per call in a graph")
        dx_loc = layer.backward(_array(dy_loc))  # also layer.weight_grad, layer.bias_grad
        return _tensor(dx_loc), _tensor(layer.weight_grad), _tensor(layer.bias_grad), None


class Conv2d(torch.nn.Module):
    """``torch.nn.Conv2d`` split over a refconv grid: ``in_channels``, ``out_channels``,
    ``kernel_size``, ``stride``, ``padding`` (ints, pairs, ``'same'``, ``'valid'``),
    ``dilation``, ``groups``, ``bias`` and ``padding_mode`` as torch takes them; ``grid``,
    ``algorithm``, ``filter_groups``, ``input_shape``, ``seed`` and ``machine`` (what
    ``"auto"`` prices with) as :class:`refconv.DistConv2d` takes them.  ``dtype`` is ``torch.float32`` or
    ``torch.float64``; ``device`` ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy).

    ``forward(x_loc)`` takes and returns this rank's blocks (the table in the module
    docstring); ``weight`` and ``bias`` are this rank's shards.  The parameters start
    as torch.nn.Conv2d's (uniform in ``+-1/sqrt(fan_in)``), drawn from ``seed``;
    :meth:`set_global_parameters` loads others, e.g. a torch.nn.Conv2d's.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", *, grid, algorithm="stationary-x", filter_groups=None,
                 dtype=torch.float32, device="cpu", input_shape=None, seed=0, machine=None):
        super().__init__()
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
        device = checks.one_of(str(device), "device", ("cpu", "cuda"))
        self.layer = DistConv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode, grid=grid,
                                algorithm=algorithm, filter_groups=filter_groups,
                                backend="numpy" if device == "cpu" else "cuda",
                                dtype=numpy.float32 if dtype == torch.float32 else numpy.float64,
                                input_shape=input_shape, seed=seed, machine=machine)
        if self.layer.algorithm is None:  # "auto": the layout is chosen when bound
            raise ValueError("algorithm: 'auto' needs input_shape=(N, C, H, W), so that the weight's layout "
                             "is known when the parameters are made")
        self.forwards = 0  # forwards run: a backward must belong to the latest
        self.weight = torch.nn.Parameter(_tensor(self.layer.weight).clone())
        self.bias = torch.nn.Parameter(_tensor(self.layer.bias).clone()) if bias else None

    def forward(self, x_loc):
        return _DistConv2dFunction.apply(x_loc, self.weight, self.bias, self)

    @torch.no_grad()
    def set_global_parameters(self, weight, bias=None):
        """Give this rank its shards of the global ``weight (F, C/groups, Kh, Kw)`` and ``bias (F,)``
        (tensors or arrays, the same on every rank), e.g. ``conv.weight, conv.bias`` of a
        torch.nn.Conv2d."""
        self.layer.set_global_parameters(_host(weight), _host(bias))
        self.weight.copy_(_tensor(self.layer.weight))
        if self.bias is not None:
            self.bias.copy_(_tensor(self.layer.bias))

    def global_parameter_grads(self):
        """``(dw, db)``: the whole gradients as torch tensors, gathered on every rank (a collective)."""
        dw, db = self.layer.global_parameter_grads()
        return _tensor(dw), _tensor(db)

    def extra_repr(self):
        return repr(self.layer)
