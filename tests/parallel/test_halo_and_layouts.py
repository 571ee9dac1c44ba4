"""One-rank halos (no copy when nothing is padded), cached layouts, and the numpy backend's
batch-norm sums: each against an independent formula."""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from refconv.algorithms.base import ConvGeometry
from refconv.algorithms.spatial import SampleSpatial
from refconv.backend import NumpyBackend
from refconv.distribution import Distribution, Split
from refconv.grid import ProcessGrid
from refconv.halo import Box, Halo
from refconv.testing.asserts import assert_close
from refconv.testing.strategies import conv3d_problems, conv_problems


def _halo(p):
    return Halo(MPI.COMM_SELF, (1, 1), (p.H, p.W), p.y_shape[2:], (p.Kh, p.Kw), p.stride, p.padding, p.dilation)


@settings(max_examples=60)
@given(conv_problems(max_extra=5))
def test_one_rank_window_is_the_padded_image_and_reduce_its_adjoint(problem):
    p = problem
    x, _, _, _ = p.arrays(seed=8)
    halo = _halo(p)
    win = halo.window[0]
    x_win = halo.extend(x, numpy, fill=-7.0)
    assert x_win.shape == x.shape[:2] + halo.window_shape
    # The window by its definition: rows [h0, h1) of the image padded with the fill value.
    big = max(p.padding) + max(p.Kh, p.Kw) * max(p.dilation) + 1
    padded = numpy.pad(x, ((0, 0), (0, 0), (big, big), (big, big)), constant_values=-7.0)
    numpy.testing.assert_array_equal(x_win, padded[:, :, win.h0 + big:win.h1 + big, win.w0 + big:win.w1 + big])
    # reduce is the adjoint of extend with fill 0: <extend(x), d> == <x, reduce(d)>
    d = numpy.random.default_rng(9).standard_normal(x_win.shape)
    lhs = float((halo.extend(x, numpy) * d).sum())
    rhs = float((x * halo.reduce(d, numpy)).sum())
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))


def test_one_rank_without_padding_copies_nothing():
    x = numpy.ones((2, 3, 6, 6))
    halo = Halo(MPI.COMM_SELF, (1, 1), (6, 6), (4, 4), (3, 3), (1, 1), (0, 0), (1, 1))
    assert halo.extend(x, numpy) is x
    assert halo.reduce(x, numpy) is x
    # A stride that leaves the last row unread: the window is smaller, its gradient is zero there.
    halo = Halo(MPI.COMM_SELF, (1, 1), (6, 6), (3, 3), (2, 2), (2, 2), (0, 0), (1, 1))
    assert halo.window_shape == (6, 6)
    halo = Halo(MPI.COMM_SELF, (1, 1), (7, 7), (3, 3), (2, 2), (2, 2), (0, 0), (1, 1))
    assert halo.window_shape == (6, 6)
    dx = halo.reduce(numpy.ones((1, 1, 6, 6)), numpy)
    assert dx.shape == (1, 1, 7, 7) and dx[0, 0, 6].sum() == 0 and dx[0, 0, :6, :6].sum() == 36


