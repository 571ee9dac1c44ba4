"""Hand-written Numba CUDA kernels, installed as ``refconv.kernels``.

Device arrays in, device arrays out: CuPy arrays on a real GPU, NumPy arrays
under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` before numba is first
imported).  Every function checks its arguments as ``refconv.reference`` does
and raises the same ``ValueError``.  The convolutions come in three versions,
``version=1`` (direct, for reading), ``version=2`` (tiled implicit GEMM, the
first step to speed) and ``version=3`` (register-tiled and double-buffered, for
speed; the default; float32, float64 runs version 2); see docs/kernels.md.

    conv_forward.py           conv2d_forward, conv3d_forward (one kernel per version: an image is a volume of depth 1)
    conv_backward_data.py     conv2d_backward_data, conv3d_backward_data
    conv_backward_filter.py   conv2d_backward_filter, conv3d_backward_filter
    elementwise.py            bias_add, bias_grad, relu_forward, relu_backward
    batch_norm.py             batch_norm_sums, batch_norm_apply, batch_norm_grad_sums, batch_norm_backward_apply
    pooling.py                max_pool2d_forward/backward, avg_pool2d_forward/backward, and the 3d ones
    _launch.py                tile constants, launch geometry, shared index device functions, version 3's main loop
"""

from .batch_norm import batch_norm_apply, batch_norm_backward_apply, batch_norm_grad_sums, batch_norm_sums
from .conv_backward_data import conv2d_backward_data, conv3d_backward_data
from .conv_backward_filter import conv2d_backward_filter, conv3d_backward_filter
from .conv_forward import conv2d_forward, conv3d_forward
from .elementwise import bias_add, bias_grad, relu_backward, relu_forward
from .pooling import (
    avg_pool2d_backward, avg_pool2d_forward, avg_pool3d_backward, avg_pool3d_forward,
    max_pool2d_backward, max_pool2d_forward, max_pool3d_backward, max_pool3d_forward,
)

VERSIONS = (1, 2, 3)

__all__ = [
    "VERSIONS",
    "avg_pool2d_backward", "avg_pool2d_forward", "avg_pool3d_backward", "avg_pool3d_forward",
    "batch_norm_apply", "batch_norm_backward_apply", "batch_norm_grad_sums", "batch_norm_sums",
    "bias_add", "bias_grad",
    "conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward",
    "conv3d_backward_data", "conv3d_backward_filter", "conv3d_forward",
    "max_pool2d_backward", "max_pool2d_forward", "max_pool3d_backward", "max_pool3d_forward",
    "relu_backward", "relu_forward",
]
