"""The stride-1 tap path (refconv.reference.conv_taps) against the loop oracle, and the rule that picks it.

The tap path is exact for any channel count; the rule picks it only where it is faster
(:func:`conv_taps.takes_taps`).  So the first test calls it directly on tiny drawn problems
(every padding, dilation and group count whose layout it holds), and the second checks the
public passes, whichever path the rule picks, on problems drawn around the rule's bounds.
"""

import dataclasses
from unittest import mock

import numpy
import pytest
from hypothesis import given, settings

from conv_checks import assert_vectorised_matches_loops
from refconv import checks
from refconv import reference as ref
from refconv.reference import conv_taps
from refconv.testing.strategies import PADDING_MODES, conv_problems


def _stride_one(problem):
    """The problem with stride 1 (its output only grows, so it stays valid)."""
    return dataclasses.replace(problem, stride=(1, 1))


def _layout_holds(problem):
    _, padding, dilation, _, out_hw = checks.conv_geometry(problem.x_shape, problem.w_shape, 1, problem.padding,
                                                           problem.dilation, problem.groups)
    return all(conv_taps._layout_holds(problem.x_shape[2 + a], out_hw[a], problem.w_shape[2 + a], padding[a],
                                       dilation[a]) for a in range(2))


@settings(max_examples=30, derandomize=True, database=None)
@given(conv_problems(max_channels=4, max_extra=3, dtypes=("float64", "float32"), padding_strings=True))
def test_tap_passes_match_loops(problem):
    problem = _stride_one(problem)
    x, w, _, dy = problem.arrays(seed=3)
    _, padding, dilation, groups, out_hw = checks.conv_geometry(x.shape, w.shape, 1, problem.padding,
                                                                problem.dilation, problem.groups)
    if not _layout_holds(problem):  # e.g. 'same' with an even kernel: more padding below than above
        wide = dataclasses.replace(problem, C=32 * problem.groups, F=32 * problem.groups)
        assert not conv_taps.takes_taps(wide.x_shape, wide.w_shape, (1, 1), padding, dilation, groups, out_hw)
        return
    tol = dict(rtol=1e-12, atol=1e-12) if problem.dtype == "float64" else dict(rtol=1e-4, atol=1e-4)
    g = dict(padding=problem.padding, dilation=problem.dilation, groups=groups)
    for ours, theirs in [(conv_taps.forward(x, w, padding, dilation, groups, out_hw),
                          ref.loops.conv2d_forward(x, w, **g)),
                         (conv_taps.backward_data(dy, w, x.shape, padding, dilation, groups),
                          ref.loops.conv2d_backward_data(dy, w, x.shape, **g)),
                         (conv_taps.backward_filter(x, dy, w.shape, padding, dilation, groups),
                          ref.loops.conv2d_backward_filter(x, dy, w.shape, **g))]:
        assert ours.dtype == x.dtype and ours.flags.c_contiguous
        numpy.testing.assert_allclose(ours, theirs, **tol)


def test_public_passes_match_loops_on_either_path():
    """Drawn around the rule's lower bound (16 channels per group), with strides, groups and every
    padding mode: the public passes match the oracle, and the draws reach both paths."""
    took_taps = []

    @settings(max_examples=10, derandomize=True, database=None)
    @given(conv_problems(max_batch=1, min_channels=16, max_channels=32, channel_multiple=16, groups=(1, 2),
                         max_extra=1, dtypes=("float32",), padding_strings=True, padding_modes=PADDING_MODES))
    def check(problem):
        with mock.patch.object(conv_taps, "forward", wraps=conv_taps.forward) as forward:
            assert_vectorised_matches_loops(problem, 2)
        took_taps.append(forward.called)

    check()
    assert set(took_taps) == {True, False}, took_taps


# (x_shape, w_shape, stride, padding, dilation, groups): which path the rule picks
RULE_CASES = [
    ((1, 16, 5, 5), (16, 16, 3, 3), 1, 1, 1, 1, True),
    ((1, 16, 7, 6), (32, 16, 3, 2), 1, (2, 1), (2, 1), 1, True),  # dilated, uneven
    ((1, 32, 5, 5), (32, 16, 3, 3), 1, 0, 1, 2, True),  # two groups of 16
    ((1, 128, 4, 4), (128, 128, 3, 3), 1, 1, 1, 1, True),  # the output's bound
    ((1, 8, 5, 5), (16, 8, 3, 3), 1, 1, 1, 1, False),  # too few input channels
    ((1, 32, 5, 5), (32, 8, 3, 3), 1, 1, 1, 4, False),  # too few per group
    ((1, 256, 4, 4), (128, 256, 3, 3), 1, 1, 1, 1, True),  # the input's bound
    ((1, 512, 4, 4), (128, 512, 3, 3), 1, 1, 1, 1, False),  # too many input channels
    ((1, 128, 4, 4), (256, 128, 3, 3), 1, 1, 1, 1, False),  # too many output channels
    ((1, 16, 5, 5), (16, 16, 3, 3), 2, 1, 1, 1, False),  # stride 2
    ((1, 16, 5, 5), (16, 16, 1, 1), 1, 0, 1, 1, False),  # 1x1: its own path, no columns
    ((1, 16, 5, 5), (16, 16, 1, 1), 1, 1, 1, 1, False),  # padding past the kernel's reach
    ((1, 16, 6, 6), (16, 16, 4, 4), 1, "same", 1, 1, False),  # more padding below than above
]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups, taps", RULE_CASES)
def test_rule(x_shape, w_shape, stride, padding, dilation, groups, taps):
    stride, padding, dilation, groups, out_hw = checks.conv_geometry(x_shape, w_shape, stride, padding, dilation,
                                                                     groups)
    assert conv_taps.takes_taps(x_shape, w_shape, stride, padding, dilation, groups, out_hw) is taps


def test_rule_reaches_the_public_passes(monkeypatch):
    """The public passes take the tap path exactly where the rule says so (counted on each call)."""
    calls = []
    for name in ("forward", "backward_data", "backward_filter"):
        monkeypatch.setattr(conv_taps, name, _counting(getattr(conv_taps, name), calls, name))
    rng = numpy.random.default_rng(0)
    for x_shape, w_shape, stride, padding, dilation, groups, taps in RULE_CASES[:6]:
        x, w = rng.standard_normal(x_shape, dtype=numpy.float32), rng.standard_normal(w_shape, dtype=numpy.float32)
        g = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        y = ref.conv2d_forward(x, w, **g)
        ref.conv2d_backward_data(y, w, x.shape, **g)
        ref.conv2d_backward_filter(x, y, w.shape, **g)
        assert calls == (["forward", "backward_data", "backward_filter"] if taps else []), (x_shape, w_shape)
        calls.clear()


def _counting(fn, calls, name):
    def run(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)
    return run


def test_3d_passes_keep_im2col(monkeypatch):
    """docs/reference.md: the 3-D passes build columns even on a layer whose channels the tap rule
    takes (the taps were slower there), so no tap pass is called."""
    calls = []
    for name in ("forward", "backward_data", "backward_filter"):
        monkeypatch.setattr(conv_taps, name, _counting(getattr(conv_taps, name), calls, name))
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((1, 32, 4, 4, 4), dtype=numpy.float32)  # CosmoFlow's second layer, smaller
    w = rng.standard_normal((64, 32, 3, 3, 3), dtype=numpy.float32)
    y = ref.conv3d_forward(x, w, padding=1)
    assert ref.conv3d_backward_data(y, w, x.shape, padding=1).shape == x.shape
    assert ref.conv3d_backward_filter(x, y, w.shape, padding=1).shape == w.shape
    assert calls == []
