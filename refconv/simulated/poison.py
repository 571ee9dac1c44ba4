"""Poison in receive buffers: a read before the Wait shows in the results.

NumPy cannot trap a read of memory, so a receive buffer of a nonblocking call (``Irecv``, and
the receive buffer of ``Iallreduce``, ``Ialltoallw``, ``Iallgather``) holds poison from its post
until its request completes (``Wait`` or a ``Test`` that returns True): NaN for floats (and
complex), the dtype's minimum for signed integers, its maximum for unsigned ones (all bits set:
the minimum, 0, is too common a value to mean anything).  The data that arrives waits beside the
buffer and is copied in at completion, so what a rank reads before its Wait is poison on every
run, whatever the schedule; :func:`poisoned` finds it in the results.  ITAC's checker has the
same limit: a read is seen only through the values it spreads, so poison read and then
overwritten, or read into a comparison, a branch or an index, leaves no trace.  Booleans and
shapes-only arrays hold no poison.
"""

import math
import numbers

import numpy


def value(dtype):
    """The poison of ``dtype``, or None where there is none (bool, structured, object)."""
    if dtype.kind in "fc":
        return numpy.nan
    if dtype.kind == "i":
        return numpy.iinfo(dtype).min
    if dtype.kind == "u":
        return numpy.iinfo(dtype).max
    return None


def fill(array):
    """Poison ``array`` in place and return a copy of what it held, or None when it takes no poison."""
    if getattr(array, "shapes_only", False) or array.size == 0:
        return None
    poison = value(array.dtype)
    if poison is None:
        return None
    saved = array.copy()
    array.fill(poison)
    return saved


def _count(array):
    poison = value(array.dtype)
    if poison is None or array.size == 0:
        return 0
    if array.dtype.kind in "fc":
        return int(numpy.count_nonzero(numpy.isnan(array)))
    return int(numpy.count_nonzero(array == poison))


def poisoned(results):
    """``''`` when no receive-buffer poison reached ``results`` (what :func:`refconv.simulated.run`
    returned: nested lists, tuples and dicts of arrays and scalars), else a description of where:
    ``rank 1's result [0]: 4 of 8 elements hold the poison of a receive buffer (NaN) ...``."""
    found = []
    ranks = results if isinstance(results, list) else [results]
    for r, result in enumerate(ranks):
        for path, count, size, poison in _walk(result, ""):
            found.append(f"rank {r}'s result{path or ''}: {count} of {size} elements hold the poison of a receive "
                         f"buffer ({poison})")
    if not found:
        return ""
    return ("a receive buffer read before its Wait: " + "; ".join(found[:8]) + (" ..." if len(found) > 8 else "")
            + ". A nonblocking receive's buffer holds poison until its request completes")


def _walk(obj, path):
    """(path, poisoned elements, elements, the poison) for every poisoned array or scalar in ``obj``."""
    if isinstance(obj, numpy.ndarray):
        count = _count(obj)
        if count:
            yield path, count, obj.size, value(obj.dtype)
    elif isinstance(obj, numpy.generic):
        yield from _walk(numpy.asarray(obj), path)
    elif isinstance(obj, numbers.Real) and not isinstance(obj, (bool, numbers.Integral)):
        if math.isnan(obj):
            yield path, 1, 1, "nan"
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from _walk(item, f"{path}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _walk(item, f"{path}[{i}]")
