"""refconv.overlap: what overlap hid, from the collectives' event times (pure: any clock), and
its timeline figure.  The figures of a real run: tests/training/test_training_truth.py."""

import json
import pathlib

import pytest

from refconv import overlap
from refconv.bench.overlap import draw_timeline as bench_draw_timeline
from refconv.testing.commands import only_line, run_command


def _event(kind, started, waited, ended, overlap="backward"):
    return {"kind": kind, "overlap": overlap, "started": started, "waited": waited, "ended": ended}


def test_hidden_is_in_flight_minus_waited_per_kind_and_in_total():
    events = [_event("allreduce", 0.0, 3.0, 4.0),      # in flight 4, waited 1: 3 hidden
              _event("halo", 1.0, 1.0, 2.5),           # blocking: started == waited, nothing hidden
              _event("allreduce", 2.0, 5.0, 5.0),      # finished while polled: all 3 hidden
              _event("allreduce", 6.0, 5.5, 7.0),      # waited "before" it started (another clock): clamped
              _event("allreduce", 8.0, 8.1, 9.0, "")]  # waited at once by its caller: the gap is no compute
    got = overlap.hidden_by_kind(events)
    assert list(got) == ["allreduce", "halo", "total"]
    assert got["allreduce"] == {"calls": 4, "in_flight": 9.0, "waited": 3.0, "hidden": 6.0}
    assert got["halo"] == {"calls": 1, "in_flight": 1.5, "waited": 1.5, "hidden": 0.0}
    assert got["total"] == {"calls": 5, "in_flight": 10.5, "waited": 4.5, "hidden": 6.0}
    assert overlap.hidden_by_kind([]) == {"total": {"calls": 0, "in_flight": 0.0, "waited": 0.0, "hidden": 0.0}}


def test_blocking_calls_hide_nothing_and_sums_add_up():
    blocking = [_event(k, t, t, t + 0.5) for t, k in enumerate(["allgather", "reduce_scatter", "allreduce"])]
    got = overlap.hidden_by_kind(blocking)
    assert all(s["hidden"] == 0.0 for s in got.values()) and got["total"]["waited"] == 1.5
    totals = overlap.add(overlap.add({}, got), overlap.hidden_by_kind([_event("allreduce", 0, 1, 2)]))
    assert list(totals)[-1] == "total" and totals["allreduce"] == {"calls": 2, "in_flight": 2.5, "waited": 1.5,
                                                                    "hidden": 1.0}
    mean = overlap.mean_over_ranks([got, {"total": overlap.hidden_by_kind([])["total"]}])
    assert mean["allgather"]["waited"] == 0.25 and mean["total"]["calls"] == 1.5


def test_the_summary_says_what_was_hidden_and_the_prediction_beside_it():
    per_rank = [overlap.hidden_by_kind([_event("allreduce", 0.0, 0.003, 0.004)])] * 2
    lines = overlap.summary_lines(per_rank, steps=2, predicted="refconv plan (...): 12% of it hidden")
    assert lines[1] == "  allreduce: 0.5 calls, 2.000 ms in flight, 0.500 ms waited, 1.500 ms hidden (75% of its " \
                       "time in flight)", lines
    assert lines[-1] == "  predicted: refconv plan (...): 12% of it hidden"


def test_the_timeline_legend_lists_only_the_kinds_that_occur(tmp_path):
    ranks = [{"step 2": {"seconds": 0.01, "calls": [_event("allreduce", 0.0, 0.004, 0.005),
                                                     _event("halo", 0.005, 0.005, 0.006)]}},
             {"step 2": {"seconds": 0.01, "calls": [_event("allreduce", 0.0, 0.002, 0.005)]}}]
    png = overlap.write_timeline(str(tmp_path / "t.json"), ranks, "two kinds")
    assert json.loads((tmp_path / "t.json").read_text())["ranks"] == ranks
    assert (tmp_path / "t.png").stat().st_size > 0 and png == str(tmp_path / "t.png")
    assert overlap.draw_timeline(ranks, "two kinds", str(tmp_path / "u.png")) == ["allreduce", "halo"]
    assert bench_draw_timeline is overlap.draw_timeline     # refconv.bench.overlap's name still imports


@pytest.mark.parametrize("path, message", [
    ("missing/t.json", "does not exist; create it"),
    ("t.png", "expected a .json path (the .png is drawn beside it)")])
def test_a_timeline_path_that_cannot_be_written_is_refused(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^timeline: ") as caught:
        overlap.check_timeline_path(path)
    assert message in str(caught.value)


def test_bench_overlap_is_a_subcommand_of_refconv_bench(capsys):
    """``refconv bench overlap`` (also ``python -m refconv.bench.overlap``): its own flags, and
    bad ones refused with one line before any MPI call, as every refconv command does."""
    status, out, _ = run_command(capsys, "bench", "--help")
    assert status == 0 and "overlap" in out
    status, out, _ = run_command(capsys, "bench", "overlap", "--help")
    assert status == 0 and "{progress,step,halo,buckets}" in out and "--timeline" in out
    for args, line in ((["step", "--rounds", "0"], "--rounds: expected an int >= 1, got 0"),
                       (["step", "--timeline", "t.png"], "--timeline: expected a .json path")):
        status, _, err = run_command(capsys, "bench", "overlap", *args)
        assert status == 2 and only_line(err).startswith(f"refconv bench overlap: error: {line}"), err


def test_a_chrome_trace_has_one_track_per_entry_in_microseconds_and_is_whole_or_absent(tmp_path):
    tracks = {"rank 0": [{"name": "allreduce", "start": 0.001, "end": 0.0035, "args": {"bytes": 8}}],
              "rank 5": [{"name": "halo", "start": 0.002, "end": 0.002}]}
    path = overlap.write_chrome_trace(str(tmp_path / "t.json"), tracks, title="two ranks")
    events = json.loads(pathlib.Path(path).read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {0: "rank 0", 1: "rank 5"}
    spans = [e for e in events if e["ph"] == "X"]
    assert [(e["tid"], e["name"], e["ts"], e["dur"], e["args"]) for e in spans] == \
        [(0, "allreduce", pytest.approx(1000.0), pytest.approx(2500.0), {"bytes": 8}), (1, "halo", 2000.0, 0.0, {})]
    bad = {"rank 0": [{"name": "x", "start": 0.0, "end": 1.0, "args": {"not json": object()}}]}
    with pytest.raises(TypeError):
        overlap.write_chrome_trace(str(tmp_path / "bad.json"), bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]      # no half-written file, no temporary
