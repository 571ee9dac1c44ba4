"""Halos of volumes, without MPI: for drawn 3-D problems on drawn depth x height x width grids,
every rank's window assembled from the pieces of :func:`refconv.halo.halo_plan` (faces, edges and
corners from their owners) is the padded volume's window, cut from the volume padded by the
serial oracle (refconv.reference.padding, numpy.pad underneath); and on one rank, extend and
reduce are adjoint."""

import importlib.util
import pathlib

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from refconv import checks
from refconv.distribution import Distribution
from refconv.halo import Box, Halo, halo_plan
from refconv.reference import padding as padding_modes
from refconv.testing.strategies import PADDING_MODES, conv3d_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]


@st.composite
def volumes_on_grids(draw):
    """A 3-D problem and a spatial grid ``(P_D, P_H, P_W)`` of 1 to 3 ranks a side (geometry only,
    no MPI: up to 27 ranks, so that most windows have edges and corners) that splits it without
    empty blocks."""
    spatial = tuple(draw(st.integers(1, 3)) for _ in range(3))
    problem = draw(conv3d_problems(min_size=spatial, padding_strings=True, padding_modes=PADDING_MODES,
                                   max_channels=2, max_batch=1, groups=False))
    return problem, spatial


@settings(max_examples=40)
@given(volumes_on_grids())
def test_windows_assembled_from_pieces_are_the_padded_volume(case):
    p, spatial = case
    x = numpy.arange(numpy.prod(p.x_shape), dtype=numpy.float64).reshape(p.x_shape)  # each cell its own id
    stride, low, dilation, _, out = checks.conv_geometry(p.x_shape, p.w_shape, p.stride, p.padding, p.dilation,
                                                         p.groups, dims=3)
    owned, window, pieces = halo_plan(spatial, p.size, out, p.kernel, stride, low, dilation, p.padding_mode)
    pads = checks.conv_padding(p.padding, p.kernel, stride, dilation)
    big = max(max(pair) for pair in pads) + 3 * max(p.kernel) * max(dilation)  # wide enough for any window
    wide = tuple((big, big) for _ in range(3))
    # numpy.pad reflects (wraps) again past the first copy: the periodic copies the halo takes too
    padded = (numpy.pad(x, ((0, 0), (0, 0)) + wide) if p.padding_mode == "zeros"
              else padding_modes.pad(x, wide, p.padding_mode))
    blocks = Distribution((1, 1) + tuple(spatial), p.x_shape, (None, None, "depth", "height", "width"))
    for reader, win in enumerate(window):
        x_win = numpy.zeros((p.N, p.C) + win.shape)
        filled = numpy.zeros(win.shape, dtype=int)
        for (owner, to), piece in pieces.items():
            if to == reader:
                x_win[piece.window_index()] = blocks.extract(x, (0, 0) + tuple(numpy.unravel_index(owner, spatial)))[
                    piece.owned_index()]
                filled[piece.window_index()[2:]] += 1
        inside = Box.of((0, 0, 0), p.size).intersect(win)
        if p.padding_mode == "zeros":  # every image cell of the window once, from its owner; padding none
            expected = numpy.zeros(win.shape, dtype=int)
            if inside is not None:
                expected[inside.slices(win)] = 1
            assert (filled == expected).all(), f"rank {reader}: cells filled {filled.tolist()}"
        else:
            assert (filled == 1).all(), f"rank {reader}: cells filled {filled.tolist()}"
        cut = tuple(slice(a + big, b + big) for a, b in zip(win.lo, win.hi))
        numpy.testing.assert_array_equal(x_win, padded[(slice(None), slice(None)) + cut])


@settings(max_examples=30)
@given(conv3d_problems(padding_strings=True, padding_modes=PADDING_MODES, max_channels=2))
def test_one_rank_extend_and_reduce_are_adjoint(p):
    stride, low, dilation, _, out = checks.conv_geometry(p.x_shape, p.w_shape, p.stride, p.padding, p.dilation,
                                                         p.groups, dims=3)
    halo = Halo(MPI.COMM_SELF, (1, 1, 1), p.size, out, p.kernel, stride, low, dilation, p.padding_mode)
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal(p.x_shape)
    x_win = halo.extend(x, numpy)
    assert x_win.shape == p.x_shape[:2] + halo.window_shape
    d = rng.standard_normal(x_win.shape)
    lhs, rhs = float((x_win * d).sum()), float((x * halo.reduce(d, numpy)).sum())
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))


def test_boxes_of_three_axes_name_their_bounds_and_peel_into_six_slabs():
    box = Box(-1, 4, 0, 3, 2, 5)
    assert (box.d0, box.d1, box.h0, box.h1, box.w0, box.w1) == (-1, 4, 0, 3, 2, 5) and box.shape == (5, 3, 3)
    assert repr(box) == "Box(d0=-1, d1=4, h0=0, h1=3, w0=2, w1=5)" and Box(0, 1, 0, 1).shape == (1, 1)
    halo = Halo(MPI.COMM_SELF, (1, 1, 1), (4, 4, 4), (4, 4, 4), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    assert len(halo.fill_index) == 6  # the six faces of padding around a whole volume
    image = numpy.ones((1, 1, 4, 4, 4))
    x_win = halo.extend(image, numpy)
    assert x_win.sum() == 64 and x_win.shape == (1, 1, 6, 6, 6)


def test_halo_figure_counts_faces_edges_and_corner(tmp_path):
    """docs/figures/halo3d_figure.py draws what halo_plan gives rank 0 of 2 x 2 x 2 ranks on a 5^3 volume
    (blocks of 3 and 2, one cell of halo a side): 3 x 3 x 3 cells of its own, three 3 x 3 faces,
    three edges of 3 cells, one corner cell."""
    spec = importlib.util.spec_from_file_location("halo3d_figure", ROOT / "docs" / "figures" / "halo3d_figure.py")
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    counts = figure.draw(tmp_path / "halo3d.png")
    assert list(counts.values()) == [27, 3 * 9, 3 * 3, 1]
    assert (tmp_path / "halo3d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
