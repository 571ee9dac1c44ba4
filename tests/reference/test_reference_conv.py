"""The reference convolution: two formulations agree, and gradients match finite differences."""

import tracemalloc

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from conv_checks import assert_gradients_match_finite_differences, assert_vectorised_matches_loops
from refconv import reference as ref
from refconv.testing.strategies import PADDING_MODES, conv_problems


@settings(max_examples=150)
@given(conv_problems(dtypes=("float64", "float32"), padding_strings=True, padding_modes=PADDING_MODES))
def test_vectorised_matches_loops(problem):
    assert_vectorised_matches_loops(problem, 2)


@settings(max_examples=40)
@given(conv_problems(max_channels=3, max_extra=2, padding_strings=True, padding_modes=PADDING_MODES))
def test_conv_gradients_match_finite_differences(problem):
    assert_gradients_match_finite_differences(problem, 2)


@pytest.mark.parametrize(
    "x_shape, w_shape, kwargs, out_hw",
    [
        ((1, 1, 5, 5), (1, 1, 3, 3), {}, (3, 3)),
        ((1, 1, 5, 5), (1, 1, 3, 3), dict(padding=1), (5, 5)),
        ((1, 1, 7, 6), (1, 1, 3, 2), dict(stride=(2, 3), padding=(1, 0)), (4, 2)),
        ((1, 1, 9, 9), (1, 1, 3, 3), dict(dilation=2), (5, 5)),
        ((1, 4, 5, 5), (6, 2, 1, 1), dict(groups=2), (5, 5)),
        ((1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3), (112, 112)),
        ((1, 1, 7, 6), (1, 1, 4, 2), dict(padding="same"), (7, 6)),  # even kernels: one more pad below/right
        ((1, 1, 7, 6), (1, 1, 3, 2), dict(padding="same", dilation=(2, 3)), (7, 6)),
        ((1, 1, 7, 6), (1, 1, 3, 2), dict(padding="valid", dilation=(2, 1)), (3, 5)),
    ],
)
def test_output_size_follows_pytorch(x_shape, w_shape, kwargs, out_hw):
    y = ref.conv2d_forward(numpy.zeros(x_shape), numpy.zeros(w_shape), **kwargs)
    assert y.shape == (x_shape[0], w_shape[0], *out_hw)


def test_known_values():
    x = numpy.arange(16, dtype=numpy.float64).reshape(1, 1, 4, 4)
    w = numpy.ones((1, 1, 2, 2))
    y = ref.conv2d_forward(x, w, numpy.array([0.5]), stride=2)
    numpy.testing.assert_array_equal(y[0, 0], [[10.5, 18.5], [42.5, 50.5]])
    # A grouped conv is the per-group conv of the channel slices.
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 5))
    w = rng.standard_normal((6, 2, 3, 3))
    y = ref.conv2d_forward(x, w, groups=2)
    numpy.testing.assert_allclose(y[:, :3], ref.conv2d_forward(x[:, :2], w[:3]))
    numpy.testing.assert_allclose(y[:, 3:], ref.conv2d_forward(x[:, 2:], w[3:]))


@given(st.sampled_from(["float32", "float64"]))
def test_dtype_is_preserved(dtype):
    x = numpy.ones((1, 2, 4, 4), dtype=dtype)
    w = numpy.ones((3, 2, 3, 3), dtype=dtype)
    assert ref.conv2d_forward(x, w).dtype == dtype


# -- the vectorised formulation's own choices: columns kept or not, 1x1 without columns, memory


def _padded_im2col(x, kernel, stride, padding, dilation, out_hw):
    """Independent oracle: pad with numpy.pad, then read every tap by its definition."""
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw), (Ho, Wo) = kernel, stride, padding, dilation, out_hw
    x_pad = numpy.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = numpy.empty(x.shape[:2] + (Kh, Kw, Ho, Wo), dtype=x.dtype)
    for i in range(Kh):
        for j in range(Kw):
            for oh in range(Ho):
                for ow in range(Wo):
                    cols[:, :, i, j, oh, ow] = x_pad[:, :, i * dh + oh * sh, j * dw + ow * sw]
    return cols


