"""Run the multi-rank tests of tests/mpiexec/launched/ under mpiexec (see refconv.testing.mpirun).

One item per (test, world size), e.g. ``test_mpi[collectives::test_allgather-4]``.
The selected items of one (file, size) share one mpiexec launch, made when the
first of them runs and cached for the rest.
"""

import collections
import os
import pathlib
import subprocess
import sys
import time

import pytest

from refconv.testing import mpirun

HERE = pathlib.Path(__file__).parent
FILES = sorted(str(p) for p in (HERE / "launched").glob("test_*.py"))
LISTED = mpirun.list_tests(FILES)


def _cases():
    cases = []
    for path, tests in LISTED.items():
        stem = pathlib.Path(path).stem.removeprefix("test_")
        if isinstance(tests, str):      # the module failed to import: one failing item
            cases.append(pytest.param((path, "<import>", 0), id=f"{stem}::<import>"))
            continue
        for t in tests:
            for size in t.sizes:
                cases.append(pytest.param((path, t.name, size), id=f"{stem}::{t.name}-{size}"))
    return cases


_RESULTS = {}


def _batch(request, path, size):
    """Outcomes of every selected test of (path, size), launching once per batch."""
    if (path, size) not in _RESULTS:
        selected = {item.callspec.params["case"][1] for item in request.session.items
                    if getattr(item, "originalname", None) == "test_mpi" and item.module is request.module
                    and item.callspec.params["case"][0] == path
                    and item.callspec.params["case"][2] == size}
        tests = [t for t in LISTED[path] if size in t.sizes and t.name in selected]
        _RESULTS[(path, size)] = mpirun.run_file(path, size, tests)
    return _RESULTS[(path, size)]


@pytest.mark.mpi
@pytest.mark.parametrize("case", _cases())
def test_mpi(case, request):
    path, name, size = case
    if name == "<import>":
        pytest.fail(f"cannot list {path}:\n{LISTED[path]}")
    outcome = _batch(request, path, size)[name]
    if not outcome.passed:
        pytest.fail(f"{name} at {size} ranks failed:\n{outcome.output}", pytrace=False)


def test_each_launch_is_one_xdist_work_unit(request):
    """tests/conftest.py's work units for ``make test``: one per (tests/mpiexec/launched file, world size), the
    same for all the items of a launch and for no other item (two units of one launch would launch
    it twice), and xdist asks conftest for its scheduler, which splits its work by those units."""
    hook, = [h for h in request.config.hook.pytest_xdist_make_scheduler.get_hookimpls()
             if h.plugin_name.endswith(os.path.join("tests", "conftest.py"))]
    launch_group = hook.plugin.launch_group    # tests/conftest.py (tests/mpiexec/launched/ has a conftest too)
    units = {}
    for case in _cases():
        path, name, size = case.values[0]
        if name != "<import>":
            units.setdefault((path, size), set()).add(launch_group(f"tests/mpiexec/test_mpi.py::test_mpi[{case.id}]"))
    # every file of tests/mpiexec/launched/ is launched (one that fails to list has no unit), each at its sizes
    assert {path for path, _ in units} == set(FILES) and len(FILES) > 1, (sorted(units), FILES)
    assert all(len(names) == 1 for names in units.values()), units
    assert len(set.union(*units.values())) == len(units), units
    assert launch_group(request.node.nodeid) == "tests/mpiexec/test_mpi.py"
    options = {"dist": "loadgroup", "tx": ["3*popen"]}  # what `-n 3 --dist loadgroup` sets
    config = type("Options", (), {"getvalue": lambda self, name: options[name]})()
    scheduler = hook.function(config=config, log=None)
    launched = "tests/mpiexec/test_mpi.py::test_mpi[training::test_training_runs_of_every_remainder_match_one_rank-4]"
    for nodeid in (launched, "tests/mpiexec/test_mpi.py::test_harness_missing_mpiexec_fails",
                   "tests/docs_and_tutorials/test_docs.py::test_docs_have_pages"):
        assert scheduler._split_scope(nodeid) == launch_group(nodeid)
    assert scheduler._split_scope(launched) == "training-4"


def test_the_long_work_units_are_sent_first(request):
    """tests/conftest.py's table of the long units: each is a unit of ``make test`` (a test file, or one
    launch of a tests/mpiexec/launched file), and they lead the queue, longest first, the rest in xdist's order."""
    hook, = [h for h in request.config.hook.pytest_xdist_make_scheduler.get_hookimpls()
             if h.plugin_name.endswith(os.path.join("tests", "conftest.py"))]
    table, reorder, launch_group = hook.plugin.LONG_UNITS, hook.plugin.long_units_first, hook.plugin.launch_group
    root = HERE.parents[1]
    launches = {launch_group(f"tests/mpiexec/test_mpi.py::test_mpi[{case.id}]") for case in _cases()}
    assert all((root / unit).is_file() or unit in launches for unit in table), sorted(set(table) - launches)
    queue = collections.OrderedDict((unit, {}) for unit in ["tests/many_tests.py", *sorted(table), "other-2"])
    reorder(queue)
    assert list(queue) == [*sorted(table, key=table.get, reverse=True), "tests/many_tests.py", "other-2"]


