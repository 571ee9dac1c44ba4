"""``refconv diagnose DIR``: the first call where the ranks of a hung or failed job differ.

    refconv diagnose refconv-calls            # the folder the ranks wrote their call records to
    refconv diagnose DIR --trace t.json       # and the calls around it as a Chrome trace (Perfetto)

It reads every rank's record (``calls.<run>.rank<R>.json``, :mod:`refconv.collectives.flight`),
names the first divergence (:mod:`refconv.collectives.divergence`) with each rank's call and
line, says where each rank was at the end and which ranks left no record.  Files it cannot read
are named with the reason; it never raises a traceback.  Exit status: 0 no divergence, 1 a
divergence (or an analysis that failed), 2 nothing readable.  One process: run it without mpiexec.
"""

import collections
import glob
import os
import sys
import time

from refconv import overlap
from refconv.collectives import divergence, flight

NAME = "diagnose"
HELP = "name the first call where the ranks of a hung MPI job differ, from their call records"
DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p):
    p.add_argument("dir", help="the folder of the ranks' call records (REFCONV_RECORD_DIR, default ./refconv-calls)")
    p.add_argument("--trace", default=None, help="where the Chrome trace goes (default DIR/diagnose.trace.json)")
    p.add_argument("--window", type=int, default=20, help="calls per rank on each side of the divergence in the trace")


def run(args, out=None):
    out = out or sys.stdout

    def say(text=""):
        out.write(text + "\n")
    try:
        return _run(args, say)
    except Exception as exc:    # a bug of the analysis, or a record it did not foresee: one line, no traceback
        say(f"refconv diagnose: could not analyse {args.dir}: {type(exc).__name__}: {exc}")
        return 1


def _run(args, say):
    if not os.path.isdir(args.dir):
        say(f"refconv diagnose: {args.dir} is not a folder (give the folder of the ranks' call records)")
        return 2
    paths = sorted(p for p in glob.glob(os.path.join(args.dir, "calls.*.json")) if ".tmp." not in p)
    records, notes = [], []
    for path in paths:
        try:
            records.append(flight.load(path))
        except flight.LoadError as exc:
            notes.append(f"could not read {os.path.basename(path)}: {exc}")
    if not records:
        say(f"refconv diagnose: no readable call record in {args.dir}" + ("" if paths else " (no calls.*.json)"))
        for note in notes:
            say(f"  {note}")
        return 2
    by_rank, stale = divergence.group_runs(records)
    sizes = collections.Counter(r["world_size"] for r in by_rank.values())
    world_size = sizes.most_common(1)[0][0]
    if len(sizes) > 1:
        notes.append("world sizes disagree: " + ", ".join(f"rank {r}: {rec['world_size']}"
                                                          for r, rec in sorted(by_rank.items())))
    for run_name, rs in stale:
        notes.append(f"{len(rs)} file(s) of another run ({run_name}), left out: " +
                     ", ".join(f"rank {r['rank']}" for r in sorted(rs, key=lambda r: r["rank"])))
    analysis = divergence.Analysis(by_rank, world_size)
    run_id = next(iter(by_rank.values()))["run"]
    written = time.strftime("%H:%M:%S", time.localtime(max(r["written"] for r in by_rank.values())))
    say(f"refconv diagnose: {len(by_rank)} of {world_size} ranks' records in {args.dir} "
        f"(run {run_id}, written {written})")
    for note in notes:
        say(f"  {note}")
    for rank in analysis.missing:
        say(f"  rank {rank} left no record (killed before it wrote, or wrote elsewhere)")
    if analysis.findings:
        _, title, lines = analysis.findings[0]
        say(f"first divergence: {title}")
        for line in lines:
            say(f"  {line}")
        for _, title, lines in analysis.findings[1:]:
            say(f"also: {title}")
            for line in lines:
                say(f"  {line}")
    else:
        say("no divergence: the ranks made the same calls (a correct run, stopped; or a hang outside refconv)")
    say("where each rank was at the end:")
    for line in analysis.where():
        say(f"  {line}")
    trace = args.trace or os.path.join(args.dir, "diagnose.trace.json")
    try:
        overlap.write_chrome_trace(trace, divergence.trace_tracks(analysis, args.window), "refconv diagnose")
        say(f"trace: {trace} (open in ui.perfetto.dev)")
    except OSError as exc:
        say(f"trace: not written ({exc.strerror or exc})")
    return 1 if analysis.findings else 0
