"""Pooling on a process grid (docs/algorithms.md section 5).

=================  ===============================================  ==============================
layer              forward                                          backward
=================  ===============================================  ==============================
``MaxPool2d``      halo exchange (fill ``-inf``), local pooling      local, then halo return
``AvgPool2d``      halo exchange (fill 0), local pooling             local, then halo return
``GlobalAvgPool``  allreduce of the local spatial sums over the      local (each spatial peer holds
                   spatial peers                                    the whole gradient of the mean)
=================  ===============================================  ==============================

``MaxPool3d``, ``AvgPool3d`` and ``GlobalAvgPool3d`` are the same layers on volumes
``(N, C, D, H, W)`` split over depth, height and width too (``ProcessGrid(..., depth=P_D)``):
the halo is the N-dim one of :class:`refconv.halo.Halo` (faces, edges and corners), the
spatial peers are ``P_D P_H P_W``.  A volume's features are ``(N, C, 1, 1)``, as an image's.
"""

import math

import numpy

from refconv import collectives
from refconv.grid import SPATIAL, axes_of
from refconv.halo import Halo
from refconv.layers.base import Layer
from refconv.pricing.records import POOL_GEOMETRY as GEOMETRY, gap_records, pool_records

def spatial_view(grid, dims):
    """``(grid_shape, coords, spatial axes)`` of ``grid`` as a layer of ``dims`` spatial dims sees
    it: the 4-D grid for images, ``(P_N, P_c, P_D, P_H, P_W)`` for volumes (``P_D = 1`` where
    depth is not split)."""
    if dims == 3:
        return grid.volume_shape, grid.volume_coords, axes_of(5)[SPATIAL:]
    return grid.shape, grid.coords, ("height", "width")


