"""Compute backends: where a layer's local arithmetic runs.

One small interface, two implementations:

- ``numpy``: the reference's vectorised path (:mod:`refconv.reference`), on the CPU.
- ``cuda``: the hand-written Numba CUDA kernels (:mod:`refconv.kernels`) on device
  arrays.  On a real GPU those are CuPy arrays; under Numba's CUDA simulator
  (``NUMBA_ENABLE_CUDASIM=1``) they are NumPy arrays.

``get_backend("auto")`` picks ``cuda`` only when a real GPU is present
(``cupy.cuda.is_available()``), never because ``import cupy`` succeeded.

Convolution (2-D and, with the ``conv3d_*`` methods, 3-D), bias, ReLU, batch
normalization and pooling compute through these methods.  The light layers (global average pooling, the classifier head and the
loss) compute with the backend's array module (``backend.xp``) directly: a sum,
a small matmul and a softmax need no kernel of their own.  All of them move data
only through :mod:`refconv.collectives`.
"""

import functools
import os

import numpy

from refconv import arrays, checks
from refconv import reference as ref
from refconv.reference import conv as ref_conv

RUN_BACKENDS = ("auto", "numpy", "cuda")   # what a run under MPI computes on (refconv train --backend, ...)
BACKENDS = RUN_BACKENDS + ("shapes",)      # and shapes-only arrays, on simulated ranks (refconv simulate)


def _per_channel(v, x):
    """A per-channel vector ``(C,)`` shaped to broadcast over ``x (N, C, ...)``, in x's dtype."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False)


def _flat(x):
    """``(N, C, ...)`` -> ``(N, C, S)``, the spatial cells in one axis (a view of a contiguous x)."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def _as_4d(x):
    """A volume ``(N, C, D, H, W)`` viewed as ``(N, C, D*H, W)`` (an image ``(N, C, H, W)`` as it is):
    per-channel statistics do not see the difference, so the 2-D batch-norm kernels serve both."""
    return x if x.ndim == 4 else x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1])


