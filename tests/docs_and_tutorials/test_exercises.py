"""The exercises (tutorials/exercises/): every skeleton fails its checker saying what is not written yet,
every reference solution passes, and each detective bug planted back into its solution is caught.

``make exercises`` runs this file.  The checks draw with the ``exercises-ci`` Hypothesis profile (a few
examples per part), so all of it stays within the issue's 3 minutes on 2 cores.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tutorials/ is a folder of the checkout, not an installed package
    sys.path.insert(0, str(ROOT))

from tutorials.exercises import harness  # noqa: E402

NUMBERS = range(1, len(harness.EXERCISES) + 1)
CI = "exercises-ci"


@pytest.fixture(autouse=True)
def _ci_profile(monkeypatch):
    monkeypatch.setenv("REFCONV_EXERCISES_PROFILE", CI)


def _quiet(number, **kwargs):
    lines = []
    result = harness.check(number, out=lines.append, **kwargs)
    assert lines == [result.report]
    return result


def test_every_exercise_has_its_four_files():
    for slug in harness.EXERCISES:
        folder = ROOT / "tutorials" / "exercises"
        for path in (folder / f"{slug}.md", folder / f"{slug}.py", folder / "solutions" / f"{slug}.py",
                     folder / "checkers" / f"{slug}.py"):
            assert path.is_file(), f"{path.relative_to(ROOT)} is missing"


@pytest.mark.parametrize("number", NUMBERS, ids=lambda n: harness.EXERCISES[n - 1])
def test_skeleton_says_what_is_not_written(number):
    result = _quiet(number)
    assert not result.passed
    unwritten = [p for p, s in result.status.items() if s in ("not written", "bonus not written")]
    assert unwritten, result.report
    for part in unwritten:
        assert f"{part}: not written yet: replace todo(" in result.report
    assert "not written yet" in result.report and "Traceback" not in result.report


@pytest.mark.parametrize("number", NUMBERS, ids=lambda n: harness.EXERCISES[n - 1])
def test_solution_passes(number):
    result = _quiet(number, solution=True)
    assert result.passed, result.report
    assert set(result.status.values()) == {"passed"}, result.report  # bonus parts too
    drawn = [int(n) for n in re.findall(r": passed \((\d+) drawn cases?\)", result.report)]
    assert len(drawn) == len(result.status) and all(1 <= n <= harness.profile().max_examples for n in drawn)
    assert max(drawn) == harness.profile().max_examples, result.report  # the profile's examples were drawn


def planted(number, old, new):
    """Exercise ``number``'s solution with ``old`` replaced by ``new`` (which must occur once)."""
    source = harness.path_of(number, solution=True).read_text()
    assert source.count(old) == 1, f"{old!r} is not in solution {number} once"
    return harness.module_from_source(source.replace(old, new), f"planted_{number:02d}.py", "planted")


def test_a_wrong_answer_shows_the_smallest_case_the_tensor_and_a_picture():
    wrong = planted(5, "return y_loc + b_loc.reshape(1, -1, 1, 1)",
                    "return y_loc + (comm.rank + 1) * b_loc.reshape(1, -1, 1, 1)")
    result = _quiet(5, module=wrong)
    assert result.status == {"forward": "failed", "backward": "passed"}, result.report
    report = result.report
    assert "forward: FAILED on the smallest case found: 2 ranks" in report  # rank 0 is right: 2 is the least
    assert "y_loc differs on rank 1:" in report and "rank 1 y_loc[0, " in report
    assert "(x: differs):" in report and "Traceback" not in report
    picture = report[report.index("(x: differs):"):].splitlines()
    assert picture[1].split() == ["rank", "0", "rank", "1"]
    assert set(picture[2].split()[0]) == {"."} and set(picture[2].split()[1]) == {"x"}


def test_a_crash_shows_the_learners_own_frames():
    crash = planted(6, "x = layer.saved[\"x\"]", "x = layer.saved[\"x_full\"]")
    result = _quiet(6, module=crash)
    assert result.status["backward"] == "failed"
    assert "your code raised KeyError: 'x_full'" in result.report
    assert 'planted_06.py", line' in result.report and "harness.py" not in result.report


def test_a_deadlock_is_reported_not_waited_for():
    # on 2 ranks and more, rank 0 waits for a message the last rank never sends, which waits in the allgather
    stuck = planted(5, "    dy = collectives.allgather(",
                    "    if comm.rank == 0 and comm.size > 1:\n"
                    "        collectives.exchange(comm, {}, {comm.size - 1: dy_loc.shape}, dy_loc.dtype)\n"
                    "    dy = collectives.allgather(")
    result = _quiet(5, module=stuck)
    assert result.status == {"forward": "passed", "backward": "failed"}, result.report
    assert "backward: FAILED on the smallest case found: 2 ranks" in result.report
    assert "your code deadlocked: every rank waits for a call no other rank makes" in result.report
    assert "rank 0: waits in" in result.report and "rank 1: waits in" in result.report


