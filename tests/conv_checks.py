"""The checks the 2-D and 3-D reference convolutions share, written once for both
(tests/reference/test_reference_conv.py and tests/reference/test_reference_conv3d.py): ``dims`` picks
``refconv.reference``'s ``conv2d_*`` or ``conv3d_*`` functions."""

import numpy

from finite_differences import check_gradient
from refconv import reference as ref


def passes(dims, namespace=ref):
    """``(forward, backward_data, backward_filter)`` of the ``dims``-D convolution in ``namespace``."""
    return tuple(getattr(namespace, f"conv{dims}d_{step}") for step in ("forward", "backward_data", "backward_filter"))


def assert_vectorised_matches_loops(problem, dims):
    """The three vectorised passes agree with the loop oracle on ``problem``, in shape, dtype and value
    (float64 to round-off, float32 to 1e-4)."""
    x, w, b, dy = problem.arrays(seed=1)
    g = problem.geometry
    tol = dict(rtol=1e-12, atol=1e-12) if problem.dtype == "float64" else dict(rtol=1e-4, atol=1e-4)
    forward, backward_data, backward_filter = passes(dims)
    oracle = passes(dims, ref.loops if dims == 2 else ref.loops3d)
    for ours, theirs, args, shape in [(forward, oracle[0], (x, w, b), problem.y_shape),
                                      (backward_data, oracle[1], (dy, w, x.shape), x.shape),
                                      (backward_filter, oracle[2], (x, dy, w.shape), w.shape)]:
        out = ours(*args, **g)
        assert out.shape == shape and out.dtype == x.dtype, (ours.__name__, out.shape, out.dtype)
        numpy.testing.assert_allclose(out, theirs(*args, **g), **tol)


def assert_gradients_match_finite_differences(problem, dims):
    """backward-data, backward-filter and the bias gradient of the ``dims``-D convolution are the
    derivatives of <forward(x, w, b), dy>, entry by entry (central differences)."""
    x, w, b, dy = problem.arrays(seed=2)
    g = problem.geometry
    forward, backward_data, backward_filter = passes(dims)
    loss = lambda x_, w_, b_: float((forward(x_, w_, b_, **g) * dy).sum())  # noqa: E731
    check_gradient(lambda x_: loss(x_, w, b), x, backward_data(dy, w, x.shape, **g))
    check_gradient(lambda w_: loss(x, w_, b), w, backward_filter(x, dy, w.shape, **g))
    check_gradient(lambda b_: loss(x, w, b_), b, getattr(ref, f"conv{dims}d_backward_bias")(dy))
