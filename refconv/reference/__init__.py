"""The serial NumPy reference: every layer of a CNN, forward and backward.

Everything distributed in refconv is checked against these functions, and the
vectorised convolution is also the CPU compute path.  NCHW layout (NCDHW for
the 3-D layers), float32 and float64, PyTorch semantics.  See docs/reference.md.
"""

from refconv.reference.conv import (
    col2im,
    conv2d_backward_bias,
    conv2d_backward_data,
    conv2d_backward_filter,
    conv2d_forward,
    im2col,
)
from refconv.reference.conv3d import (
    col2vol,
    conv3d_backward_bias,
    conv3d_backward_data,
    conv3d_backward_filter,
    conv3d_forward,
    vol2col,
)
from refconv.reference.layers import (
    avg_pool2d_backward,
    avg_pool2d_forward,
    batch_norm_backward,
    batch_norm_forward,
    global_avg_pool_backward,
    global_avg_pool_forward,
    linear_backward,
    linear_forward,
    max_pool2d_backward,
    max_pool2d_forward,
    mse_backward,
    mse_forward,
    pool_geometry,
    relu_backward,
    relu_forward,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
    update_running_stats,
)
from refconv.reference.layers3d import (
    avg_pool3d_backward,
    avg_pool3d_forward,
    batch_norm3d_backward,
    batch_norm3d_forward,
    global_avg_pool3d_backward,
    global_avg_pool3d_forward,
    max_pool3d_backward,
    max_pool3d_forward,
    pool3d_geometry,
)
from refconv.checks import conv_geometry
from refconv.reference import conv_loops as loops
from refconv.reference import conv3d_loops as loops3d

__all__ = [name for name in dir() if not name.startswith("_")]