class _Pool2d(Layer):
    """Pooling under a spatial split: halo-extend the block to the window its outputs
    read, then pool the window with ``padding=0`` (as convolution does).  ``dims = 3``
    in the volume layers: the same steps over ``(d, h, w)``."""

    fill = 0.0
    dims = 2  # spatial dims: (h, w); (d, h, w) in MaxPool3d and AvgPool3d

    def __init__(self, kernel_size, stride=None, padding=0, *, grid, backend="auto", dtype=numpy.float32):
        super().__init__(grid=grid, backend=backend, dtype=dtype)
        if self.dims == 2 and grid.P_D > 1:
            raise ValueError(f"grid: {type(self).__name__} pools images, which have no depth to split over "
                             f"depth={grid.P_D}; use {type(self).__name__.replace('2d', '3d')} for volumes")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        GEOMETRY[self.dims]((1, 1) + (10**6,) * self.dims, kernel_size, stride, padding)  # validates them now
        self._halos = {}

    def _bind(self, shape):
        kernel, stride, padding, out = GEOMETRY[self.dims](shape, self.kernel_size, self.stride, self.padding)
        self._geometry = kernel, stride
        if shape[2:] not in self._halos:
            grid_shape, _, axes = spatial_view(self.grid, self.dims)
            self._halos[shape[2:]] = Halo(self.grid.sub_comm(axes), grid_shape[SPATIAL:], shape[2:], out,
                                          kernel, stride, padding, (1,) * self.dims)
        self._halo = self._halos[shape[2:]]
        return shape[:2] + out

    def forward(self, x_loc):
        # x_loc: (n, c, h, w), or (n, c, d, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        x_win = self._halo.extend(x_loc, self.xp, fill=self.fill)  # (n, c, h_win, w_win), (n, c, d_win, ...)
        self._win_shape = x_win.shape
        return self._pool(x_win)  # (n, c, h', w'), or (n, c, d', h', w')

    def backward(self, dy_loc):
        self._check_local(dy_loc, self.output_distribution, "dy_loc")
        return self._halo.reduce(self._unpool(dy_loc), self.xp)  # (n, c, h, w), or (n, c, d, h, w)

    def _kernel(self, name):
        """The backend's pooling of this layer's dims: ``max_pool2d_forward``, ``max_pool3d_forward``..."""
        return getattr(self.backend, name.format(self.dims))

    def records(self):
        """The calls one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        grid_shape, coords, _ = spatial_view(self.grid, self.dims)
        return pool_records(self._input_shape, self.kernel_size, self.stride, self.padding, grid_shape, coords,
                            self.dtype.itemsize)

    def __repr__(self):
        return (f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, grid={self.grid.shape})")


class MaxPool2d(_Pool2d):
    """Max pooling; the window outside the image is ``-inf``, as in the serial padding."""

    fill = -numpy.inf

    def _pool(self, x_win):
        kernel, stride = self._geometry
        y, self._argmax = self._kernel("max_pool{}d_forward")(x_win, kernel, stride, 0)
        return y

    def _unpool(self, dy):
        kernel, stride = self._geometry
        return self._kernel("max_pool{}d_backward")(dy, self._argmax, self._win_shape, kernel, stride, 0)


class AvgPool2d(_Pool2d):
    """Average pooling with the padding counted in the divisor (``count_include_pad=True``)."""

    def _pool(self, x_win):
        kernel, stride = self._geometry
        return self._kernel("avg_pool{}d_forward")(x_win, kernel, stride, 0)

    def _unpool(self, dy):
        kernel, stride = self._geometry
        return self._kernel("avg_pool{}d_backward")(dy, self._win_shape, kernel, stride, 0)


class GlobalAvgPool(Layer):
    """``(N, C, H, W)`` -> features ``(N, C, 1, 1)``, the mean of each feature map.

    forward: allreduce of the local spatial sums over the spatial peers ·
    backward: local (every spatial peer already holds the whole ``dy``)
    """

    kind_out = "features"
    dims = 2  # spatial dims: (h, w); (d, h, w) in GlobalAvgPool3d

    def _bind(self, shape):
        return shape[:2] + (1, 1)

    def forward(self, x_loc):
        # x_loc: (n, C_i, h, w), or (n, C_i, d, h, w)
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x_shape = x_loc.shape
        spatial = tuple(range(2, x_loc.ndim))
        partial = x_loc.sum(axis=spatial).reshape(x_loc.shape[:2] + (1, 1))  # (n, C_i, 1, 1), this rank's cells
        total = collectives.allreduce(self.grid.sub_comm(spatial_view(self.grid, self.dims)[2]), partial)
        return total / math.prod(self._input_shape[2:])  # (n, C_i, 1, 1), replicated over the spatial peers

    def backward(self, dy_loc):
        # The mean is replicated over the spatial peers and each copy receives the same
        # dy, so the adjoint of the allreduce is the identity here: spread dy locally.
        dy_loc = dy_loc.reshape(dy_loc.shape[:2] + (1,) * self.dims)  # (n, C_i, 1, 1) or (n, C_i, 1, 1, 1)
        return self.xp.broadcast_to(dy_loc / math.prod(self._input_shape[2:]), self._x_shape).copy()

    def records(self):
        """The call one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        grid_shape, coords, _ = spatial_view(self.grid, self.dims)
        return gap_records(self._input_shape, grid_shape, coords, self.dtype.itemsize)


class MaxPool3d(MaxPool2d):
    """Max pooling of volumes ``(N, C, D, H, W)``; ``kernel_size``, ``stride`` and ``padding`` an
    int or a ``(d, h, w)`` triple (:func:`refconv.reference.max_pool3d_forward`)."""

    dims, ndim = 3, 5


class AvgPool3d(AvgPool2d):
    """Average pooling of volumes ``(N, C, D, H, W)``, padding counted in the divisor."""

    dims, ndim = 3, 5


class GlobalAvgPool3d(GlobalAvgPool):
    """``(N, C, D, H, W)`` -> features ``(N, C, 1, 1)``, the mean of each volume; the spatial
    peers are the ``P_D P_H P_W`` ranks that share this rank's samples and channels."""

    dims, ndim = 3, 5
