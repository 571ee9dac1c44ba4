"""Exact counts of the calls made through :mod:`refconv.collectives` (``CommStats``; each rank's
is ``collectives.stats``, :mod:`refconv.collectives.local`).

Every wrapper adds one :class:`Record` (its kind, communicator size, elements and
bytes, and for a call started by an ``i...`` form what it overlaps) before it calls
MPI; ``refconv.cost_model`` and the layers' ``records()`` predict the same figures,
and ``refconv.testing.check_records`` compares them.
"""

import contextlib
import dataclasses


@dataclasses.dataclass(frozen=True)
class Record:
    kind: str        # one of KINDS
    comm_size: int
    elements: int
    bytes: int
    messages: int = 0  # "halo" and "alltoallv": the messages this rank sent to other ranks
    overlap: str = ""  # what the caller computed while the call was in flight ("": it waited at once)


# the kinds of record, one per wrapper of refconv.collectives.ops (exchange records "halo");
# the first five are what training moves data with, and what a machine file prices
KINDS = ("allreduce", "allgather", "reduce_scatter", "halo", "alltoallv", "bcast", "scatter", "gather")


class Region:
    """The records of one ``stats.recording()`` region."""

    def __init__(self):
        self.records = []
        self.seconds = {}  # kind -> seconds spent inside its MPI calls (the watchdog brackets each)

    def summary(self, *, moved_only=False):
        return summarize(self.records, moved_only)


def summarize(records, moved_only=False):
    """kind -> {"calls", "elements", "bytes"}; ``moved_only`` leaves out calls on
    one-rank communicators (recorded by definition, but nothing leaves the rank)."""
    out = {}
    for r in records:
        if moved_only and r.comm_size == 1:
            continue
        s = out.setdefault(r.kind, {"calls": 0, "elements": 0, "bytes": 0})
        s["calls"] += 1
        s["elements"] += r.elements
        s["bytes"] += r.bytes
    return out


def _merge(a, b):
    """The sum of two summaries (kind -> {"calls", "elements", "bytes"})."""
    out = {kind: dict(figures) for kind, figures in a.items()}
    for kind, figures in b.items():
        s = out.setdefault(kind, {"calls": 0, "elements": 0, "bytes": 0})
        for key, value in figures.items():
            s[key] += value
    return out


class CommStats:
    """Exact, deterministic counts of the calls made through refconv.collectives.

    ``records`` holds the most recent calls (at least ``RECENT``): older ones are folded
    into the totals that ``summary()`` adds up, so a long run's memory stays flat.
    """

    RECENT = 1_000

    def __init__(self):
        self.records = []
        self._regions = []
        self._timelines = []
        self._folded = ({}, {})         # the records let go of: (their summary, moved_only's)

    def reset(self):
        self.records.clear()
        self._folded = ({}, {})

    def add(self, kind, comm_size, elements, nbytes, messages=0, overlap=""):
        rec = Record(kind, int(comm_size), int(elements), int(nbytes), int(messages), str(overlap))
        self.records.append(rec)
        for region in self._regions:
            region.records.append(rec)
        if len(self.records) >= 2 * self.RECENT:
            self._fold(len(self.records) - self.RECENT)

    def _fold(self, n):
        """Replace the oldest ``n`` records by their two summaries."""
        old = self.records[:n]
        del self.records[:n]
        self._folded = tuple(_merge(folded, summarize(old, moved))
                             for folded, moved in zip(self._folded, (False, True)))

    def summary(self, *, moved_only=False):
        """kind -> {"calls", "elements", "bytes"} over all records since reset()."""
        return _merge(self._folded[moved_only], summarize(self.records, moved_only))

    def add_event(self, kind, overlap, started, waited, ended):
        """One MPI call's times (the rank's clock, ``local.now()``: ``time.perf_counter`` but on priced
        simulated ranks): started, waited for from ``waited`` (the
        same as started for a blocking call), finished at ``ended``; kept by open timelines."""
        for events in self._timelines:
            events.append({"kind": kind, "overlap": overlap, "started": started, "waited": waited, "ended": ended})

    @contextlib.contextmanager
    def timeline(self):
        """``with stats.timeline() as events: ...``: the times of every MPI call made inside, in
        the order they finished (``add_event``'s dicts), for a per-rank timeline."""
        events = []
        self._timelines.append(events)
        try:
            yield events
        finally:
            self._timelines.remove(events)

    def add_seconds(self, kind, seconds):
        """Time one MPI call of ``kind`` took, added to every open region."""
        for region in self._regions:
            region.seconds[kind] = region.seconds.get(kind, 0.0) + seconds

    @contextlib.contextmanager
    def recording(self):
        """``with stats.recording() as region: ...`` then ``region.summary()``."""
        region = Region()
        self._regions.append(region)
        try:
            yield region
        finally:
            self._regions.remove(region)

