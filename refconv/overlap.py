"""What overlap hid, measured: the times of each MPI call, summed per kind of collective.

:func:`refconv.collectives.stats.timeline` gives one event per call (``perf_counter``
seconds)::

    {"kind": "allreduce", "overlap": "backward of layer 3",
     "started": t0,      # the call was started (an i... call returns at once)
     "waited": t1,       # the rank began to wait for it (t0 for a blocking call)
     "ended": t2}        # it finished

    in flight = ended - started        the call's whole life
    waited    = ended - waited         the part the rank stood still for it
    hidden    = in flight - waited     the part the rank computed through (>= 0 per call)

A blocking call hides nothing: its start is its wait.  Nor does a call whose ``overlap`` is
empty, which its caller waits for at once (``--no-overlap``'s gradient buckets start an
``iallreduce`` and wait the next line): the microseconds of Python between its start and its
wait are bookkeeping, not compute, and count as waited.  A call finished while the rank polled
(``collectives.progress``) was waited for not at all: all of it hid.
:func:`hidden_by_kind` is pure: a simulated rank's logical clock can feed it events of
logical times.  ``refconv train`` sums it over the steps (the end-of-run summary and
``--metrics-out``), and ``--timeline FILE`` draws the calls of a few steps
(:func:`draw_timeline`).
"""

import json
import os

from refconv import checks

FIGURES = ("calls", "in_flight", "waited", "hidden")
COLOURS = {"allreduce": "tab:blue", "halo": "tab:green", "allgather": "tab:orange", "reduce_scatter": "tab:red",
           "alltoallv": "tab:purple", "bcast": "tab:brown", "scatter": "tab:pink", "gather": "tab:olive"}


def _zero():
    return {"calls": 0, "in_flight": 0.0, "waited": 0.0, "hidden": 0.0}


def hidden_by_kind(events):
    """``{kind: {"calls", "in_flight", "waited", "hidden"}, ..., "total": {...}}`` of ``events``
    (dicts with ``kind``, ``overlap``, ``started``, ``waited``, ``ended``), in seconds; ``hidden``
    is ``in_flight - waited`` clamped at 0 per call, and 0 for a call of empty ``overlap``.  The kinds in the order they first occur,
    ``"total"`` last (present with zeros when there are no events)."""
    out = {}
    for e in events:
        in_flight = max(e["ended"] - e["started"], 0.0)
        waited = min(max(e["ended"] - e["waited"], 0.0), in_flight) if e.get("overlap") else in_flight
        out.setdefault(e["kind"], _zero())
        for key in (e["kind"], "total"):
            s = out.setdefault(key, _zero())
            s["calls"] += 1
            s["in_flight"] += in_flight
            s["waited"] += waited
            s["hidden"] += in_flight - waited
    total = out.pop("total", _zero())
    out["total"] = total
    return out


def add(totals, summary):
    """Add ``summary`` (:func:`hidden_by_kind`'s) into ``totals`` in place; returns ``totals``."""
    for kind, figures in summary.items():
        s = totals.setdefault(kind, _zero())
        for key in FIGURES:
            s[key] += figures[key]
    if "total" in totals:
        totals["total"] = totals.pop("total")  # last
    return totals


def mean_over_ranks(per_rank):
    """The per-kind mean of several ranks' summaries (a kind missing on a rank counts as zeros)."""
    kinds = [k for summary in per_rank for k in summary]
    out = {k: _zero() for k in dict.fromkeys(k for k in kinds if k != "total")}
    out["total"] = _zero()
    for summary in per_rank:
        add(out, summary)
    return {k: {key: v / len(per_rank) for key, v in figures.items()} for k, figures in out.items()}


def summary_lines(per_rank, steps, predicted=None):
    """The end-of-run lines: per kind and in total, ms per step (mean over ranks) in flight,
    waited and hidden, and the share of the time in flight hidden; then the planner's
    ``predicted`` line, if any.  One phrase per figure, each with its unit, so that a page of
    docs/ can show it with the times elided (``scripts/doc_outputs.py``)."""
    lines = ["overlap per step and rank (mean over ranks), measured: hidden = in flight - waited"]
    for kind, s in mean_over_ranks(per_rank).items():
        share = f" ({s['hidden'] / s['in_flight']:.0%} of its time in flight)" if s["in_flight"] > 0 else ""
        lines.append(f"  {kind}: {s['calls'] / steps:.1f} calls, {s['in_flight'] / steps * 1e3:.3f} ms in flight, "
                     f"{s['waited'] / steps * 1e3:.3f} ms waited, {s['hidden'] / steps * 1e3:.3f} ms hidden{share}")
    if predicted:
        lines.append(f"  predicted: {predicted}")
    return lines


