"""The first call where the ranks differ, from every rank's call record (refconv.collectives.flight).

Pure functions from loaded records (``flight.load``) to findings; ``refconv diagnose`` prints them.

1. **Collectives that differ.**  MPI matches the n-th collective on a communicator with the n-th on
   every member, so entries with the same ``seq`` must agree in call, root and bytes.
2. **Who is stuck: a fixed point.**  A rank waiting in a collective waits for the members that have
   not made it; one waiting for a message waits for the sender that has not sent it.  Every waiting
   rank starts stuck; a rank that waits for a running rank (or a rank whose own wait is for nobody)
   might still go on, and is taken out, until nothing changes.
3. **Messages** are paired by stream (communicator, source, destination, tag), the i-th send with the
   i-th receive.  A stuck rank's receive with no send names the sender's sends that went elsewhere.
4. **Missing calls.**  A stuck collective that a member, itself stuck elsewhere or exited, never made.

Of the findings the one that began first in time is the first divergence, but an effect follows its cause:
a collective that a rank never made because that rank waits for a message that never came (finding 3) is
ordered after the message's finding, whichever began first by the clock.  (Ranks start apart: under load a
rank that starts late sends its stray message after the others already wait in the next collective.)  Ranks
one call apart, and messages still in flight, are a correct run interrupted: "no divergence".
"""

import collections
import os

RUN_SLACK_S = 5.0   # a "local" record written this long before its group's latest start is an earlier job's


def group_runs(records):
    """(the records of the newest run, [(run, [records]) of the others])."""
    runs = collections.defaultdict(list)
    for r in records:
        runs[r["run"]].append(r)
    stale = []
    local = runs.get("local")
    if local:
        latest = max(r["started"] for r in local)
        fresh = [r for r in local if r["written"] >= latest - RUN_SLACK_S]
        old = [r for r in local if r["written"] < latest - RUN_SLACK_S]
        runs["local"] = fresh
        if old:
            stale.append(("local (an earlier job)", old))
    newest = max(runs, key=lambda run: max((r["written"] for r in runs[run]), default=0))
    stale += [(run, rs) for run, rs in runs.items() if run != newest and rs]
    chosen = runs[newest]
    by_rank = {}
    for r in sorted(chosen, key=lambda r: r["written"]):
        by_rank[r["rank"]] = r      # the latest of a rank's files
    return by_rank, stale


def comm_key(comm):
    return (comm["name"], tuple(comm["ranks"]), comm["instance"])


def comm_label(comm):
    return f"{comm['name']!r}"


def site(call):
    where = f"{os.path.basename(call['site'] or '?')}:{call['line']}"
    if call.get("user_site") and call["user_site"] != call["site"]:
        where += f" (from {os.path.basename(call['user_site'])}:{call['user_line']})"
    return where


def describe(call):
    seq = f" #{call['seq']}" if call["seq"] is not None else ""
    return f"{call['kind']}{seq} ({call['call']}) on {comm_label(call['comm'])}"


