"""``ShapesBackend``: the backend interface on shapes-only arrays (output shapes from the reference's own
geometry helpers, the same checks of ndim and dtype, no arithmetic)."""

from refconv import checks
from refconv.backend import NumpyBackend
from refconv.reference.layers import pool_geometry
from refconv.reference.layers3d import pool3d_geometry
from refconv.shapes.array import ShapeArray
from refconv.shapes.errors import Mixed
from refconv.shapes.namespace import xp


def _conv_out(x, w, b, stride, padding, dilation, groups, dims):
    checks.forward_arrays(x, w, b, dims=dims)
    out = checks.conv_geometry(x.shape, w.shape, stride, padding, dilation, groups, dims=dims)[-1]
    return ShapeArray((x.shape[0], w.shape[0]) + out, x.dtype)


def _conv_backward(dims):
    def backward_data(self, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1):
        checks.array(dy, "dy", dims + 2)
        checks.array(w, "w", dims + 2)
        checks.same_dtype(dy=dy, w=w)
        return ShapeArray(tuple(x_shape), dy.dtype)

    def backward_filter(self, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        checks.array(x, "x", dims + 2)
        checks.array(dy, "dy", dims + 2)
        checks.same_dtype(x=x, dy=dy)
        return ShapeArray(tuple(w_shape), x.dtype)
    return backward_data, backward_filter


def _pool(geometry, dims):
    def max_forward(self, x, kernel_size, stride=None, padding=0):
        checks.array(x, "x", dims + 2)
        out = geometry(x.shape, kernel_size, stride, padding)[-1]
        return ShapeArray(x.shape[:2] + out, x.dtype), ShapeArray(x.shape[:2] + out, "int64")

    def max_backward(self, dy, argmax, x_shape, kernel_size, stride=None, padding=0):
        checks.array(dy, "dy", dims + 2)
        return ShapeArray(tuple(x_shape), dy.dtype)

    def avg_forward(self, x, kernel_size, stride=None, padding=0):
        checks.array(x, "x", dims + 2)
        return ShapeArray(x.shape[:2] + geometry(x.shape, kernel_size, stride, padding)[-1], x.dtype)

    def avg_backward(self, dy, x_shape, kernel_size, stride=None, padding=0):
        checks.array(dy, "dy", dims + 2)
        return ShapeArray(tuple(x_shape), dy.dtype)
    return max_forward, max_backward, avg_forward, avg_backward


def _like(x, *others):
    for o in others:
        if not isinstance(o, ShapeArray):
            raise Mixed("ShapesBackend", x, o)
    return ShapeArray(x.shape, x.dtype)


def _channels(x):
    return ShapeArray((x.shape[1],), x.dtype)


class ShapesBackend(NumpyBackend):
    """Every operation of the backend interface on :class:`~refconv.shapes.array.ShapeArray`: shapes,
    dtypes and the checks of the NumPy backend, no values (``values = False``)."""

    name = "shapes"
    values = False
    xp = xp

    def asarray(self, x, dtype=None):
        return xp.asarray(x, dtype=dtype)

    def to_host(self, x):
        return x

    def zeros(self, shape, dtype):
        return ShapeArray(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), dtype)

    def scalar(self, x):
        return None

    def conv2d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1, cols=None):
        return _conv_out(x, w, b, stride, padding, dilation, groups, 2)

    def conv3d_forward(self, x, w, b=None, *, stride=1, padding=0, dilation=1, groups=1):
        return _conv_out(x, w, b, stride, padding, dilation, groups, 3)

    conv2d_backward_data, conv2d_backward_filter = _conv_backward(2)
    conv3d_backward_data, conv3d_backward_filter = _conv_backward(3)

    def conv2d_columns(self, x, w_shape, *, stride=1, padding=0, dilation=1, groups=1):
        """None: no columns are kept (as the CUDA kernels)."""
        return None

    def conv3d_backward_bias(self, dy):
        checks.array(dy, "dy", 5)
        return _channels(dy)

    def bias_grad(self, dy):
        checks.array(dy, "dy", 4)
        return _channels(dy)

    def bias_add(self, y, b):
        y.written()
        return y

    def relu_forward(self, x):
        return _like(x)

    def relu_backward(self, dy, x):
        return _like(dy, x)

    max_pool2d_forward, max_pool2d_backward, avg_pool2d_forward, avg_pool2d_backward = _pool(pool_geometry, 2)
    max_pool3d_forward, max_pool3d_backward, avg_pool3d_forward, avg_pool3d_backward = _pool(pool3d_geometry, 3)

    def batch_norm_sum(self, x):
        return _channels(x)

    def batch_norm_centered_sum_squares(self, x, mean):
        return _channels(x)

    def batch_norm_apply(self, x, mean, invstd, gamma, beta):
        return _like(x, mean, invstd, gamma, beta)

    def batch_norm_grad_sums(self, dy, x, mean, invstd):
        _like(x, dy, mean, invstd)
        return _channels(x), _channels(x)

    def batch_norm_backward_apply(self, dy, x, mean, invstd, gamma, dbeta, dgamma, count):
        return _like(dy, x, mean, invstd, gamma, dbeta, dgamma)
