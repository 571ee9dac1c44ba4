"""The multi-rank test harness: write ``@mpi_test`` functions, pytest runs them under mpiexec.

Writing a test
--------------
Put it in ``tests/mpiexec/launched/test_<topic>.py``: a plain function, no arguments, using
``MPI.COMM_WORLD``; every rank runs the same body::

    from mpi4py import MPI
    from hypothesis import given, strategies as st
    from refconv.testing.mpirun import mpi_test
    from refconv.testing.asserts import collective_assert_close

    @mpi_test(sizes=(1, 2, 3, 4), timeout=60)
    def test_allreduce_sums():
        comm = MPI.COMM_WORLD
        x = numpy.full(5, comm.rank + 1.0)
        expected = numpy.full(5, comm.size * (comm.size + 1) / 2)   # derived from the size
        collective_assert_close(comm, allreduce(comm, x), expected)

    @mpi_test(sizes=(2, 4))
    @given(n=st.integers(1, 9))          # Hypothesis inside: profile "mpi" is derandomized,
    def test_drawn(n): ...               # so every rank draws the same examples

Rules: every rank calls every collective; a check on per-rank data must be a
collective assert (``refconv.testing.asserts``) so that all ranks fail in the
same example and stay in step; do not call MPI at import time.

Running
-------
``pytest tests/mpiexec/test_mpi.py`` makes one item per (test, size), e.g.
``tests/mpiexec/test_mpi.py::test_mpi[collectives::test_allgather-4]`` (select with
``-k``).  All selected items of one (file, size) run in ONE launch::

    mpiexec -n K python -m mpi4py -m refconv.testing.mpirun tests/mpiexec/launched/test_x.py --size K [--only a,b]

which you may also type by hand.  On each rank the runner imports the file,
loads the Hypothesis profile "mpi", and runs the tests registered for size K in
definition order.  Rank 0 prints ``@@refconv-mpi START <name>`` before a test
and ``@@refconv-mpi PASS <name>`` once every rank finished it (barrier).  An
exception prints ``@@refconv-mpi FAIL <name> rank <r>`` and the traceback, then
``MPI.COMM_WORLD.Abort(1)`` ends the job in seconds.  A collective assert
(:class:`refconv.testing.asserts.CollectiveAssertionError`) raises the same report on every
rank: its ``reporter`` (the lowest failed rank) prints it, and the other ranks print one line,
``... FAIL <name> rank <r> (the same report as rank <R>)``, so each report appears once.  After ``timeout`` seconds a watchdog
prints ``rank r: TIMEOUT in test <name>``, the rank's Python stacks (``faulthandler``'s,
dumped by its own thread, which needs no GIL) and the exceptions the collective checks
caught on it (``refconv.testing.asserts.CAUGHT``: a rank that raised inside ``check_layer``
and went on to report it while the others went on to their next collective), then exits once
every rank has filed its own TIMEOUT report (ranks that began the test seconds apart time out
seconds apart; it waits ``REPORT_WAIT_S`` at most).
Abort can kill the job before mpiexec has forwarded the failing rank's last
lines, so a rank also writes each failure report to a file in the directory
named by ``REFCONV_MPI_REPORTS`` (the launcher sets it) before it aborts; the
launcher appends any report missing from the captured output.

The pytest side (``run_file``) reports the aborted test failed with the
captured output (naming the rank), then re-launches the remaining tests of the
batch with ``--only`` so they still get real results.  The launch itself has a
timeout of the sum of the tests' timeouts plus ``SLACK_S``.  No mpiexec is a
failure, never a skip.  mpiexec is looked up next to ``sys.executable`` first,
then on PATH.  The environment gets OMP_NUM_THREADS=1, OPENBLAS_NUM_THREADS=1,
NUMBA_ENABLE_CUDASIM=1 (unless set) and HYPOTHESIS_PROFILE=mpi.

``python -m refconv.testing.mpirun --list FILE...`` prints the registered tests
as JSON without initialising MPI (pytest collects through it).
"""

import argparse
import dataclasses
import faulthandler
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

MARK = "@@refconv-mpi"
SLACK_S = 30.0
DEFAULT_SIZES = (1, 2, 3, 4)
_MARKER = re.compile(re.escape(MARK) + r" (START|PASS|FAIL) (\S+)")
REPORTS_ENV = "REFCONV_MPI_REPORTS"
REPORT_GRACE_S = 1.0
REPORT_WAIT_S = 10.0   # a rank that timed out waits this long at most for the other ranks' TIMEOUT reports
DUMP_WAIT_S = 5.0      # and this long at most for faulthandler's dump of its own stacks


def mpi_test(fn=None, *, sizes=DEFAULT_SIZES, timeout=60):
    """Register ``fn`` as a multi-rank test for the world sizes ``sizes``.

    Needs no MPI: it only tags the function (``fn.mpi_sizes``, ``fn.mpi_timeout``).
    """
    def tag(f):
        f.mpi_sizes = tuple(int(s) for s in sizes)
        f.mpi_timeout = float(timeout)
        return f
    return tag(fn) if fn is not None else tag