class Analysis:
    """Every rank's record (``by_rank``: world rank -> loaded record) analysed; see the module."""

    def __init__(self, by_rank, world_size):
        self.by_rank, self.world_size = by_rank, world_size
        self.missing = sorted(set(range(world_size)) - set(by_rank))
        self.collectives = collections.defaultdict(dict)   # comm key -> rank -> seq -> call
        self.last_seq = collections.defaultdict(dict)      # comm key -> rank -> highest seq recorded
        self.first_seq = collections.defaultdict(dict)
        for rank, rec in by_rank.items():
            for c in rec["calls"]:
                if c["seq"] is not None:
                    key = comm_key(c["comm"])
                    self.collectives[key].setdefault(rank, {})[c["seq"]] = c
                    self.last_seq[key][rank] = max(self.last_seq[key].get(rank, -1), c["seq"])
                    self.first_seq[key][rank] = min(self.first_seq[key].get(rank, c["seq"]), c["seq"])
        self._pair_messages()
        self.pending = {rank: (rec["calls"][rec["waiting"]] if rec.get("waiting") is not None else None)
                        for rank, rec in by_rank.items()}
        self.stuck = self._stuck()
        mismatches = self._mismatches()
        unmatched = self._unmatched()      # first: it fills self.message_waits, which _absent reads
        self.findings = sorted(mismatches + unmatched + self._absent(), key=lambda f: f[0])

    # -- messages -------------------------------------------------------------------------------------
    def _pair_messages(self):
        sends, recvs = collections.defaultdict(list), collections.defaultdict(list)
        for rank, rec in self.by_rank.items():
            for c in rec["calls"]:
                if c["peers"] is None:
                    continue
                ranks = c["comm"]["ranks"]
                tag, to, frm = c["peers"]
                for dst, nbytes in to:
                    sends[(comm_key(c["comm"]), rank, ranks[dst], tag)].append((c, nbytes))
                for src, nbytes in frm:
                    recvs[(comm_key(c["comm"]), ranks[src], rank, tag)].append((c, nbytes))
        self.unmatched_sends, self.unmatched_recvs, self.size_mismatch = [], [], []
        for stream in set(sends) | set(recvs):
            s, r = sends.get(stream, []), recvs.get(stream, [])
            for (sc, sb), (rc, rb) in zip(s, r):
                if sb != rb:
                    self.size_mismatch.append((stream, sc, sb, rc, rb))
            self.unmatched_sends += [(stream, c, b) for c, b in s[len(r):]]
            self.unmatched_recvs += [(stream, c, b) for c, b in r[len(s):]]

    def _waits_for(self, rank):
        call = self.pending.get(rank)
        if call is None:
            return set()
        if call["seq"] is not None:
            key = comm_key(call["comm"])
            return {m for m in call["comm"]["ranks"] if m != rank and
                    (m not in self.by_rank or self.last_seq[key].get(m, -1) < call["seq"])}
        return {stream[1] for stream, c, _ in self.unmatched_recvs if c is call} | \
               {stream[2] for stream, c, _ in self.unmatched_sends if c is call}

    def _stuck(self):
        stuck = {rank for rank, call in self.pending.items() if call is not None}
        changed = True
        while changed:
            changed = False
            for rank in sorted(stuck):
                waits = self._waits_for(rank)
                gone = {m for m in waits if m in self.missing or m in stuck or self.exited(m)}
                if not waits or waits - gone:
                    stuck.discard(rank)
                    changed = True
        return stuck

    def exited(self, rank):
        return rank in self.by_rank and self.by_rank[rank]["reason"] == "exit" and self.pending.get(rank) is None

    # -- findings: (time, title, [lines]) ------------------------------------------------------------
    def _mismatches(self):
        found = []
        for key, ranks in self.collectives.items():
            seqs = collections.Counter(s for calls in ranks.values() for s in calls)
            for seq in sorted(s for s, n in seqs.items() if n > 1):
                calls = {rank: calls[seq] for rank, calls in ranks.items() if seq in calls}
                groups = collections.defaultdict(list)
                for rank, c in sorted(calls.items()):
                    groups[(c["kind"], c["call"], c["root"], c["bytes"])].append(rank)
                if len(groups) == 1 or not self._really_differ(list(groups)):
                    continue
                lines = []
                for (kind, call, root, nbytes), members in sorted(groups.items(), key=lambda g: -len(g[1])):
                    c = calls[members[0]]
                    what = f"{call}" + (f" root {root}" if root is not None else "") + \
                           (f" {nbytes} B" if nbytes is not None else "")
                    lines.append(f"{_ranks(members)} {what} at {', '.join(sorted({site(calls[m]) for m in members}))}")
                first = calls[min(calls)]
                found.append((min(c["begin"] for c in calls.values()),
                              f"call #{seq} on {comm_label(first['comm'])} differs between ranks", lines))
        return found

    @staticmethod
    def _really_differ(keys):
        """Kinds or calls differ, or roots both given differ, or bytes both given differ."""
        for a in keys:
            for b in keys:
                if a[0] != b[0] or a[1] != b[1] or (a[2] is not None and b[2] is not None and a[2] != b[2]) or \
                        (a[3] is not None and b[3] is not None and a[3] != b[3]):
                    return True
        return False

    def _unmatched(self):
        found = []
        self.message_waits = {}     # rank -> the time of the finding of the message it waits for in vain
        for stream, c, nbytes in self.unmatched_recvs:
            _, src, dst, tag = stream
            if dst not in self.stuck or self.pending.get(dst) is not c or src in self.by_rank and \
                    src not in self.stuck and not self.exited(src):
                continue
            lines = [f"rank {dst} waits at {site(c)} for a message from rank {src} (tag {tag}) that never came"]
            times = [c["begin"]]
            for (_, s, d, t), sc, sb in self.unmatched_sends:
                if s == src and d != dst:
                    lines.insert(0, f"rank {src} sent to rank {d} (tag {t}, {sb} B) at {site(sc)}, and rank {d} "
                                    f"posted no receive from rank {src}")
                    times.append(sc["begin"])
            if src not in self.by_rank:
                lines.append(f"rank {src} left no record")
            title = "a message sent to a rank that never receives it" if len(lines) > 1 else \
                "a receive with no matching send"
            found.append((min(times), title, lines))
            self.message_waits[dst] = min(times)
        for stream, c, nbytes in self.unmatched_sends:
            _, src, dst, tag = stream
            if src in self.stuck and self.pending.get(src) is c and (dst in self.stuck or self.exited(dst)):
                found.append((c["begin"], "a send with no matching receive",
                              [f"rank {src} waits at {site(c)} to send to rank {dst} (tag {tag}, {nbytes} B), "
                               f"and rank {dst} posted no receive from it"]))
        for (key, src, dst, tag), sc, sb, rc, rb in self.size_mismatch:
            found.append((sc["begin"], "a message whose sizes differ",
                          [f"rank {src} sent {sb} B at {site(sc)}; rank {dst} expected {rb} B at {site(rc)}"]))
        return found

    def _absent(self):
        found = []
        for rank in sorted(self.stuck):
            call = self.pending[rank]
            if call["seq"] is None:
                continue
            key = comm_key(call["comm"])
            for m in sorted(self._waits_for(rank)):
                if m in self.missing:
                    line = f"rank {m} left no record"
                elif self.first_seq[key].get(m, 0) > call["seq"] or self.by_rank[m]["dropped"] and \
                        m not in self.last_seq[key]:
                    line = f"rank {m}'s record does not reach back that far: set REFCONV_RECORD_CALLS higher"
                else:
                    line = self._where_now(m)
                began = call["begin"]
                if m in self.message_waits:      # m never came because it waits for a message: after that finding
                    began = max(began, self.message_waits[m] + 1e-6)
                found.append((began, f"a collective that a rank never made",
                              [f"rank {m} made no call #{call['seq']} on {comm_label(call['comm'])} (rank {rank} "
                               f"waits there in {call['call']} at {site(call)}); {line}"]))
        merged = {}
        for t, title, lines in found:      # one finding per missing call, the earliest waiter's
            merged.setdefault(lines[0].split(" (rank ")[0], (t, title, lines))
        return list(merged.values())

    def _where_now(self, m):
        rec, call = self.by_rank[m], self.pending.get(m)
        if call is not None:
            return f"rank {m} waits in {describe(call)} at {site(call)}"
        last = rec["calls"][-1] if rec["calls"] else None
        verb = "exited" if rec["reason"] == "exit" else f"was running ({rec['reason']})"
        return f"rank {m} {verb}" + (f" after {describe(last)} at {site(last)}" if last else " before any call")

    # -- where each rank was ----------------------------------------------------------------------------
    def where(self):
        """One line per rank: where it was when it wrote its record."""
        out = []
        for rank in range(self.world_size):
            if rank in self.missing:
                out.append(f"rank {rank}  left no record (killed before it wrote, or wrote elsewhere)")
                continue
            rec, call = self.by_rank[rank], self.pending.get(rank)
            if call is not None:
                out.append(f"rank {rank}  waiting {rec['waited_s'] or 0:.1f} s in {describe(call)} at {site(call)}"
                           f"  [{rec['reason']}]")
            else:
                out.append(self._where_now(rank).replace(f"rank {rank} ", f"rank {rank}  ", 1) + f"  [{rec['reason']}]")
        return out


