"""The exercises (tutorials/exercises/): every skeleton fails its checker saying what is not written yet,
every reference solution passes, each detective bug planted back into its solution is caught, and the
detective never tells its answer.  The cause hints: tests/docs_and_tutorials/test_exercise_hints.py; the
commands (list, hint, reset): tests/docs_and_tutorials/test_exercise_commands.py.

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

from exercise_checks import CI, ROOT, planted, quiet as _quiet
from tutorials.exercises import harness

NUMBERS = range(1, len(harness.EXERCISES) + 1)


@pytest.fixture(autouse=True)
def _ci_profile(monkeypatch):
    monkeypatch.setenv("REFCONV_EXERCISES_PROFILE", CI)


def test_every_exercise_has_its_four_files():
    for slug in harness.EXERCISES:
        folder = ROOT / "tutorials" / "exercises"
        for path in (folder / f"{slug}.md", folder / "skeletons" / f"{slug}.py", folder / "solutions" / f"{slug}.py",
                     folder / "checkers" / f"{slug}.py"):
            assert path.is_file(), f"{path.relative_to(ROOT)} is missing"


def test_every_checker_says_its_difficulty_and_time():
    for n in NUMBERS:
        spec = harness.checker(n)
        assert spec.LEVEL in (1, 2, 3) and isinstance(spec.MINUTES, int) and 5 <= spec.MINUTES <= 180, n


def test_progress_comes_before_the_verdict():
    seen = []
    result = harness.check(5, solution=True, out=lambda line: seen.append(("out", line)),
                           progress=lambda text: seen.append(("progress", text)))
    assert result.passed
    texts = [text for _, text in seen]
    assert seen[0] == ("out", "exercise 5: Stationary-X forward and backward, checking the reference solution")
    order = ["loading the reference solution", "forward: its simplest case", "forward: drawing cases on",
             "forward: passed", "backward: its simplest case", "backward: passed", "every part passes",
             "scoring on"]
    at = [next(k for k, t in enumerate(texts) if t.startswith(want)) for want in order]
    assert at == sorted(at), texts
    assert all(kind == "progress" for kind, t in seen if "drawing cases" in t or "simplest" in t)


@pytest.mark.parametrize("number", NUMBERS, ids=lambda n: harness.EXERCISES[n - 1])
def test_skeleton_says_what_is_not_written(number):
    result = _quiet(number, skeleton=True)
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
    drawing = [part for part in harness.checker(number).PARTS if not part.after]  # an after part draws none
    assert len(drawn) == len(drawing) and all(1 <= n <= harness.profile().max_examples for n in drawn)
    assert max(drawn) == harness.profile().max_examples, result.report  # the profile's examples were drawn


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
    assert "  ... output_length: its simplest case" in done.stderr  # progress, apart from the report


# -- the detective: three planted bugs, reported as case 1, 2, 3 ----------------------------------------------
DETECTIVE = 11
# per case: the function that held the bug, its line in the reference solution (fixed) and in the skeleton
BUGS = {
    1: ("halo_window",
        "o0, o1 = block(Ho, P, r)  # the output rows are split on their own",
        "o0, o1 = ((a + s - 1) // s for a in block(H, P, r))  # the output rows under the input rows"),
    2: ("halo_pieces",
        "        if not any(offset):\n            continue  # myself",
        "        if not any(offset) or all(offset):\n            continue  # myself"),
    3: ("forward",
        "    y_loc = collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W')\n"
        "    f0 = sum(layer.f_counts[:comm.rank])\n"
        "    return y_loc + b[f0:f0 + y_loc.shape[1]].reshape(1, -1, 1, 1)  # once, after the sum",
        "    y_part += b.reshape(1, -1, 1, 1)\n"
        "    return collectives.reduce_scatter(comm, y_part, layer.f_counts, axis=1)  # (n, F_i, H', W')"),
}
ANSWERS = 'return {1: "halo_window", 2: "halo_pieces", 3: "forward"}'


def _detective(source):
    return harness.module_from_source(source, "planted_11.py", "planted")


@pytest.mark.parametrize("case", sorted(BUGS))
def test_each_detective_bug_planted_back_is_caught(case):
    _, fixed, buggy = BUGS[case]
    part = f"case {case}"
    skeleton = harness.path_of(DETECTIVE, skeleton=True).read_text()
    assert skeleton.count(buggy) == 1, f"the skeleton no longer has the bug of case {case} as BUGS lists it"
    result = _quiet(DETECTIVE, module=planted(DETECTIVE, fixed, buggy))
    assert result.status[part] == "failed", result.report
    assert [p for p, s in result.status.items() if s != "passed"] == [part, "suspects"], result.report
    assert f"{part}: FAILED on the smallest case found:" in result.report
    assert ("x_win" if case < 3 else "y_loc differs") in result.report  # the window: its shape or cells
    assert f"case {case}: still fails; fix it first" in result.report
    assert "cause:" not in result.report  # a cause would name the bug


def test_the_detective_skeleton_shows_all_three_bugs():
    result = _quiet(DETECTIVE, skeleton=True)
    parts = [f"case {k}" for k in BUGS]
    assert {part: result.status[part] for part in parts} == dict.fromkeys(parts, "failed")
    assert result.status["suspects"] == "not written"


def test_the_detective_never_prints_the_reference():
    # the wrong answer: "halo_exchange" for the case of stride 2 on uneven shards
    wrong = planted(DETECTIVE, ANSWERS, 'return {1: "halo_exchange", 2: "halo_pieces", 3: "forward"}')
    result = _quiet(DETECTIVE, module=wrong)
    assert result.status == {"case 1": "passed", "case 2": "passed", "case 3": "passed", "suspects": "failed"}
    report = result.report
    assert ("case 1: halo_exchange is as the skeleton has it; the functions you changed: forward, halo_pieces, "
            "halo_window, suspects") in report, report
    for secret in ("reference", "[]", "elements", "halo_exchan,", "rank 0", "stride 2, uneven", "corner", "bias"):
        assert secret not in report, (secret, report)
    checker_source = (ROOT / "tutorials" / "exercises" / "checkers" / "11_detective.py").read_text()
    for name, _, _ in BUGS.values():
        assert f'"{name}"' not in checker_source  # no answer key it could print


def test_a_fixing_function_is_accepted():
    result = _quiet(DETECTIVE, solution=True)
    assert result.status["suspects"] == "passed", result.report


def test_any_changed_function_that_fixes_the_case_is_accepted():
    # case 1 fixed inside halo_exchange instead: it calls a helper of its own, and halo_window stays the skeleton's
    source = harness.path_of(DETECTIVE, solution=True).read_text().replace(BUGS[1][1], BUGS[1][2])
    for old, new in (("    lo, hi = halo_window(H, P, me, *args)\n", "    lo, hi = rows_read(H, P, me, *args)\n"),
                     ("            q_lo, q_hi = halo_window(H, P, q, *args)\n",
                      "            q_lo, q_hi = rows_read(H, P, q, *args)\n"),
                     ("\n\ndef halo_exchange(", "\n\ndef rows_read(H, P, r, K, s, p, d):\n"
                      "    Ho = (H + 2 * p - d * (K - 1) - 1) // s + 1\n"
                      "    o0, o1 = block(Ho, P, r)\n"
                      "    return o0 * s - p, (o1 - 1) * s - p + d * (K - 1) + 1\n\n\ndef halo_exchange("),
                     (ANSWERS, 'return {1: "halo_exchange", 2: "halo_pieces", 3: "forward"}')):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = _quiet(DETECTIVE, module=_detective(source))
    assert result.passed, result.report


def test_a_changed_function_that_does_not_fix_is_refused():
    source = planted(DETECTIVE, "    return a, a + base + (k < extra)",
                     "    b = a + base + (k < extra)\n    return a, b").__source__
    result = _quiet(DETECTIVE, module=_detective(source.replace(
        ANSWERS, 'return {1: "block", 2: "halo_pieces", 3: "forward"}')))
    assert result.status["suspects"] == "failed", result.report
    assert "case 1: your change to block alone does not fix it: x_win" in result.report, result.report
    verdict = result.report[result.report.index("suspects: FAILED"):]
    assert "halo_window" not in verdict  # the function that held the bug is not given away


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
    result = _quiet(number, module=planted(number, right, wrong), parts=[part])
    assert result.status[part] == "failed", result.report
    assert f"{part}: FAILED on the smallest case found:" in result.report and "Traceback" not in result.report


def test_a_rank_that_never_ends_is_stopped_not_waited_for(monkeypatch):
    monkeypatch.setattr(harness, "TIMEOUT_S", 1.0)
    looping = planted(5, "    layer.saved[\"x_loc\"] = x_loc",
                      "    while comm.size > 1:  # forever, on 2 ranks and more\n        pass\n    layer.saved[\"x_loc\"] = x_loc")
    result = _quiet(5, module=looping, parts=["forward"])  # backward, which calls forward, would time out alike
    assert result.status == {"forward": "failed"}, result.report
    assert "your code ran past the time limit of 1 s on this case" in result.report
    assert "forward: FAILED on the smallest case found: 2 ranks" in result.report  # shrunk over the ranks too
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
