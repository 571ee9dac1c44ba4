"""The one ``assert_close``, and collective asserts for multi-rank tests.

Tolerance grows with the length of the reduction that produced ``actual``
(a sum of L terms carries about sqrt(L) roundings)::

    rtol = 8 * sqrt(reduction_length) * eps(dtype)        (default)
    atol = rtol                                            (default)

On a mismatch the message gives both shapes and the first mismatching indices
with their values.

In a multi-rank test every rank must reach the same verdict, or the ranks fall
out of step (one raises, the others wait in the next collective).  Use
``collective_assert_close(comm, ...)`` or ``assert_all_ranks(comm, ok, message)``:
they allgather each rank's verdict and raise AssertionError on EVERY rank if
any rank failed, naming the failing ranks and their messages.
"""

import math
import traceback

import numpy

from refconv import collectives
from refconv.arrays import to_host

EPS_FACTOR = 8.0


def _message(actual, expected, rtol, atol, reduction_length, name, show=5):
    a, e = to_host(actual), to_host(expected)
    label = f"{name}: " if name else ""
    if a.shape != e.shape:
        return f"{label}shape mismatch: actual {a.shape} vs expected {e.shape}"
    bad = ~numpy.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    idx = numpy.argwhere(bad)
    lines = [f"{label}{len(idx)} of {a.size} elements differ (shape {a.shape}, "
             f"rtol={rtol:.3g}, atol={atol:.3g}, reduction_length={reduction_length}); first:"]
    for i in idx[:show]:
        i = tuple(int(k) for k in i)
        lines.append(f"  {i}: actual {a[i]} expected {e[i]} diff {abs(a[i] - e[i])}")
    return "\n".join(lines)


def default_tolerance(dtype, reduction_length=1, *, factor=EPS_FACTOR, floor=0.0):
    """(rtol, atol) for results of a reduction of ``reduction_length`` terms:
    ``max(floor, factor * sqrt(reduction_length) * eps(dtype))``, the one tolerance formula."""
    dtype = numpy.dtype(dtype)
    eps = numpy.finfo(dtype).eps if dtype.kind in "fc" else 0.0
    tol = max(floor, factor * math.sqrt(max(1, reduction_length)) * float(eps))
    return tol, tol


def assert_close(actual, expected, *, rtol=None, atol=None, reduction_length=1, name=""):
    """Raise AssertionError unless ``actual`` matches ``expected`` within tolerance."""
    msg = close_message(actual, expected, rtol=rtol, atol=atol,
                        reduction_length=reduction_length, name=name)
    if msg is not None:
        raise AssertionError(msg)


def tolerance(actual, expected, *, rtol=None, atol=None, reduction_length=1):
    """``(rtol, atol)`` that :func:`close_message` compares ``actual`` with ``expected`` at: the given
    ones, else :func:`default_tolerance` of their common dtype."""
    dtype = numpy.result_type(getattr(actual, "dtype", numpy.float64),
                              getattr(expected, "dtype", numpy.float64))
    drtol, datol = default_tolerance(dtype, reduction_length)
    return (drtol if rtol is None else rtol), (datol if atol is None else atol)


def close_message(actual, expected, *, rtol=None, atol=None, reduction_length=1, name=""):
    """None when close, else the mismatch description assert_close would raise."""
    rtol, atol = tolerance(actual, expected, rtol=rtol, atol=atol, reduction_length=reduction_length)
    return _message(actual, expected, rtol, atol, reduction_length, name)


CAUGHT = []  # the exceptions the collective checks caught on this process's rank (refconv.testing.mpirun prints them)


def caught(exc):
    """Keep ``exc``, which a collective check turned into a verdict: if the ranks then fall out of step
    (a rank raised where the others went on), the test harness's timeout report shows it."""
    CAUGHT.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    del CAUGHT[:-8]


class CollectiveAssertionError(AssertionError):
    """What :func:`assert_all_ranks` raises on every rank.  ``reporter`` is the lowest failed rank:
    under mpiexec it alone prints the report (refconv.testing.mpirun), the others one line."""

    def __init__(self, text, reporter):
        super().__init__(text)
        self.reporter = reporter


TRACEBACK = "Traceback (most recent call last)"


def rank_list(ranks, size=None):
    """``rank 2``, ``ranks 0, 2``, or ``every rank`` (all ``size`` of them)."""
    ranks = list(ranks)
    if size is not None and len(ranks) == size and size > 1:
        return "every rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _shown(text, ranks, me, reporter):
    """A group's report as rank ``me`` shows it: in full, but a traceback only where it is ``me``'s own
    (or the reporter's), so that each rank's traceback is printed once, not once per rank."""
    if me in ranks or reporter in ranks or TRACEBACK not in text:
        return text
    head = text[:text.index(TRACEBACK)].rstrip()
    return f"{head} (its traceback is in {rank_list(ranks)}'s report)"


def assert_all_ranks(comm, ok, message=""):
    """Collective: :class:`CollectiveAssertionError` (an AssertionError) on every rank of ``comm`` if
    ``ok`` is False on any.  Ranks with the same report are named together and the report is given
    once: ``failed on every rank of 3 (the same report):``, or per group, ``ranks 0, 2: ...``."""
    verdicts = collectives.allgather_object(comm, (bool(ok), "" if ok else str(message)))
    failed = [r for r, (good, _) in enumerate(verdicts) if not good]
    if not failed:
        return
    size, me, reporter = comm.Get_size(), comm.Get_rank(), failed[0]
    groups = {}                                   # report -> the ranks that made it, in rank order
    for r in failed:
        groups.setdefault(verdicts[r][1], []).append(r)
    who = rank_list(failed, size)
    if len(groups) == 1:
        same = " (the same report)" if len(failed) > 1 else ""
        raise CollectiveAssertionError(f"failed on {who} of {size}{same}:\n{verdicts[reporter][1]}", reporter)
    text = "\n".join(f"{rank_list(ranks)}: {_shown(t, ranks, me, reporter)}" for t, ranks in groups.items())
    raise CollectiveAssertionError(f"failed on {who} of {size}:\n{text}", reporter)


def collective_assert_close(comm, actual, expected, **kwargs):
    """assert_close on every rank, reported on every rank (see assert_all_ranks)."""
    try:
        msg = close_message(actual, expected, **kwargs)
    except Exception as exc:  # a crash in the comparison must not desynchronise ranks
        caught(exc)
        msg = f"comparison raised {exc!r}"
    assert_all_ranks(comm, msg is None, msg)