@settings(max_examples=60)
@given(conv_problems(max_extra=5))
def test_im2col_matches_its_definition(problem):
    x, _, _, _ = problem.arrays(seed=3)
    p = problem
    args = ((p.Kh, p.Kw), p.stride, p.padding, p.dilation, p.y_shape[2:])
    cols = ref.im2col(x, *args)
    numpy.testing.assert_array_equal(cols, _padded_im2col(x, *args))
    # col2im is its adjoint: <im2col(x), c> == <x, col2im(c)>
    c = numpy.random.default_rng(4).standard_normal(cols.shape)
    lhs = float((cols * c).sum())
    rhs = float((x * ref.col2im(c, x.shape, p.stride, p.padding, p.dilation)).sum())
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))


@settings(max_examples=60)
@given(conv_problems(dtypes=("float64",)))
def test_kept_columns_give_the_same_passes(problem):
    x, w, b, dy = problem.arrays(seed=5)
    g = problem.geometry
    cols = ref.conv.conv2d_columns(x, w.shape, **g)
    assert cols.shape == ref.conv.conv2d_columns_shape(x.shape, w.shape, **g)
    numpy.testing.assert_allclose(ref.conv2d_forward(x, w, b, cols=cols, **g), ref.conv2d_forward(x, w, b, **g),
                                  rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(ref.conv2d_backward_filter(x, dy, w.shape, cols=cols, **g),
                                  ref.conv2d_backward_filter(x, dy, w.shape, **g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])
def test_pointwise_convolution_matches_loops(groups):
    # 1x1, stride 1, no padding: no columns are built; the loops stay the oracle.
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((3, 4, 5, 6))
    w = rng.standard_normal((6, 4 // groups, 1, 1))
    dy = rng.standard_normal((3, 6, 5, 6))
    g = dict(groups=groups)
    numpy.testing.assert_allclose(ref.conv2d_forward(x, w, **g), ref.loops.conv2d_forward(x, w, **g), rtol=1e-12)
    numpy.testing.assert_allclose(ref.conv2d_backward_data(dy, w, x.shape, **g),
                                  ref.loops.conv2d_backward_data(dy, w, x.shape, **g), rtol=1e-12)
    numpy.testing.assert_allclose(ref.conv2d_backward_filter(x, dy, w.shape, **g),
                                  ref.loops.conv2d_backward_filter(x, dy, w.shape, **g), rtol=1e-12)


def test_wrong_columns_are_rejected():
    x = numpy.ones((2, 3, 5, 5))
    cols = ref.conv.conv2d_columns(x, (4, 3, 3, 3), padding=1)
    with pytest.raises(ValueError, match="cols: expected the"):
        ref.conv2d_forward(x, numpy.ones((4, 3, 3, 3)), cols=cols)  # columns of padding=1, pass without


def test_backward_filter_holds_no_per_sample_gradients():
    # One GEMM over N*Ho*Wo: the peak is the columns, dy's transposed copy and dw, never N x |w|.

    N, C, F, H, K = 16, 32, 32, 4, 3
    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((N, C, H, H), dtype=numpy.float32)
    dy = rng.standard_normal((N, F, H, H), dtype=numpy.float32)
    cols_bytes = C * K * K * N * H * H * 4
    w_bytes = F * C * K * K * 4
    ref.conv.release_workspace()  # so that the columns are allocated, and counted, inside the call
    tracemalloc.start()
    try:
        ref.conv2d_backward_filter(x, dy, (F, C, K, K), padding=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= cols_bytes + dy.nbytes + 2 * w_bytes + 64 * 1024, (peak, N * w_bytes)


def test_same_padding_of_an_even_kernel_pads_the_high_side():
    """torch pads 'same' with d (K - 1) in all, the odd one after the input: a 2x2 kernel of ones
    at output (i, j) sums x[i:i+2, j:j+2], with zeros past the last row and column."""
    x = numpy.arange(12, dtype=numpy.float64).reshape(1, 1, 3, 4)
    y = ref.conv2d_forward(x, numpy.ones((1, 1, 2, 2)), padding="same")
    x_pad = numpy.pad(x[0, 0], ((0, 1), (0, 1)))  # an independent oracle: pad, then sum windows
    expected = [[x_pad[i:i + 2, j:j + 2].sum() for j in range(4)] for i in range(3)]
    numpy.testing.assert_array_equal(y[0, 0], expected)


@pytest.mark.parametrize("K, padding", [(3, 1), (1, 0)])
def test_results_never_live_in_the_reused_workspace(K, padding, monkeypatch):
    monkeypatch.setattr(ref.conv, "WORKSPACE_MIN_BYTES", 0)  # every temporary goes through the workspace
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((2, 4, 6, 6))
    w = rng.standard_normal((5, 4, K, K))
    dy = rng.standard_normal((2, 5, 6, 6))
    g = dict(padding=padding)
    results = [ref.conv2d_forward(x, w, **g), ref.conv2d_backward_data(dy, w, x.shape, **g),
               ref.conv2d_backward_filter(x, dy, w.shape, **g), ref.conv.conv2d_columns(x, w.shape, **g),
               ref.im2col(x, (K, K), (1, 1), (padding, padding), (1, 1), (6, 6))]
    copies = [r.copy() for r in results]
    assert ref.conv._workspace.buffer is not None  # the small shapes above went through it
    ref.conv2d_forward(rng.standard_normal((3, 4, 6, 6)), w, **g)  # overwrites the workspace
    ref.conv2d_backward_data(rng.standard_normal((3, 5, 6, 6)), w, (3, 4, 6, 6), **g)
    for r, c in zip(results, copies):
        numpy.testing.assert_array_equal(r, c)


@pytest.mark.parametrize("mode, expected_row", [
    ("reflect", [2, 1, 0, 1, 2, 3, 2, 1]),     # mirrored about the edge row
    ("replicate", [0, 0, 0, 1, 2, 3, 3, 3]),   # the edge row repeated
    ("circular", [2, 3, 0, 1, 2, 3, 0, 1]),    # wrapped around
])
def test_padding_modes_copy_image_rows(mode, expected_row):
    """A 1x5 kernel picking its first tap, padding 2: output column j is the padded column j."""
    x = numpy.arange(4, dtype=numpy.float64).reshape(1, 1, 1, 4)
    w = numpy.zeros((1, 1, 1, 5))
    w[0, 0, 0, 0] = 1
    y = ref.conv2d_forward(x, w, padding=(0, 2), padding_mode=mode)
    assert y[0, 0, 0].tolist() == expected_row[:4]
    y = ref.conv2d_forward(x, w[..., ::-1].copy(), padding=(0, 2), padding_mode=mode)  # the last tap
    assert y[0, 0, 0].tolist() == expected_row[4:]


def test_padding_mode_errors_say_what_fits():
    x, w = numpy.zeros((1, 1, 3, 3)), numpy.zeros((1, 1, 3, 3))
    with pytest.raises(ValueError, match=r"padding: padding_mode='reflect' needs pads shorter than the input"):
        ref.conv2d_forward(x, w, padding=3, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"padding: padding_mode='circular' needs pads at most the input"):
        ref.conv2d_backward_data(numpy.zeros((1, 1, 9, 9)), w, x.shape, padding=4, padding_mode="circular")
    with pytest.raises(ValueError, match=r"padding_mode: expected one of \('zeros', 'reflect'"):
        ref.conv2d_backward_filter(x, numpy.zeros((1, 1, 1, 1)), w.shape, padding_mode="mirror")
