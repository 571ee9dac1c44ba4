"""scripts/preset_sweep.py, issue 39's hunt for scale bugs (every preset, one shapes-only step under its plan
at 16 to 1024 ranks), at one small configuration: a row that ran, a row whose process died without one, and
the table re-read from the rows written."""

import json
import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sweep():
    return runpy.run_path(str(ROOT / "scripts" / "preset_sweep.py"), run_name="preset_sweep")


def test_a_row_that_ran_a_row_refused_and_the_table_of_the_rows_written(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    assert sweep()["main"](["--ranks", "4", "2000", "--models", "digits-cnn", "--jsonl", str(rows)]) == 0
    ran, refused = (json.loads(line) for line in rows.read_text().splitlines())
    assert (ran["model"], ran["ranks"], ran["batch"], ran["image"]) == ("digits-cnn", 4, 512, 32)
    figures = ran["ran"]
    assert figures["step"] > 0 and figures["predicted"] > 0 and figures["calls"] > 0
    assert 0.8 < figures["memory_measured"] / figures["memory_planned"] < 1.2    # shapes-only: measured
    # 2000 ranks: the command refuses above the simulator's cap, in its own words
    assert refused["ranks"] == 2000 and "expected 1 to 1024 simulated ranks" in refused["refused"], refused
    printed = capsys.readouterr().out
    assert sweep()["main"](["--table", str(rows)]) == 0
    assert capsys.readouterr().out == printed
    assert "| digits-cnn | 4 | 512, 32 | ran |" in printed and "| digits-cnn | 2000 | 512, 32 | refused: --ranks:" in printed


def test_a_failed_row_is_marked_with_its_error():
    row = {"model": "resnet50", "ranks": 256, "batch": 512, "image": 224, "failed": "KeyError: 7", "cpu_s": 3.0}
    assert "| resnet50 | 256 | 512, 224 | **failed**: KeyError: 7 |" in sweep()["table"]([row])