def test_equal_layouts_share_their_tables():
    a = Distribution((2, 2, 1, 1), (8, 6, 4, 4), ("sample", "channel", None, None))
    b = Distribution((2, 2, 1, 1), (8, 6, 4, 4), (Split.block("sample"), "channel", None, None))
    assert a == b and a._tables is b._tables
    assert a.local_shape(3) == (4, 3, 4, 4) and b.local_shape((1, 1, 0, 0)) == (4, 3, 4, 4)
    assert a.local_shape(0) == (4, 3, 4, 4)
    with pytest.raises(ValueError, match=r"dims\[1\] must be None, an axis name"):
        Distribution((2, 2, 1, 1), (8, 6, 4, 4), ("sample", ["channel"], None, None))
    with pytest.raises(ValueError, match="cannot be split 2 ways"):
        Distribution((2, 2, 1, 1), (1, 6, 4, 4), ("sample", "channel", None, None))


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_batch_norm_sums_match_their_formulas(dtype, tol):
    rng = numpy.random.default_rng(10)
    x = (rng.standard_normal((4, 3, 5, 6)) + 2).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    gamma, beta = rng.standard_normal(3).astype(dtype), rng.standard_normal(3).astype(dtype)
    b, x64, dy64 = NumpyBackend(), x.astype("float64"), dy.astype("float64")
    axes = (0, 2, 3)
    mean = x64.mean(axis=axes)
    centered = x64 - mean.reshape(1, -1, 1, 1)
    invstd = 1 / numpy.sqrt((centered ** 2).mean(axis=axes) + 1e-5)
    close = lambda a, e: numpy.testing.assert_allclose(a, e, rtol=tol, atol=tol * 10)  # noqa: E731
    close(b.batch_norm_sum(x), x64.sum(axis=axes))
    close(b.batch_norm_centered_sum_squares(x, mean.astype(dtype)), (centered ** 2).sum(axis=axes))
    m, inv = mean.astype(dtype), invstd.astype(dtype)
    c = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    y = b.batch_norm_apply(x, m, inv, gamma, beta)
    assert y.dtype == x.dtype
    close(y, centered * c(invstd) * c(gamma) + c(beta))
    sdy, sdyx = b.batch_norm_grad_sums(dy, x, m, inv)
    xhat = centered * c(invstd)
    close(sdy, dy64.sum(axis=axes))
    close(sdyx, (dy64 * xhat).sum(axis=axes))
    M = x.shape[0] * x.shape[2] * x.shape[3]
    dx = b.batch_norm_backward_apply(dy, x, m, inv, gamma, sdy, sdyx, M)
    assert dx.dtype == x.dtype
    expected = c(gamma * invstd / M) * (M * dy64 - c(dy64.sum(axis=axes)) - xhat * c((dy64 * xhat).sum(axis=axes)))
    close(dx, expected)


@settings(max_examples=40)
@given(conv_problems(max_extra=5, dtypes=("float32", "float64")), st.data())
def test_backward_data_of_a_box_is_the_whole_backward_data_cut_to_it(problem, data):
    """``Algorithm.conv_data_box`` (backward-data's two parts behind the halo return) gives each
    cell of any window box the whole ``conv_data``'s value: the same products, summed in the same
    order, but BLAS may pick another kernel for a smaller product (a matrix-vector one for one
    column), so float32 may differ in the last bit.  Blocking and overlapped runs use the same
    split, so they agree bit for bit (tests/on_ranks/test_overlap.py)."""
    p = problem
    geom = ConvGeometry.of(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding, dilation=p.dilation,
                           groups=p.groups, bias=False)
    grid = ProcessGrid(MPI.COMM_SELF)
    algo = SampleSpatial(grid, geom, NumpyBackend())
    x, w, _, dy = p.arrays(seed=3)
    algo.x_win = algo.halo.extend(x, numpy)
    whole = algo.conv_data(dy, w, algo.x_win.shape)
    h_win, w_win = algo.x_win.shape[2:]
    h0, w0 = data.draw(st.integers(0, h_win - 1)), data.draw(st.integers(0, w_win - 1))
    box = Box(h0, data.draw(st.integers(h0 + 1, h_win)), w0, data.draw(st.integers(w0 + 1, w_win)))
    assert_close(algo.conv_data_box(dy, w, box), whole[(slice(None), slice(None)) + box.slices()],
                 reduction_length=p.F // p.groups * p.Kh * p.Kw, name="dx_win[box]")
    grid.free()


@settings(max_examples=15)
@given(conv3d_problems(max_channels=2, max_kernel=2, max_extra=2, dtypes=("float64",)), st.data())
def test_backward_data_of_a_volume_box_is_the_whole_backward_data_cut_to_it(problem, data):
    """The same in a volume: a box of planes, rows and columns (float64: round-off only)."""
    p = problem
    geom = ConvGeometry.of(p.x_shape, p.w_shape, stride=p.stride, padding=p.padding, dilation=p.dilation,
                           groups=p.groups, bias=False, dims=3)
    grid = ProcessGrid(MPI.COMM_SELF)
    algo = SampleSpatial(grid, geom, NumpyBackend())
    x, w, _, dy = p.arrays(seed=3)
    algo.x_win = algo.halo.extend(x, numpy)
    whole = algo.conv_data(dy, w, algo.x_win.shape)
    lo = [data.draw(st.integers(0, size - 1)) for size in algo.x_win.shape[2:]]
    box = Box.of(lo, [data.draw(st.integers(a + 1, size)) for a, size in zip(lo, algo.x_win.shape[2:])])
    assert_close(algo.conv_data_box(dy, w, box), whole[(slice(None), slice(None)) + box.slices()],
                 reduction_length=p.F // p.groups * int(numpy.prod(p.kernel)), name="dx_win[box]")
    grid.free()