def _ranks(members):
    return ("rank " if len(members) == 1 else "ranks ") + ",".join(str(m) for m in members)


def trace_tracks(analysis, window=20):
    """Chrome-trace tracks (``overlap.write_chrome_trace``): per rank its calls around the first
    divergence (``window`` before and after), or its last 2 * window calls when there is none."""
    t0 = min((c["begin"] for rec in analysis.by_rank.values() for c in rec["calls"]), default=0.0)
    around = analysis.findings[0][0] if analysis.findings else None
    tracks = {}
    for rank, rec in sorted(analysis.by_rank.items()):
        calls = rec["calls"]
        if around is None:
            chosen = calls[-2 * window:]
        else:
            i = next((k for k, c in enumerate(calls) if c["begin"] >= around), len(calls))
            chosen = calls[max(0, i - window):i + window]
        tracks[f"rank {rank}"] = [
            {"name": f"{c['kind']}" + (f" #{c['seq']}" if c["seq"] is not None else ""),
             "start": c["begin"] - t0, "end": (c["end"] if c["end"] is not None else rec["written"]) - t0,
             "args": {"at": site(c), "call": c["call"], "comm": c["comm"]["name"], "bytes": c["bytes"],
                      "root": c["root"], "peers": c["peers"], "pending": c["end"] is None}} for c in chosen]
    return tracks