def check_timeline_path(path, name="timeline"):
    """``--timeline FILE``: a .json file whose folder exists (the PNG goes beside it), and
    matplotlib to draw it; a ValueError naming ``name`` otherwise (before any training)."""
    if not path.endswith(".json"):
        raise ValueError(f"{name}: expected a .json path (the .png is drawn beside it), got {path!r}")
    checks.output_file(path, name)
    checks.output_file(os.path.splitext(path)[0] + ".png", name)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"{name}: drawing the timeline needs matplotlib (pip install matplotlib)") from None
    return path


def relative(events, start):
    """``events`` with their times in seconds from ``start`` (what a timeline file holds)."""
    return [{**e, **{k: e[k] - start for k in ("started", "waited", "ended")}} for e in events]


def write_timeline(path, ranks, title):
    """Write ``{"title", "ranks"}`` to ``path`` (JSON) and draw it beside it (.png); returns the
    PNG's path.  ``ranks[r]`` maps a row's name (a step) to ``{"seconds", "calls"}``."""
    with open(path, "w") as f:
        json.dump({"title": title, "ranks": ranks}, f)
    figure = os.path.splitext(path)[0] + ".png"
    draw_timeline(ranks, title, figure)
    return figure


def draw_timeline(ranks, title, path, labels=None):
    """Per rank, one row per entry of ``ranks[r]`` (a contender, or a step): each call from its
    start to its end (light), the part the rank waited for it (dark), over the row's time
    (grey); a call finished while the rank computed has no dark part.  The legend lists the
    kinds of collective that occur, and only those; returns the legend's labels as drawn.  ``labels``
    names each entry of ``ranks`` (default ``rank 0``, ``rank 1``, ...: a subset's own numbers)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(ranks[0])
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * len(ranks) * len(names)))
    row, rows, seen = 0, [], []
    for r, steps in enumerate(ranks):
        for name in names:
            ax.barh(row, steps[name]["seconds"] * 1e3, color="0.9", height=0.8)
            for c in steps[name]["calls"]:
                colour = COLOURS.get(c["kind"], "0.5")
                if c["kind"] not in seen:
                    seen.append(c["kind"])
                ax.barh(row, (c["ended"] - c["started"]) * 1e3, left=c["started"] * 1e3, color=colour, alpha=0.35,
                        height=0.5)
                ax.barh(row, (c["ended"] - c["waited"]) * 1e3, left=c["waited"] * 1e3, color=colour, height=0.5)
            rows.append(f"{labels[r] if labels else f'rank {r}'} {name}")
            row += 1
    ax.set_yticks(range(row), rows)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the row's start (light: in flight; dark: the rank waits; grey: the step)")
    ax.set_title(title)
    legend = []
    if seen:
        handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS.get(kind, "0.5")) for kind in seen]
        box = ax.legend(handles, seen, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        legend = [text.get_text() for text in box.get_texts()]
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return legend


def chrome_trace(tracks, title=None):
    """The Chrome trace (JSON that Perfetto and chrome://tracing open) of ``tracks``: one track (a
    "thread" of process 0) per entry, in the order given.  ``tracks`` maps a track's name (``"rank 3"``)
    to its events, each a dict with ``name``, ``start`` and ``end`` in seconds and optional ``args``
    (a dict shown when the event is selected).  Times become microseconds, as the format wants."""
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": title or "refconv"}}]
    for tid, (track, spans) in enumerate(tracks.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": str(track)}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
        for e in spans:
            events.append({"ph": "X", "name": e["name"], "pid": 0, "tid": tid, "ts": e["start"] * 1e6,
                           "dur": max(e["end"] - e["start"], 0.0) * 1e6, "args": e.get("args", {})})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(path, tracks, title=None):
    """Write :func:`chrome_trace` of ``tracks`` to ``path`` atomically (a temporary file in the same
    folder, then renamed): the file is whole or absent, never half-written.  Returns ``path``."""
    trace = chrome_trace(tracks, title)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(trace, f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