def test_the_command_line_checks_one_exercise():
    env = dict(os.environ, REFCONV_EXERCISES_PROFILE=CI, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tutorials.exercises", "check", "1", "--solution"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "exercise 1: output and halo arithmetic, checking the reference solution"
    skeleton = subprocess.run([sys.executable, "-m", "tutorials.exercises", "check", "1"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    assert skeleton.returncode == 1 and "output_length: not written yet" in skeleton.stdout


DETECTIVE = 11
BUGS = harness.checker(DETECTIVE).BUGS


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_detective_bug_planted_back_is_caught(bug):
    part, fixed, buggy = BUGS[bug]
    skeleton = harness.path_of(DETECTIVE).read_text()
    assert skeleton.count(buggy) == 1, f"the skeleton no longer has the bug {bug!r} as BUGS lists it"
    result = _quiet(DETECTIVE, module=planted(DETECTIVE, fixed, buggy))
    assert result.status[part] == "failed", result.report
    assert [p for p, s in result.status.items() if s != "passed"] == [part], result.report  # that bug only
    assert f"{part}: FAILED on the smallest case found:" in result.report
    assert ("x_win" if "halo" in part else "y_loc differs") in result.report  # the window: its shape or cells


def test_the_detective_skeleton_shows_all_three_bugs():
    result = _quiet(DETECTIVE)
    parts = [part for part, _, _ in BUGS.values()]
    assert {part: result.status[part] for part in parts} == dict.fromkeys(parts, "failed")
    assert result.status["suspects"] == "not written"


# -- the X / Y / W figure the exercises' pages show (docs/figures/xyw_figure.py) --------------------------
def _xyw():
    spec = importlib.util.spec_from_file_location("xyw_figure", ROOT / "docs" / "figures" / "xyw_figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_xyw_figure_is_drawn_from_the_algorithms(tmp_path):
    fig = _xyw()
    png = pathlib.Path(fig.main(str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    x, y, w = (fig.owners(n) for n in fig.NAMES)
    assert (x == x[0]).all() and sorted(set(x[0])) == [0, 1, 2, 3]       # X keeps w[:, C_i]: columns
    assert (y.T == y[:, 0]).all() and sorted(set(y[:, 0])) == [0, 1, 2, 3]  # Y keeps w[F_i, :]: rows
    assert w[0, 0] == 0 and w[0, 4] == 0 and w[0, 2] == 1 and w[4, 0] == 2  # W: C_b not contiguous
    assert [v for v, _ in fig.calls("stationary-x")] == ["reduced", "moves", "reduced", "reduced"]
    assert [v for v, _ in fig.calls("stationary-y")] == ["moves", "reduced", "reduced", "reduced"]
    assert fig.title("stationary-w").startswith("Stationary-W: the weights stay")


# One plausible mistake per exercise, planted into its solution: each checker must see it, so that a
# passing solution means something.  (exercise, the part that must fail, the solution's text, the mistake)
MISTAKES = [
    (1, "output_length", "return (H + 2 * p - d * (K - 1) - 1) // s + 1", "return (H + 2 * p - d * (K - 1) - 1) // s"),
    (2, "backward_filter", "collectives.allreduce(comm, db_part)", "db_part"),
    (3, "halo_exchange", "x_win = numpy.zeros((n, c, hi - lo)", "x_win = numpy.ones((n, c, hi - lo)"),
    (4, "halo_return", "dx_loc[_at(box, mine)] += got[q]", "dx_loc[_at(box, mine)] -= got[q]"),
    (5, "backward", "dy = collectives.allgather(comm, dy_loc, layer.f_counts, axis=1)", "dy = dy_loc"),
    (6, "forward", "return y_loc + b_loc.reshape(1, -1, 1, 1)", "return y_loc"),
    (7, "forward", "return y_loc + b_loc.reshape(1, -1, 1, 1)", "return y_loc"),
    (8, "weight_peers", "return collectives.split(comm, channel, comm.rank)",
     "return collectives.split(comm, 0, comm.rank)"),
    (9, "predict", "ITEM = 8", "ITEM = 4"),
    (10, "communicators", "peers = collectives.split(comm, int(c), comm.rank)",
     "peers = collectives.split(comm, 0, comm.rank)"),
    (12, "check_records", 'Call("bcast", P_c, b.n * c_j * b.cells', 'Call("bcast", P_c, b.n * geom.C * b.cells'),
    (13, "conv_tile_kernel", "if t < K * K:", "if t < K * K - 1:"),
]


@pytest.mark.parametrize("number, part, right, wrong", MISTAKES, ids=[f"{m[0]:02d} {m[1]}" for m in MISTAKES])
def test_each_checker_catches_a_planted_mistake(number, part, right, wrong):
    result = _quiet(number, module=planted(number, right, wrong))
    assert result.status[part] == "failed", result.report
    assert f"{part}: FAILED on the smallest case found:" in result.report and "Traceback" not in result.report


def test_a_rank_that_never_ends_is_stopped_not_waited_for(monkeypatch):
    monkeypatch.setattr(harness, "TIMEOUT_S", 1.0)
    looping = planted(5, "    layer.saved[\"x_loc\"] = x_loc",
                      "    while comm.size > 1:  # forever, on 2 ranks and more\n        pass\n    layer.saved[\"x_loc\"] = x_loc")
    result = _quiet(5, module=looping)
    assert result.status == {"forward": "failed", "backward": "failed"}, result.report
    assert "your code ran past the time limit of 1 s on this case" in result.report
    assert 'File "planted_05.py", line' in result.report  # where each rank was
    ranks = [t for t in threading.enumerate() if t.name.startswith("simulated rank ")]
    deadline = time.monotonic() + 30      # stopped ranks end soon; a loaded machine may take a while
    for t in ranks:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not [t.name for t in ranks if t.is_alive()]  # none left spinning


def test_every_exercise_is_listed_where_learners_look():
    index = (ROOT / "tutorials" / "exercises" / "README.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for slug in harness.EXERCISES:
        assert f"]({slug}.md)" in index, f"tutorials/exercises/README.md does not link {slug}.md"
        assert f"tutorials/exercises/{slug}.md" in nav, f"mkdocs.yml's nav does not list {slug}.md"
        assert f"exercises check {int(slug[:2])}`" in (ROOT / "tutorials" / "exercises" / f"{slug}.md").read_text()
