"""Serial checks of block_range, Split, Distribution and the grid figure (no mpiexec)."""

import pathlib
import subprocess
import sys

import numpy
import pytest
from hypothesis import given, strategies as st

from refconv.distribution import Distribution, Split, block_range
from refconv.testing.asserts import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]


@given(length=st.integers(0, 50), parts=st.integers(1, 12))
def test_block_range_is_array_split(length, parts):
    blocks = numpy.array_split(numpy.arange(length), parts)
    for i, b in enumerate(blocks):
        s, e = block_range(length, parts, i)
        assert list(range(s, e)) == list(b)


def test_block_range_rejects_bad_index():
    with pytest.raises(ValueError, match=r"index must be in \[0, 3\)"):
        block_range(10, 3, 3)


def test_empty_block_error_names_dim():
    with pytest.raises(ValueError, match="dim H of length 3 cannot be split 4 ways: "
                                         "rank block would be empty"):
        Distribution((1, 1, 4, 1), (2, 2, 3, 5), ("sample", "channel", "height", "width"))


def test_shared_axis_must_cover_all_blocks():
    with pytest.raises(ValueError, match="dims H and W are both split over axis width"):
        Distribution((1, 1, 1, 2), (1, 1, 4, 4), (None, None, "width", "width"))


def test_stationary_w_tables():
    # P_c = 6 = p_f 2 * p_c' 3; c = a*3 + b
    f = Split.stationary_w_filters(6, 2).table(6)[1]
    c = Split.stationary_w_channels(6, 2).table(6)[1]
    assert f[4] == (3, 4, 5) and c[4] == (1, 4)        # a=1, b=1
    d = Distribution((1, 6, 1, 1), (12, 14, 3, 3), (Split.stationary_w_filters(6, 2),
                     Split.stationary_w_channels(6, 2), None, None), names=("F", "C", "Kh", "Kw"))
    coords = (0, 4, 0, 0)
    assert d.pieces(coords, 0) == [(6, 12)]             # F blocks 3..5 merged
    assert d.pieces(coords, 1) == [(3, 6), (10, 12)]    # C blocks 1 and 4 of 14 split 6 ways
    assert d.local_shape(coords) == (6, 5, 3, 3)
    w = numpy.arange(12 * 14 * 9.0).reshape(12, 14, 3, 3)
    loc = d.extract(w, 4)
    assert loc.flags.c_contiguous
    assert numpy.array_equal(loc, w[6:12][:, [3, 4, 5, 10, 11]])
    w2 = numpy.zeros_like(w)
    d.insert(w2, loc, 4)
    assert numpy.array_equal(w2[6:12][:, [3, 4, 5, 10, 11]], loc)


def test_activations_equality_and_repr():
    a = Distribution.activations((2, 3, 1, 1), (4, 7, 5, 5))
    b = Distribution((2, 3, 1, 1), (4, 7, 5, 5), ("sample", Split.block("channel"), "height",
                                                  "width"))
    assert a == b and hash(a) == hash(b)
    assert a != Distribution.activations((2, 3, 1, 1), (4, 7, 5, 5), channel_split=False)
    assert "Split.block('channel')" in repr(a)
    assert a.local_shape(0) == (2, 3, 5, 5) and a.local_shape(5) == (2, 2, 5, 5)
    assert a.index(5) == (slice(2, 4), slice(5, 7), slice(0, 5), slice(0, 5))


def test_assert_close_reports_indices():
    x = numpy.zeros((3, 4))
    y = x.copy()
    y[1, 2] = 1.0
    with pytest.raises(AssertionError, match=r"(?s)1 of 12 elements differ.*\(1, 2\): actual 0.0 expected 1.0"):
        assert_close(x, y, name="x")
    assert_close(numpy.float32(1) + numpy.float32(1e-6), numpy.float32(1), reduction_length=100)


def test_grid_figure_script_writes_png(tmp_path):
    out = tmp_path / "grid.png"
    subprocess.run([sys.executable, str(ROOT / "docs" / "figures" / "grid_figure.py"), str(out)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