def _import(path):
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = "refconv_mpi_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _registered(module):
    """(name, fn) of the module's @mpi_test functions in definition order."""
    return [(n, f) for n, f in vars(module).items()
            if callable(f) and hasattr(f, "mpi_sizes")
            and getattr(f, "__module__", None) == module.__name__]


# -- rank side ------------------------------------------------------------------------------------
def _say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _report(rank, text):
    """Say a failure report, and keep it in a file the launcher reads if mpiexec loses it."""
    _say(text)
    directory = os.environ.get(REPORTS_ENV)
    if directory:
        with open(os.path.join(directory, f"rank{rank}-{time.monotonic_ns()}.txt"), "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def _watchdog(rank, size, name, timeout, done, stacks, caught):
    """Past ``timeout``: report this rank's Python stacks (written by faulthandler's own thread,
    which needs no GIL, at the deadline) and the exceptions the collective checks caught on it,
    wait for the other ranks' reports, then end the rank."""
    if not done.wait(timeout):
        _await_dump(stacks)
        found = "".join(f"\n--- caught on rank {rank} during the test ---\n{text}" for text in caught)
        _report(rank, f"{_timeout_line(rank, name)} after {timeout:g} s\n"
                      f"--- rank {rank}'s Python stacks ---\n{stacks.read().strip()}{found}")
        sys.stderr.flush()
        _await_timeout_reports(size, name)     # this exit ends the job: every rank's report first
        os._exit(3)


def _timeout_line(rank, name):
    return f"rank {rank}: TIMEOUT in test {name}"


def _await_dump(stacks, limit_s=DUMP_WAIT_S):
    """Wait for faulthandler's dump into ``stacks`` (due at the same deadline as the watchdog, but a loaded
    machine may run its thread later): until the file has stopped growing, or ``limit_s``; then rewind it."""
    deadline, size = time.monotonic() + limit_s, -1
    while time.monotonic() < deadline:
        time.sleep(0.05)
        grown = os.fstat(stacks.fileno()).st_size
        if grown and grown == size:
            break
        size = grown
    stacks.seek(0)


def _await_timeout_reports(size, name, limit_s=REPORT_WAIT_S):
    """Before a rank that timed out ends the job: wait until every rank of ``size`` has filed its TIMEOUT
    report of test ``name`` in ``REFCONV_MPI_REPORTS`` (their watchdogs fire at their own deadlines, and
    ranks that began the test seconds apart on a loaded machine time out seconds apart), at most
    ``limit_s``, then ``REPORT_GRACE_S`` for mpiexec to forward the lines.  Without that folder (a launch
    by hand), ``REPORT_GRACE_S`` alone."""
    directory = os.environ.get(REPORTS_ENV)
    deadline = time.monotonic() + limit_s
    while directory and time.monotonic() < deadline:
        filed = set()
        for entry in os.listdir(directory):
            try:
                with open(os.path.join(directory, entry)) as f:
                    filed.add(f.readline())
            except OSError:
                continue
        if all(any(line.startswith(_timeout_line(r, name) + " ") for line in filed) for r in range(size)):
            break
        time.sleep(0.05)
    time.sleep(REPORT_GRACE_S)


def run_rank(path, size, only=None):
    """Body of one rank: run the tests of ``path`` registered for ``size``."""
    from hypothesis import settings
    from mpi4py import MPI

    from refconv.testing.asserts import CAUGHT
    from refconv.testing.profiles import register_profiles

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != size:
        _report(rank, f"{MARK} FAIL <launch> rank {rank}\nworld size is {comm.Get_size()}, "
                      f"--size says {size}")
        comm.Abort(1)
    register_profiles()
    settings.load_profile("mpi")
    try:
        tests = _registered(_import(path))
    except BaseException:
        _report(rank, f"{MARK} FAIL <import> rank {rank}\n{traceback.format_exc()}")
        comm.Abort(1)
    tests = [(n, f) for n, f in tests
             if size in f.mpi_sizes and (only is None or n in only)]
    for name, fn in tests:
        if rank == 0:
            _say(f"{MARK} START {name}")
        done, stacks = threading.Event(), tempfile.TemporaryFile("w+")
        CAUGHT.clear()
        faulthandler.dump_traceback_later(fn.mpi_timeout, file=stacks)
        threading.Thread(target=_watchdog, args=(rank, comm.Get_size(), name, fn.mpi_timeout, done, stacks, CAUGHT),
                         daemon=True).start()
        try:
            fn()
        except BaseException as exc:
            reporter = getattr(exc, "reporter", rank)   # a collective assert: every rank has the same report
            if reporter != rank:
                _report(rank, f"{MARK} FAIL {name} rank {rank} (the same report as rank {reporter})")
                time.sleep(REPORT_GRACE_S)              # the reporter prints it and aborts the job
            else:
                _report(rank, f"{MARK} FAIL {name} rank {rank}\n"
                        + "".join(f"[rank {rank}] {line}\n"
                                  for line in traceback.format_exc().rstrip().splitlines()))
            sys.stderr.flush()
            comm.Abort(1)
        comm.Barrier()
        done.set()
        faulthandler.cancel_dump_traceback_later()
        if rank == 0:
            _say(f"{MARK} PASS {name}")


# -- launcher side --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MpiTest:
    path: str
    name: str
    sizes: tuple
    timeout: float


@dataclasses.dataclass
class Outcome:
    passed: bool
    output: str = ""
    wall_s: float = 0.0


def list_tests(paths):
    """{path: [MpiTest]} or {path: error text}, listed in a subprocess without MPI."""
    paths = [os.path.abspath(p) for p in paths]
    if not paths:
        return {}
    proc = subprocess.run([sys.executable, "-m", "refconv.testing.mpirun", "--list", *paths],
                          capture_output=True, text=True, env=_env(), timeout=120)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK + " LIST "):
            listed = json.loads(line[len(MARK) + 6:])
            return {p: ([MpiTest(p, *t) for t in v] if isinstance(v, list) else v)
                    for p, v in listed.items()}
    return {p: f"listing failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            for p in paths}


def _list_main(paths):
    import mpi4py
    mpi4py.rc.initialize = False        # importing test modules must not start MPI
    mpi4py.rc.finalize = False
    out = {}
    for p in paths:
        try:
            out[p] = [(n, list(f.mpi_sizes), f.mpi_timeout) for n, f in _registered(_import(p))]
        except BaseException:
            out[p] = traceback.format_exc()
    _say(f"{MARK} LIST {json.dumps(out)}")


def find_mpiexec():
    """mpiexec next to sys.executable, else on PATH, else None."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def _env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    env["HYPOTHESIS_PROFILE"] = "mpi"
    return env


def launch(path, size, names, timeout):
    """One mpiexec launch of ``names`` from ``path``: (returncode or None on timeout, output)."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise FileNotFoundError(
            "no mpiexec next to sys.executable or on PATH: install the MPI wheel "
            "(pip install mpich, or refconv[test]) to run the multi-rank tests")
    cmd = [mpiexec, "-n", str(size), sys.executable, "-m", "mpi4py",
           "-m", "refconv.testing.mpirun", os.path.abspath(path), "--size", str(size),
           "--only", ",".join(names)]
    with tempfile.TemporaryDirectory(prefix="refconv-mpi-") as reports:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_env() | {REPORTS_ENV: reports}, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out, rc = out + f"\n[harness] launch killed after {timeout:g} s\n", None
        return rc, out + _lost_reports(reports, out)


