"""The fits of ``refconv calibrate``: a line or a plane through measured times by relative least squares, and
the rule that measures an item again, larger, until its fitted time grows with its size.

The measuring is :mod:`refconv.plan.measure`; the command that writes the machine file, :mod:`refconv.plan.calibrate`.
"""

import numpy

SLOPE_FLOOR = 1e-15  # fit_line's slope where the time did not grow with the size: a rate of 1e15, "free"


def fit_line(x, y):
    """``(a, b)`` of ``y = a + b x`` minimising the squared *relative* errors (the sizes span
    orders of magnitude), both kept >= 0 (a time cannot shrink as the size grows)."""
    x, y = numpy.asarray(x, float), numpy.asarray(y, float)
    A = numpy.stack([numpy.ones(len(x)), x], axis=1) / y[:, None]
    (a, b), *_ = numpy.linalg.lstsq(A, numpy.ones(len(x)), rcond=None)
    if b <= 0:
        return float(numpy.median(y)), SLOPE_FLOOR
    if a < 0:
        b, a = float(numpy.median(y / x)), 0.0
    return float(a), float(b)


def fit_plane(x1, x2, y):
    """``(a, b, c)`` of ``y = a + b x1 + c x2`` by relative least squares, all kept >= 0 (a
    term fitted negative is dropped and the rest refitted)."""
    x1, x2, y = (numpy.asarray(v, float) for v in (x1, x2, y))
    A = numpy.stack([numpy.ones(len(y)), x1, x2], axis=1) / y[:, None]
    (a, b, c), *_ = numpy.linalg.lstsq(A, numpy.ones(len(y)), rcond=None)
    if c <= 0 or b <= 0:
        a, b = fit_line(x1, y)
        return a, b, 0.0
    if a < 0:
        A = numpy.stack([x1, x2], axis=1) / y[:, None]
        (b, c), *_ = numpy.linalg.lstsq(A, numpy.ones(len(y)), rcond=None)
        if b <= 0 or c <= 0:
            a, b = fit_line(x1, y)
            return a, b, 0.0
        a = 0.0
    return float(a), float(b), float(c)


def fit_error(x, y, a, b):
    pred = a + b * numpy.asarray(x, float)
    return float(numpy.median(numpy.abs(pred - y) / numpy.asarray(y)))


RETRIES = 2  # an item whose time did not grow with its size is measured again, larger each time


def until_grown(measure, sizes, grow, fit):
    """Measure each item until its fitted time grows with its size.

    ``measure({item: sizes})`` -> ``{item: data}`` times every pending item at once;
    ``fit(item, data)`` -> its fitted figures, or None where the time did not grow; an item
    that did not is measured again at ``grow(item, sizes)``, up to :data:`RETRIES` times.
    Returns ``({item: (figures, data, retries)}, {item: data of its last try})``: the second
    holds what never grew.  The times are the slowest rank's (:func:`time_ranks`), so every
    rank decides alike."""
    done, pending = {}, dict(sizes)
    for attempt in range(RETRIES + 1):
        data = measure(pending)
        for item in list(pending):
            figures = fit(item, data[item])
            if figures is not None:
                done[item] = (figures, data[item], attempt)
                del pending[item]
            elif attempt < RETRIES:
                pending[item] = grow(item, pending[item])
        if not pending:
            break
    return done, {item: data[item] for item in pending}


def grown_line(xs, ys):
    """``(t0, seconds per unit)`` of :func:`fit_line`, or None where the time did not grow."""
    a, b = fit_line(xs, ys)
    return (a, b) if b > SLOPE_FLOOR else None
