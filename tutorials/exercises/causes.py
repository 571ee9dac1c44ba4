"""Cause hints: when a difference has a recognisable shape, say what it looks like.

:func:`explain` runs on a mismatch only (``harness.mismatch``), with the per-rank masks of the elements
that differ, and returns lines that each start ``  cause: ``.  A checker declares what to recognise on
its :class:`~tutorials.exercises.harness.Compared`:

- ``lookalikes``: wrong answers computed from the case (one rank's partial sum, ...): yours equals one;
- ``edges``: per trailing spatial axis, the halo's width: every difference lies next to a block edge;
- ``reruns``: more runs of the same case: they differ from each other, so the result is a race.

Exercise 1's dicts are compared key by key (:func:`mismatch_dict`): a missing entry is said as missing.
"""

import numpy

from refconv.testing.asserts import default_tolerance

PREFIX = "  cause: "


def _close(a, e, c):
    a, e = numpy.asarray(a), numpy.asarray(e)
    if a.shape != e.shape:
        return False
    rtol, atol = default_tolerance(e.dtype if e.dtype.kind == "f" else numpy.float64, c.reduction)
    return bool(numpy.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True).all())


def explain(c, masks):
    """The cause lines of a mismatch of ``c`` (``masks``: ``[(rank, bad)]``); ``[]`` if none is recognised."""
    bad_ranks = [r for r, bad in masks if bad.any()]
    found = _race(c) + _lookalike(c, bad_ranks) + _edges(c, masks)
    return [PREFIX + text for text in found]


def _race(c):
    if c.reruns is None:
        return []
    runs = [c.actual, *c.reruns()]
    if all(_close(run[k], runs[0][k], c) for run in runs[1:] for k in range(len(runs[0]))):
        return []
    return ["results change from run to run: a race; is a cuda.syncthreads() missing?"]


def _lookalike(c, bad_ranks):
    if c.lookalikes is None:
        return []
    for what, arrays in c.lookalikes():
        if all(_close(arrays[r], c.expected[r], c) for r in bad_ranks):
            continue  # the same as the reference here: it tells nothing
        if all(_close(c.actual[r], arrays[r], c) for r in bad_ranks):
            return [f"your {c.name} equals {what}"]
    return []


def _edges(c, masks):
    """Every differing element lies within the halo's width of an end of some spatial axis of its rank's
    array, and some element away from every end is right."""
    if c.edges is None:
        return []
    near_all, interior_right, where = True, False, []
    for r, bad in masks:
        axes = bad.ndim - len(c.edges)
        near = numpy.zeros(bad.shape, dtype=bool)
        for k, width in enumerate(c.edges):
            n = bad.shape[axes + k]
            at = numpy.arange(n)
            edge = (at < width) | (at >= n - width)
            near |= edge.reshape((1,) * (axes + k) + (n,) + (1,) * (len(c.edges) - k - 1))
        near_all &= bool((near | ~bad).all())
        interior_right |= bool((~near & ~bad).any())
        if bad.any():
            where.append(r)
    if not (near_all and interior_right and where):
        return []
    widths = " x ".join(map(str, c.edges))
    return [f"values differ only next to a block edge: the halo (within {widths} of the edge of the "
            f"block{'s' if len(where) > 1 else ''} of {c.label}{'s' if len(where) > 1 else ''} "
            f"{', '.join(map(str, where))})"]


def mismatch_dict(c):
    """Dicts per rank compared key by key: a missing entry, an extra one, or a different value, in words."""
    lines = []
    for r, (a, e) in enumerate(zip(c.actual, c.expected)):
        if not isinstance(a, dict):
            lines.append(f"{c.label} {r}: yours is {a!r}, not a dict like the reference's")
            continue
        for key in sorted(set(a) | set(e), key=repr):
            if key not in a:
                lines.append(f"{c.label} {r}: your dict has no entry for {key!r} (the reference: {e[key]!r})")
            elif key not in e:
                lines.append(f"{c.label} {r}: your dict has an entry for {key!r} that the reference has not: "
                             f"{a[key]!r}")
            elif a[key] != e[key]:
                lines.append(f"{c.label} {r}: entry {key!r}: yours {a[key]!r}, reference {e[key]!r}")
    if len(c.actual) != len(c.expected):
        lines.insert(0, f"{len(c.actual)} results for {len(c.expected)} {c.label}s")
    if not lines:
        return None
    ranks = sorted({int(line.split()[1].rstrip(":")) for line in lines if line.startswith(c.label + " ")})
    return [f"{c.name} differs on {c.label}{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}:"] + \
        ["  " + line for line in lines[:8]]
