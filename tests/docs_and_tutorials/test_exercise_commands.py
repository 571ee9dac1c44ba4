"""The exercise commands (``python -m tutorials.exercises list | check | hint | reset``), run in-process on a
copy of tutorials/exercises/ in a temporary folder, so the checkout (and a learner's own files) is never
touched: the learner's file made from its skeleton, reset with a backup, hints one at a time, the status
that ``list`` shows, and one line for an exercise that does not exist."""

import datetime
import shutil

import pytest

from exercise_checks import CI, ROOT, planted, quiet
from tutorials.exercises import __main__ as command
from tutorials.exercises import harness, state


@pytest.fixture(autouse=True)
def _ci_profile(monkeypatch):
    monkeypatch.setenv("REFCONV_EXERCISES_PROFILE", CI)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A copy of tutorials/exercises/ that the commands work in: their ``harness.HERE``."""
    source, folder = ROOT / "tutorials" / "exercises", tmp_path / "exercises"
    learners = {p.name for p in source.glob("[0-9][0-9]_*.py")} | {".progress.json", ".backup"}

    def leave_out(where, names):  # the checkout's own learner files, if any, stay behind
        return {"__pycache__"} | (learners & set(names) if where == str(source) else set())
    shutil.copytree(source, folder, ignore=leave_out)
    monkeypatch.setattr(harness, "HERE", folder)
    return folder


def run(capsys, *argv):
    rc = command.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out


def test_reset_keeps_the_learners_file_and_says_where(course, capsys):
    yours = course / "05_stationary_x.py"
    rc, out = run(capsys, "reset", "5")
    assert rc == 0 and yours.read_text() == (course / "skeletons" / "05_stationary_x.py").read_text()
    assert not (course / ".backup").exists()  # nothing of the learner's to keep yet
    yours.write_text(yours.read_text() + "\n# my work\n")
    rc, out = run(capsys, "reset", "5")
    kept = list((course / ".backup").iterdir())
    assert rc == 0 and len(kept) == 1 and kept[0].read_text().endswith("# my work\n")
    assert out.strip() == ("exercise 5 is its skeleton again; your file is kept as "
                           f"tutorials/exercises/.backup/{kept[0].name}")
    assert "# my work" not in yours.read_text()
    rc, out = run(capsys, "reset", "5")  # already the skeleton: no second backup
    assert "is its skeleton already" in out and len(list((course / ".backup").iterdir())) == 1


def test_a_backup_never_overwrites_another(course):
    at = datetime.datetime(2026, 1, 2, 3, 4, 5)
    for k in range(2):
        (course / "03_halo_1d.py").write_text(f"# try {k}\n")
        state.reset(3, now=at)
    kept = sorted(p.name for p in (course / ".backup").iterdir())
    assert kept == ["03_halo_1d-20260102-030405-2.py", "03_halo_1d-20260102-030405.py"]


def test_hints_come_one_at_a_time(course, capsys):
    every = state.hints(5)
    assert len(every) == 3 and every[0].startswith("The local convolution of")
    said = [run(capsys, "hint", "5")[1].strip() for _ in range(len(every) + 1)]
    assert said[:3] == [f"hint {k} of 3: {h}" for k, h in enumerate(every, 1)]
    assert said[3] == ("no more hints for exercise 5 (3 given); the reference solution is "
                       "tutorials/exercises/solutions/05_stationary_x.py")
    run(capsys, "reset", "5")
    assert run(capsys, "hint", "5")[1].startswith("hint 1 of 3:")  # a reset starts the hints again


def test_every_page_has_hints():
    for n in range(1, len(harness.EXERCISES) + 1):
        assert state.hints(n), f"exercise {n}'s page has no bullets under ## Hints"


def test_list_shows_the_status_of_the_learners_own_checks(course, capsys):
    assert harness.check(1, solution=True, out=lambda line: None, progress=False).passed
    rc, out = run(capsys, "list")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == len(harness.EXERCISES)
    assert lines[0].split()[:3] == ["1", "halo_arithmetic", "not"]  # a solution's check records nothing
    assert "★☆☆" in lines[0] and lines[0].endswith("min")
    shutil.copyfile(course / "solutions" / "01_halo_arithmetic.py", course / "01_halo_arithmetic.py")
    assert harness.check(1, out=lambda line: None, progress=False).passed  # the learner's file, solved
    harness.check(2, out=lambda line: None, progress=False)  # made from its skeleton: nothing written
    lines = run(capsys, "list")[1].splitlines()
    assert lines[0].split()[2] == "passed" and " not written " in lines[1], lines
    assert (course / "02_sample_backward.py").exists()
    assert state.load() == {"1": {"status": "passed", "hints": 0}, "2": {"status": "not written", "hints": 0}}


@pytest.mark.parametrize("argv", [("check", "14"), ("hint", "0"), ("reset", "x")])
def test_an_exercise_that_does_not_exist_is_one_line(course, capsys, argv):
    rc, out = run(capsys, *argv)
    assert rc == 2 and out.splitlines() == [
        f"no exercise {argv[1]}: the exercises are 1-13 (python -m tutorials.exercises list)"]
    assert not list(course.glob("[0-9][0-9]_*.py"))  # nothing made


def test_the_kernel_puzzles_score_ends_with_a_verdict():
    lines = []
    assert harness.check(13, solution=True, out=lines.append, progress=False).passed
    assert lines[-1] == "  as good as the reference on all four"


def test_exercise_5_asks_for_the_counts_as_given():
    # tutorial 5's by-hand Stationary-X works its blocks out with block_range: exercise 5 draws other splits
    by_hand = planted(5, "    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)",
                      "    from refconv.distribution import block_range\n"
                      "    f_counts = [numpy.diff(block_range(layer.F, comm.size, j))[0] for j in range(comm.size)]\n"
                      "    y_loc = collectives.reduce_scatter(comm, y_part, f_counts, axis=1)")
    by_hand.numpy = __import__("numpy")
    result = quiet(5, module=by_hand, parts=["forward"])
    assert result.status["forward"] == "failed", result.report
    assert "c_counts [" in result.report and "f_counts [" in result.report  # the smallest case says its split
