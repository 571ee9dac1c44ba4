"""The calls of one forward and backward of each layer that is not a convolution, for a rank at ``coords``.

Each layer's ``records()`` returns these (refconv.layers), and the planner prices them
(refconv.pricing.perf): one description of the calls, read by both.  They stand here, below
the layers, so that the pricing model imports no layer (tests/architecture/test_architecture.py); the
calls themselves are made in each layer's module.  The convolutions' calls are their
algorithms' (refconv.algorithms).
"""

import math

from refconv.algorithms.base import Call, ConvGeometry, halo_records
from refconv.distribution import block_size
from refconv.grid import SPATIAL, axes_of
from refconv.reference.layers import pool_geometry
from refconv.reference.layers3d import pool3d_geometry

POOL_GEOMETRY = {2: pool_geometry, 3: pool3d_geometry}  # spatial dims -> the serial pooling's geometry


def linear_records(shape, out_features, bias, grid_shape, coords, itemsize):
    """The calls of one forward and backward of the head at ``coords`` for features ``shape``
    ``(N, C, 1, 1)``: forward, the allgather of ``(n, C)`` over the channel group; backward,
    the allreduce of ``dW (K, C)`` and of ``db (K,)`` over the sample axis."""
    n, C, K = block_size(shape[0], grid_shape[0], coords[0]), shape[1], out_features
    return [Call("allgather", grid_shape[1], n * C * itemsize, axes=("channel",)),
            Call("allreduce", grid_shape[0], K * C * itemsize, axes=("sample",), grad=True)] \
        + ([Call("allreduce", grid_shape[0], K * itemsize, axes=("sample",), grad=True)] if bias else [])


def loss_records(grid_shape, itemsize):
    """The call of one loss forward and backward: the allreduce of the local loss sum (one
    element, of the logits' dtype) over the sample axis; backward is local."""
    return [Call("allreduce", grid_shape[0], itemsize, axes=("sample",))]


def batch_norm_records(shape, grid_shape, coords, itemsize):
    """The calls of one training forward and backward at ``coords``, over the weight peers
    (the ranks that share this rank's channels, every axis of ``grid_shape`` but the channel
    axis): forward, allreduce of the channel sums and then of the centred squares; backward,
    allreduce of (sum dy, sum dy xhat)."""
    P_c = grid_shape[1]
    peers = math.prod(grid_shape) // P_c  # P_N P_H P_W, or P_N P_D P_H P_W
    C_i, axes = block_size(shape[1], P_c, coords[1]), tuple(a for a in axes_of(len(grid_shape)) if a != "channel")
    return [Call("allreduce", peers, C_i * itemsize, axes=axes),
            Call("allreduce", peers, C_i * itemsize, axes=axes),
            Call("allreduce", peers, 2 * C_i * itemsize, axes=axes)]


def pool_records(shape, kernel_size, stride, padding, grid_shape, coords, itemsize):
    """The calls of one forward and backward of a max or average pooling at ``coords``: the
    halo exchange of its window (forward) and its return (backward), on this rank's channels.
    ``shape`` ``(N, C, H, W)`` on a ``(P_N, P_c, P_H, P_W)`` grid, or ``(N, C, D, H, W)`` on a
    ``(P_N, P_c, P_D, P_H, P_W)`` one."""
    kernel, stride, padding, out = POOL_GEOMETRY[len(shape) - 2](shape, kernel_size, stride, padding)
    C_i = block_size(shape[1], grid_shape[1], coords[1])
    geom = ConvGeometry(tuple(shape), (C_i, C_i) + kernel, tuple(shape[:2]) + out, stride, padding,
                        (1,) * len(kernel), bias=False, itemsize=itemsize)
    exchange, back = halo_records(geom, grid_shape, coords, C_i)
    return exchange + back


def gap_records(shape, grid_shape, coords, itemsize):
    """The call of one forward and backward of global average pooling at ``coords``: forward,
    the allreduce of the local sums ``(n, C_i)`` over the spatial peers (``P_H P_W``, or
    ``P_D P_H P_W`` on a grid of volumes); backward, none."""
    (P_N, P_c), spatial = grid_shape[:2], grid_shape[SPATIAL:]
    n, C_i = block_size(shape[0], P_N, coords[0]), block_size(shape[1], P_c, coords[1])
    return [Call("allreduce", math.prod(spatial), n * C_i * itemsize, axes=axes_of(len(grid_shape))[SPATIAL:])]