def _lost_reports(directory, out):
    """The rank failure reports in ``directory`` that the captured output ``out`` lacks (line by
    line: mpiexec may interleave two ranks' reports that both arrived)."""
    lost = ""
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            report = f.read().strip()
        if not all(line in out for line in report.splitlines()):
            lost += report + "\n"
    return f"[harness] reports the job lost when it ended:\n{lost}" if lost else ""


def run_file(path, size, tests):
    """Run ``tests`` (MpiTest list, definition order) of ``path`` at ``size``.

    Returns {name: Outcome}.  A launch that aborts marks its current test failed
    and re-launches the rest, until every test has a result.
    """
    results, pending = {}, list(tests)
    while pending:
        names = [t.name for t in pending]
        t0 = time.monotonic()
        try:
            rc, out = launch(path, size, names, sum(t.timeout for t in pending) + SLACK_S)
        except FileNotFoundError as exc:
            return {n: Outcome(False, str(exc)) for n in names} | results
        wall = time.monotonic() - t0
        passed, started, failed = set(), None, None
        for kind, name in _MARKER.findall(out):
            if kind == "PASS":
                passed.add(name)
            elif kind == "START":
                started = name
            elif kind == "FAIL" and failed is None:
                failed = name
        for n in names:
            if n in passed:
                results[n] = Outcome(True, "", wall)
        rest = [t for t in pending if t.name not in passed]
        if not rest:
            break
        if rc == 0:         # clean exit yet not all passed: cannot happen unless output was lost
            culprit = rest[0].name
        else:
            culprit = failed if failed in names else (started if started in names and
                                                      started not in passed else rest[0].name)
        if failed in ("<import>", "<launch>"):
            return results | {t.name: Outcome(False, out, wall) for t in rest}
        results[culprit] = Outcome(False, f"[harness] launch of {names} at size {size} "
                                          f"exited with rc={rc} during {culprit}\n{out}", wall)
        pending = [t for t in rest if t.name != culprit]
    return results


def _main(argv):
    if argv[:1] == ["--list"]:
        _list_main([os.path.abspath(p) for p in argv[1:]])
        return
    parser = argparse.ArgumentParser(prog="python -m mpi4py -m refconv.testing.mpirun")
    parser.add_argument("file")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--only", default=None, help="comma-separated test names")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    run_rank(args.file, args.size, only)


if __name__ == "__main__":
    _main(sys.argv[1:])
