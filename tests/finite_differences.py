"""Central finite differences over every entry of an input, for gradient checks."""

import numpy


def numerical_gradient(f, x, eps=1e-6):
    """``d f(x) / d x`` for scalar ``f``, by central differences on each entry of ``x`` (float64)."""
    grad = numpy.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for k in range(flat.size):
        saved = flat[k]
        flat[k] = saved + eps
        up = f(x)
        flat[k] = saved - eps
        down = f(x)
        flat[k] = saved
        gflat[k] = (up - down) / (2 * eps)
    return grad


def check_gradient(f, x, analytic, *, rtol=1e-6, atol=1e-8):
    """Assert that ``analytic`` matches the finite-difference gradient of ``f`` at ``x``, everywhere."""
    numeric = numerical_gradient(f, x)
    numpy.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol)