class NumpyBackend:
    """The CPU path: the reference's vectorised operations."""

    name = "numpy"
    xp = numpy
    values = True       # arrays with values (False: refconv.shapes's shapes-only arrays)

    # -- data movement between host and this backend's arrays
    def asarray(self, x, dtype=None):
        return numpy.asarray(arrays.to_host(x), dtype=dtype)

    def to_host(self, x):
        return arrays.to_host(x)

    def zeros(self, shape, dtype):
        return numpy.zeros(shape, dtype=dtype)

    def scalar(self, x):
        """The first value of ``x`` as a Python float (None on shapes-only arrays: they have none)."""
        return float(self.to_host(x).reshape(-1)[0])

    # -- convolution
    def conv2d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        return ref.conv2d_forward(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups, cols=cols)

    def conv2d_backward_data(self, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return ref.conv2d_backward_data(dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def conv2d_backward_filter(self, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        return ref.conv2d_backward_filter(x, dy, w_shape, stride=stride, padding=padding, dilation=dilation,
                                          groups=groups, cols=cols)

    def conv2d_columns(self, x, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
        """The im2col columns forward and backward-filter share (``cols=`` of both): computed once,
        they save one im2col per layer and step but are held from forward to backward,
        ``Kh*Kw`` times the input's size (see :mod:`refconv.reference.conv`)."""
        return ref_conv.conv2d_columns(x, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)

    # -- 3-D convolution (NCDHW); the bias is added by conv3d_forward itself
    def conv3d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1):
        return ref.conv3d_forward(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def conv3d_backward_data(self, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return ref.conv3d_backward_data(dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def conv3d_backward_filter(self, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return ref.conv3d_backward_filter(x, dy, w_shape, stride=stride, padding=padding, dilation=dilation,
                                          groups=groups)

    def conv3d_backward_bias(self, dy):
        return ref.conv3d_backward_bias(dy)

    def bias_add(self, y, b):
        """``y + b`` broadcast over ``(N, F, H, W)``, in place."""
        y += b.reshape(1, -1, 1, 1)
        return y

    def bias_grad(self, dy):
        return ref.conv2d_backward_bias(dy)

    # -- elementwise and pooling
    def relu_forward(self, x):
        return ref.relu_forward(x)

    def relu_backward(self, dy, x):
        return ref.relu_backward(dy, x)

    # Pooling is the reference's own functions, with their arguments, in 2-D and 3-D.
    max_pool2d_forward, max_pool2d_backward = staticmethod(ref.max_pool2d_forward), staticmethod(ref.max_pool2d_backward)
    avg_pool2d_forward, avg_pool2d_backward = staticmethod(ref.avg_pool2d_forward), staticmethod(ref.avg_pool2d_backward)
    max_pool3d_forward, max_pool3d_backward = staticmethod(ref.max_pool3d_forward), staticmethod(ref.max_pool3d_backward)
    avg_pool3d_forward, avg_pool3d_backward = staticmethod(ref.avg_pool3d_forward), staticmethod(ref.avg_pool3d_backward)

    # -- batch normalization, split so that the sums can be allreduced in between
    # Per-channel sums over every axis but the channels' ((N, H, W), or (N, D, H, W) for a
    # volume) are einsum contractions: no temporary for a product or square, one pass.
    def batch_norm_sum(self, x):
        """Per-channel ``sum x`` over every non-channel axis: ``(C,)`` (the mean's partial sum)."""
        return numpy.einsum("ncs->c", _flat(x))

    def batch_norm_centered_sum_squares(self, x, mean):
        """Per-channel ``sum (x - mean)^2`` over every non-channel axis: ``(C,)`` (the variance's partial sum)."""
        centered = x - _per_channel(mean, x)  # (N, C, H, W) or (N, C, D, H, W)
        return numpy.einsum("ncs,ncs->c", _flat(centered), _flat(centered))

    def batch_norm_apply(self, x, mean, invstd, gamma, beta):
        """``y = (x - mean) * invstd * gamma + beta`` per channel."""
        y = x - _per_channel(mean, x)  # the one new array; the rest is in place
        y *= _per_channel(invstd * gamma, x)
        y += _per_channel(beta, x)
        return y

    def batch_norm_grad_sums(self, dy, x, mean, invstd):
        """Per-channel ``(sum dy, sum dy * xhat)``: the partial ``dbeta`` and ``dgamma``."""
        centered = x - _per_channel(mean, x)
        return numpy.einsum("ncs->c", _flat(dy)), numpy.einsum("ncs,ncs->c", _flat(dy), _flat(centered)) * invstd

    def batch_norm_backward_apply(self, dy, x, mean, invstd, gamma, dbeta, dgamma, count):
        """``dx = gamma * invstd / M * (M dy - dbeta - xhat dgamma)`` with the global sums."""
        xhat_dgamma = x - _per_channel(mean, x)  # then scaled in place to xhat * dgamma
        xhat_dgamma *= _per_channel(invstd * dgamma, x)
        dx = dy * x.dtype.type(count)
        dx -= _per_channel(dbeta, x)
        dx -= xhat_dgamma
        dx *= _per_channel(gamma * invstd / count, x)
        return dx

    def __repr__(self):
        return f"<refconv backend {self.name}>"


class CudaBackend(NumpyBackend):
    """The hand-written Numba CUDA kernels (``refconv.kernels``) on device arrays.

    ``version`` selects the convolution kernels: 1 (direct), 2 (tiled) or 3 (register-tiled, the default;
    in float64 it runs version 2).  No version has run on a GPU yet (docs/benchmarks.md); all three are checked
    against the reference under the simulator and compiled through NVVM and ptxas.
    """

    name = "cuda"

    def __init__(self, version=3):
        from refconv import kernels  # imported lazily: it pulls in numba.cuda

        self.k = kernels
        self.version = version
        self.xp = arrays.device_module()

    def asarray(self, x, dtype=None):
        """On the device; an array already there stays there (no copy through the host)."""
        return self.xp.asarray(arrays.as_array(x), dtype=dtype)

    def zeros(self, shape, dtype):
        return self.xp.zeros(shape, dtype=dtype)

    def conv2d_columns(self, x, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
        """None: the kernels gather their columns on the fly and keep none."""
        return None

    def conv2d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        return self.k.conv2d_forward(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups, version=self.version)

    def conv2d_backward_data(self, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return self.k.conv2d_backward_data(dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups, version=self.version)

    def conv2d_backward_filter(self, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        return self.k.conv2d_backward_filter(x, dy, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups, version=self.version)

    def conv3d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1):
        return self.k.conv3d_forward(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                     version=self.version)

    def conv3d_backward_data(self, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return self.k.conv3d_backward_data(dy, w, x_shape, stride=stride, padding=padding, dilation=dilation,
                                           groups=groups, version=self.version)

    def conv3d_backward_filter(self, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
        return self.k.conv3d_backward_filter(x, dy, w_shape, stride=stride, padding=padding, dilation=dilation,
                                             groups=groups, version=self.version)

    def conv3d_backward_bias(self, dy):
        """The 2-D bias gradient kernel on ``dy (N, F, Do, Ho*Wo)``, a view: it sums all but axis 1."""
        checks.array(dy, "dy", 5)
        N, F, Do, Ho, Wo = dy.shape
        return self.k.bias_grad(dy.reshape(N, F, Do, Ho * Wo))

    def bias_add(self, y, b):
        return self.k.bias_add(y, b)

    def bias_grad(self, dy):
        return self.k.bias_grad(dy)

    def relu_forward(self, x):
        return self.k.relu_forward(x)

    def relu_backward(self, dy, x):
        return self.k.relu_backward(dy, x)

    def max_pool2d_forward(self, x, kernel_size, stride=None, padding=0):
        return self.k.max_pool2d_forward(x, kernel_size, stride, padding)

    def max_pool2d_backward(self, dy, argmax, x_shape, kernel_size, stride=None, padding=0):
        return self.k.max_pool2d_backward(dy, argmax, x_shape, kernel_size, stride, padding)

    def avg_pool2d_forward(self, x, kernel_size, stride=None, padding=0):
        return self.k.avg_pool2d_forward(x, kernel_size, stride, padding)

    def avg_pool2d_backward(self, dy, x_shape, kernel_size, stride=None, padding=0):
        return self.k.avg_pool2d_backward(dy, x_shape, kernel_size, stride, padding)

    def max_pool3d_forward(self, x, kernel_size, stride=None, padding=0):
        return self.k.max_pool3d_forward(x, kernel_size, stride, padding)

    def max_pool3d_backward(self, dy, argmax, x_shape, kernel_size, stride=None, padding=0):
        return self.k.max_pool3d_backward(dy, argmax, x_shape, kernel_size, stride, padding)

    def avg_pool3d_forward(self, x, kernel_size, stride=None, padding=0):
        return self.k.avg_pool3d_forward(x, kernel_size, stride, padding)

    def avg_pool3d_backward(self, dy, x_shape, kernel_size, stride=None, padding=0):
        return self.k.avg_pool3d_backward(dy, x_shape, kernel_size, stride, padding)

    # A volume goes to the 2-D batch-norm kernels as (N, C, D*H, W) (_as_4d): the statistics of
    # a channel run over every other axis, so merging D and H changes no sum's terms.
    def batch_norm_sum(self, x):
        return self.k.batch_norm_sums(_as_4d(x))[0]

    def batch_norm_centered_sum_squares(self, x, mean):
        return self.k.batch_norm_sums(_as_4d(x) - mean.reshape(1, -1, 1, 1))[1]

    def batch_norm_apply(self, x, mean, invstd, gamma, beta):
        return self.k.batch_norm_apply(_as_4d(x), mean, invstd, gamma, beta).reshape(x.shape)

    def batch_norm_grad_sums(self, dy, x, mean, invstd):
        return self.k.batch_norm_grad_sums(_as_4d(dy), _as_4d(x), mean, invstd)

    def batch_norm_backward_apply(self, dy, x, mean, invstd, gamma, dbeta, dgamma, count):
        return self.k.batch_norm_backward_apply(_as_4d(dy), _as_4d(x), mean, invstd, gamma, dbeta, dgamma,
                                                count).reshape(x.shape)


def cuda_usable():
    """True on a real GPU, or under Numba's CUDA simulator."""
    return arrays.gpu_available() or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@functools.lru_cache(maxsize=None)
def get_backend(name="auto", version=3):
    """The backend called ``name``: ``"numpy"``, ``"cuda"``, ``"shapes"`` (no values) or ``"auto"``."""
    if isinstance(name, NumpyBackend):
        return name
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")
    if name == "auto":
        name = "cuda" if arrays.gpu_available() else "numpy"
    if name == "numpy":
        return NumpyBackend()
    if name == "shapes":
        from refconv.shapes.backend import ShapesBackend  # imported lazily: it imports this module
        return ShapesBackend()
    if not cuda_usable():
        raise ValueError(
            "backend: 'cuda' needs a real GPU with CuPy (pip install refconv[cuda12]) or "
            "Numba's CUDA simulator (set NUMBA_ENABLE_CUDASIM=1 before numba is imported)"
        )
    return CudaBackend(version)
