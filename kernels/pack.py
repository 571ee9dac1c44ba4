"""Packing for the collectives: channel slabs (allgather / reduce-scatter) and row strips (halos).

Versions: one.  All four operations are the same kernel, :func:`copy_box`: one
thread per element of a 4-D box, reading ``src`` at one offset and writing (or
adding into) ``dst`` at another.  Benchmark: ``python -m refconv.bench kernels``.

    pack_channels(x, a, b)        x[:, a:b]          -> new contiguous array
    unpack_channels(dst, s, a)    dst[:, a:a+s.C]    =  (or +=) s
    pack_rows(x, a, b)            x[:, :, a:b]       -> new contiguous array
    unpack_rows(dst, s, a)        dst[:, :, a:a+s.H] =  (or +=) s
"""

from numba import cuda

from ._launch import grid_1d, split4, xp


@cuda.jit
def copy_box(src, dst, box, src_c, src_h, dst_c, dst_h, accumulate):
    """Thread ``t`` handles box element ``(n, c, h, w) = unravel(t, box)``:
    ``dst[n, dst_c + c, dst_h + h, w] (+)= src[n, src_c + c, src_h + h, w]``."""
    index = cuda.grid(1)
    if index >= box[0] * box[1] * box[2] * box[3]:
        return
    n, c, h, w = split4(index, box[1], box[2], box[3])
    value = src[n, src_c + c, src_h + h, w]
    if accumulate:
        dst[n, dst_c + c, dst_h + h, w] += value
    else:
        dst[n, dst_c + c, dst_h + h, w] = value


def _launch(src, dst, box, src_c=0, src_h=0, dst_c=0, dst_h=0, accumulate=False):
    size = box[0] * box[1] * box[2] * box[3]
    if size:
        blocks, threads = grid_1d(size)
        copy_box[blocks, threads](src, dst, tuple(int(s) for s in box), src_c, src_h, dst_c, dst_h, bool(accumulate))
    return dst


def _check_range(start, stop, size, name):
    if not (0 <= start <= stop <= size):
        raise ValueError(f"start, stop: expected 0 <= start <= stop <= {size} ({name}), got {start}, {stop}")


def _check_unpack(dst, src, start, axis, name):
    if src.ndim != 4 or dst.ndim != 4:
        raise ValueError(f"src, dst: expected 4 dimensions, got shapes {tuple(src.shape)} and {tuple(dst.shape)}")
    expected = list(dst.shape)
    expected[axis] = src.shape[axis]
    if tuple(src.shape) != tuple(expected):
        raise ValueError(f"src: expected shape {tuple(expected)} (dst's, but {name}), got {tuple(src.shape)}")
    _check_range(start, start + src.shape[axis], dst.shape[axis], name)


def pack_channels(x, start, stop):
    """``x[:, start:stop]`` of ``x (N, C, H, W)`` as a contiguous ``(N, stop - start, H, W)`` array."""
    N, C, H, W = x.shape
    _check_range(start, stop, C, "channels")
    out = xp().empty((N, stop - start, H, W), dtype=x.dtype)
    return _launch(x, out, out.shape, src_c=start)


def unpack_channels(dst, src, start, *, accumulate=False):
    """Write (or add) ``src (N, c, H, W)`` into ``dst[:, start:start + c]`` in place; returns ``dst``."""
    _check_unpack(dst, src, start, 1, "channels")
    return _launch(src, dst, src.shape, dst_c=start, accumulate=accumulate)


def pack_rows(x, start, stop):
    """``x[:, :, start:stop]`` of ``x (N, C, H, W)`` as a contiguous ``(N, C, stop - start, W)`` array."""
    N, C, H, W = x.shape
    _check_range(start, stop, H, "rows")
    out = xp().empty((N, C, stop - start, W), dtype=x.dtype)
    return _launch(x, out, out.shape, src_h=start)


def unpack_rows(dst, src, start, *, accumulate=False):
    """Write (or add) ``src (N, C, h, W)`` into ``dst[:, :, start:start + h]`` in place; returns ``dst``."""
    _check_unpack(dst, src, start, 2, "rows")
    return _launch(src, dst, src.shape, dst_h=start, accumulate=accumulate)
