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
from refconv.algorithms.base import Call, ConvGeometry, halo_records
from refconv.distribution import block_size
from refconv.halo import Halo
from refconv.layers.base import Layer
from refconv.reference.layers import pool_geometry


def pool_records(shape, kernel_size, stride, padding, grid_shape, coords, itemsize):
    """The calls of one forward and backward of a max or average pooling at ``coords``: the
    halo exchange of its window (forward) and its return (backward), on this rank's channels."""
    kernel, stride, padding, out = pool_geometry(shape, kernel_size, stride, padding)
    C_i = block_size(shape[1], grid_shape[1], coords[1])
    geom = ConvGeometry(tuple(shape), (C_i, C_i) + kernel, tuple(shape[:2]) + out, stride, padding, bias=False,
                        itemsize=itemsize)
    exchange, back = halo_records(geom, grid_shape, coords, C_i)
    return exchange + back


def gap_records(shape, grid_shape, coords, itemsize):
    """The call of one forward and backward of global average pooling at ``coords``: forward,
    the allreduce of the local sums ``(n, C_i)`` over the spatial peers; backward, none."""
    P_N, P_c, P_H, P_W = grid_shape
    n, C_i = block_size(shape[0], P_N, coords[0]), block_size(shape[1], P_c, coords[1])
    return [Call("allreduce", P_H * P_W, n * C_i * itemsize, axes=("height", "width"))]


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

    def records(self):
        """The calls one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        return pool_records(self._input_shape, self.kernel_size, self.stride, self.padding, self.grid.shape,
                            self.grid.coords, self.dtype.itemsize)

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

    def records(self):
        """The call one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        return gap_records(self._input_shape, self.grid.shape, self.grid.coords, self.dtype.itemsize)
