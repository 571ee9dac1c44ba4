"""``refconv simulate``: bad input refused with one line and status 2 before anything runs; a small
run's tables (with values: ``--backend numpy``); a trace file whole and readable; ``--compare``."""

import json
import re

import pytest

from refconv import cli, simulated
from refconv.testing.commands import only_line, run_command

SMALL = ("--model", "digits-cnn", "--batch", "8", "--image-size", "16", "--backend", "numpy")


def refused(capsys, monkeypatch, *argv):
    """The one error line of a refused command line, which must end before any rank runs."""
    def no_run(*args, **kwargs):
        raise AssertionError("the simulated ranks ran for a refused command line")
    monkeypatch.setattr(simulated, "run", no_run)
    status, out, err = run_command(capsys, "simulate", *argv)
    assert status == 2, (status, out, err)
    return only_line(err)


@pytest.fixture
def planned_for_4(tmp_path, capsys):
    path = tmp_path / "planned.yaml"
    status, _, err = run_command(capsys, "plan", "--model", "digits-cnn", "--ranks", "4", "--batch", "8",
                                 "--image-size", "16", "--out", str(path))
    assert status == 0, err
    return str(path)


def test_more_ranks_than_the_cap_is_refused(capsys, monkeypatch):
    line = refused(capsys, monkeypatch, *SMALL, "--ranks", str(simulated.MAX_RANKS + 1))
    assert line == (f"refconv simulate: error: --ranks: expected 1 to {simulated.MAX_RANKS} simulated ranks "
                    f"(refconv.simulated.MAX_RANKS), got {simulated.MAX_RANKS + 1}")


def test_a_grid_that_does_not_multiply_to_the_ranks_is_refused(capsys, monkeypatch):
    line = refused(capsys, monkeypatch, *SMALL, "--ranks", "8", "--grid", "sample=2,channel=2")
    assert line == "refconv simulate: error: --grid: sample=2,channel=2 multiplies to 4 ranks, not --ranks 8"


def test_a_file_planned_for_another_rank_count_is_refused(capsys, monkeypatch, planned_for_4):
    line = refused(capsys, monkeypatch, "--model", planned_for_4, "--ranks", "2", "--backend", "numpy")
    assert line.startswith(f"refconv simulate: error: --model: {planned_for_4} was planned for 4 ranks, "
                           f"not --ranks 2"), line


def test_a_plan_above_the_memory_per_rank_is_refused(capsys, monkeypatch):
    line = refused(capsys, monkeypatch, *SMALL, "--ranks", "2", "--grid", "sample=2", "--memory-per-rank", "1e-6")
    assert line.startswith("refconv simulate: error: --memory-per-rank: the plan needs ") and \
        line.endswith("GiB per rank (refconv plan's figure), above 1e-06 GiB"), line


def test_trace_ranks_outside_the_world_are_refused(capsys, monkeypatch, tmp_path):
    line = refused(capsys, monkeypatch, *SMALL, "--ranks", "2", "--trace", str(tmp_path / "t.json"),
                   "--trace-ranks", "0,2")
    assert line == "refconv simulate: error: --trace-ranks: expected ranks 0 to 1, got '0,2'"


def _table(out, heading):
    """The rows under the line that starts with ``heading``: {first word: [its decimal numbers]}."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = {}
    for line in lines[at + 2:]:
        if not line.startswith("  "):
            break
        words = line.split()
        rows[words[0]] = [float(w) for w in words[1:] if re.fullmatch(r"-?\d+\.\d+", w)]
    return rows


def test_a_small_run_prints_its_steps_layers_and_memory(capsys):
    status, out, err = run_command(capsys, "simulate", *SMALL, "--ranks", "4", "--grid", "sample=2,channel=2",
                                   "--steps", "3")
    assert status == 0, err
    steps = _table(out, "step:")   # clock ms, plan ms, clock/plan (and the seconds it took here)
    assert list(steps) == ["1", "2", "3", "2-3"]      # "1 (binds the model)"; "2-3 (mean)"
    clock, plan, ratio = steps["2"][:3]
    assert steps["3"][0] == clock > 0                  # the same step twice on a logical clock: the same time
    assert ratio == pytest.approx(clock / plan, abs=0.01)
    layers = _table(out, "per layer")   # compute, exposed, hidden (ms), calls, MiB
    assert list(layers)[:3] == ["0", "1", "2"] and list(layers)[-2:] == ["(between-layers)", "total"]
    assert "DistConv2d" in out and "BatchNorm2d" in out
    for column in range(5):   # the layers and the rest add up to the step: nothing counted twice or lost
        parts = sum(row[column] for name, row in layers.items() if name != "total")
        assert parts == pytest.approx(layers["total"][column], abs=2e-3 * len(layers)), column
    compute, exposed = layers["total"][:2]
    assert compute + exposed == pytest.approx(clock, abs=2e-3)
    assert layers["0"][3] > 0 and layers["total"][4] > 0  # a convolution on channel=2 makes calls; they carry bytes
    assert "memory: not tracked with backend numpy" in out


def test_the_trace_is_whole_and_names_its_ranks(capsys, tmp_path):
    path = tmp_path / "run.json"
    status, out, err = run_command(capsys, "simulate", *SMALL, "--ranks", "4", "--grid", "channel=4",
                                   "--steps", "2", "--trace", str(path), "--trace-ranks", "1,3")
    assert status == 0, err
    trace = json.loads(path.read_text())
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    ranks = [name.split(" calls")[0] for name in names.values()]
    assert list(dict.fromkeys(ranks)) == ["rank 1", "rank 3", "all 4 ranks: mean per layer"], names
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for tid in names:   # a track's spans never overlap (calls in flight together go to tracks of their own)
        track = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        assert all(end <= start + 1e-6 for (_, end), (start, _) in zip(track, track[1:])), names[tid]
    assert {e["args"]["step"] for e in spans if "step" in e["args"]} == {1, 2}
    assert any(e["name"] == "allgather" or e["name"] == "allreduce" for e in spans)
    assert (tmp_path / "run.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.png"]   # no temporary left


def test_compare_sets_sample_parallelism_beside_the_plan(capsys):
    status, out, err = run_command(capsys, "simulate", *SMALL, "--ranks", "2", "--grid", "channel=2",
                                   "--steps", "2", "--compare")
    assert status == 0, err
    lines = out[out.index("compare:"):].splitlines()
    assert lines[1].split()[0] == "sample" and lines[2].split()[0] == "plan", lines
    assert lines[3].startswith("  speedup of the plan over sample parallelism: clock "), lines


def test_compare_says_when_sample_parallelism_cannot_run(capsys):
    status, out, err = run_command(capsys, "simulate", "--model", "digits-cnn", "--batch", "2", "--image-size", "8",
                                   "--backend", "numpy", "--ranks", "4", "--plan", "--steps", "1",
                                   "--compare")
    assert status == 0, err
    assert "  sample parallelism: cannot run (4 ranks, batch 2)" in out


def test_the_command_is_registered():
    assert ("simulate", "refconv.commands.simulate") in cli.COMMANDS
