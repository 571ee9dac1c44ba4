"""Pooling on a process grid (docs/algorithms.md section 5).

=================  ===============================================  ==============================
layer              forward                                          backward
=================  ===============================================  ==============================
``MaxPool2d``      halo exchange (fill ``-inf``), local pooling      local, then halo return
``AvgPool2d``      halo exchange (fill 0), local pooling             local, then halo return
``GlobalAvgPool``  allreduce of the local spatial sums over the      local (each spatial peer holds
                   spatial peers                                    the whole gradient of the mean)
=================  ===============================================  ==============================
"""

import numpy

from refconv import collectives
from refconv.halo import Halo
from refconv.layers.base import Layer
from refconv.reference.layers import pool_geometry


class _Pool2d(Layer):
    """Pooling under a spatial split: halo-extend the block to the window its outputs
    read, then pool the window with ``padding=0`` (as convolution does)."""

    fill = 0.0

    def __init__(self, kernel_size, stride=None, padding=0, *, grid, backend="auto", dtype=numpy.float32):
        super().__init__(grid=grid, backend=backend, dtype=dtype)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        pool_geometry((1, 1, 10**6, 10**6), kernel_size, stride, padding)  # validates the arguments now
        self._halos = {}

    def _bind(self, shape):
        kernel, stride, padding, out = pool_geometry(shape, self.kernel_size, self.stride, self.padding)
        self._geometry = kernel, stride
        if shape[2:] not in self._halos:
            g = self.grid
            self._halos[shape[2:]] = Halo(g.sub_comm(("height", "width")), (g.P_H, g.P_W), shape[2:], out,
                                          kernel, stride, padding, (1, 1))
        self._halo = self._halos[shape[2:]]
        return shape[:2] + out

    def forward(self, x_loc):
        # x_loc: (n, c, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        x_win = self._halo.extend(x_loc, self.xp, fill=self.fill)  # (n, c, h_win, w_win)
        self._win_shape = x_win.shape
        return self._pool(x_win)  # (n, c, h', w')

    def backward(self, dy_loc):
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        return self._halo.reduce(self._unpool(dy_loc), self.xp)  # (n, c, h, w)

    def __repr__(self):
        return (f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, grid={self.grid.shape})")


class MaxPool2d(_Pool2d):
    """Max pooling; the window outside the image is ``-inf``, as in the serial padding."""

    fill = -numpy.inf

    def _pool(self, x_win):
        kernel, stride = self._geometry
        y, self._argmax = self.backend.max_pool2d_forward(x_win, kernel, stride, 0)
        return y

    def _unpool(self, dy):
        kernel, stride = self._geometry
        return self.backend.max_pool2d_backward(dy, self._argmax, self._win_shape, kernel, stride, 0)


class AvgPool2d(_Pool2d):
    """Average pooling with the padding counted in the divisor (``count_include_pad=True``)."""

    def _pool(self, x_win):
        kernel, stride = self._geometry
        return self.backend.avg_pool2d_forward(x_win, kernel, stride, 0)

    def _unpool(self, dy):
        kernel, stride = self._geometry
        return self.backend.avg_pool2d_backward(dy, self._win_shape, kernel, stride, 0)


class GlobalAvgPool(Layer):
    """``(N, C, H, W)`` -> features ``(N, C, 1, 1)``, the mean of each feature map.

    forward: allreduce of the local spatial sums over the spatial peers ·
    backward: local (every spatial peer already holds the whole ``dy``)
    """

    kind_out = "features"

    def _bind(self, shape):
        return shape[:2] + (1, 1)

    def forward(self, x_loc):
        # x_loc: (n, C_i, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x_shape = x_loc.shape
        partial = x_loc.sum(axis=(2, 3), keepdims=True)  # (n, C_i, 1, 1), this rank's rows and columns
        H, W = self._input_shape[2:]
        total = collectives.allreduce(self.grid.sub_comm(("height", "width")), partial)
        return total / (H * W)  # (n, C_i, 1, 1), replicated over the spatial peers

    def backward(self, dy_loc):
        # The mean is replicated over the spatial peers and each copy receives the same
        # dy, so the adjoint of the allreduce is the identity here: spread dy locally.
        H, W = self._input_shape[2:]
        return self.xp.broadcast_to(dy_loc / (H * W), self._x_shape).copy()  # (n, C_i, h, w)