# -- the harness and failure behaviour themselves -------------------------------------------------
FIXTURES = HERE / "harness_fixtures"


@pytest.mark.mpi
def test_harness_reports_failed_rank_and_continues():
    path = str(FIXTURES / "failing_tests.py")
    tests = [t for t in mpirun.list_tests([path])[path] if 2 in t.sizes]
    assert [t.name for t in tests] == ["test_passes_first", "test_fails_on_rank_1",
                                       "test_passes_after", "test_hangs_on_rank_0",
                                       "test_passes_last"]
    t0 = time.monotonic()
    out = mpirun.run_file(path, 2, tests)
    wall = time.monotonic() - t0
    assert out["test_passes_first"].passed
    assert not out["test_fails_on_rank_1"].passed
    assert "FAIL test_fails_on_rank_1 rank 1" in out["test_fails_on_rank_1"].output
    assert "deliberate failure on rank 1" in out["test_fails_on_rank_1"].output
    assert out["test_passes_after"].passed
    assert not out["test_hangs_on_rank_0"].passed
    assert "rank 0: TIMEOUT in test test_hangs_on_rank_0" in out["test_hangs_on_rank_0"].output
    assert out["test_passes_last"].passed
    assert wall < 40, f"harness took {wall:.1f} s"


@pytest.mark.mpi
def test_harness_keeps_a_failure_report_the_job_lost():
    path = str(FIXTURES / "silent_failure.py")
    tests = mpirun.list_tests([path])[path]
    out = mpirun.run_file(path, 2, tests)["test_fails_silently_on_rank_1"]
    assert not out.passed
    assert "reports the job lost" in out.output
    assert "FAIL test_fails_silently_on_rank_1 rank 1" in out.output
    assert "deliberate silent failure on rank 1" in out.output


@pytest.mark.mpi
def test_harness_timeout_shows_each_ranks_stack_and_caught_error():
    path = str(FIXTURES / "ranks_apart.py")
    tests = mpirun.list_tests([path])[path]
    out = mpirun.run_file(path, 2, tests)["test_ranks_apart_after_a_caught_error"]
    assert not out.passed
    for rank, line in [(0, "other.Barrier()"), (1, "world.Barrier()")]:
        assert f"rank {rank}: TIMEOUT in test test_ranks_apart_after_a_caught_error" in out.output, out.output
        assert f"--- rank {rank}'s Python stacks ---" in out.output, out.output
        assert "in test_ranks_apart_after_a_caught_error" in out.output, out.output
    assert "--- caught on rank 1 during the test ---" in out.output, out.output
    assert "ValueError: rank 1's caught error" in out.output, out.output


@pytest.mark.mpi
def test_harness_missing_mpiexec_fails(monkeypatch):
    monkeypatch.setattr(mpirun, "find_mpiexec", lambda: None)
    t = mpirun.MpiTest("x.py", "test_x", (2,), 5.0)
    out = mpirun.run_file("x.py", 2, [t])
    assert not out["test_x"].passed and "no mpiexec" in out["test_x"].output


def _mpiexec(n, *args, timeout=60):
    cmd = [mpirun.find_mpiexec(), "-n", str(n), sys.executable, *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpirun._env())
    return proc, time.monotonic() - t0


@pytest.mark.mpi
@pytest.mark.parametrize("runner", [[], ["-m", "mpi4py"]], ids=["abort_hook", "mpi4py_runner"])
def test_rank_raising_before_collective_ends_job(runner):
    proc, wall = _mpiexec(3, *runner, str(FIXTURES / "raise_on_rank1.py"), timeout=60)
    assert proc.returncode != 0
    assert wall < 10, f"job took {wall:.1f} s to end"
    text = proc.stdout + proc.stderr
    assert "rank 1 raises here" in text
    if not runner:
        assert "[rank 1]" in text


@pytest.mark.mpi
def test_bad_grid_raises_same_error_on_every_rank():
    proc, _ = _mpiexec(4, str(FIXTURES / "bad_grid.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 4, proc.stdout
    messages = {line.split(": ", 1)[1] for line in lines}
    assert messages == {"grid: sample*channel*height*width = 6 but the communicator has "
                        "4 ranks; choose sizes whose product is 4"}
