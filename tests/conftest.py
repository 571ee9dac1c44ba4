"""Test-session setup: run CUDA kernels under Numba's simulator unless a real GPU is present.

This must happen before numba is first imported, hence at the very top.

The tests sit in folders by subject (reference/, cuda_kernels/, simulator/, on_ranks/, mpiexec/, ...).
pytest's default import mode puts this conftest's folder, tests/, on sys.path, so a test in any
folder imports the helpers beside this file (conv_checks, finite_differences) by name; on_ranks/ is
a package because the files that tests/mpiexec/launched/ runs under mpiexec import its checks.
"""

import os
import re
import tempfile


def _real_gpu():
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if _real_gpu() else "1"
# the call records of jobs that tests end on purpose (refconv.collectives.flight) go to a temporary
# folder, not the checkout (a test that reads them sets its own REFCONV_RECORD_DIR)
os.environ.setdefault("REFCONV_RECORD_DIR", tempfile.mkdtemp(prefix="refconv-calls-"))
# MPICH waits by polling, and under MPI_THREAD_MULTIPLE (mpi4py's default) it hands its lock round with
# sched_yield between polls: a waiting rank stays runnable.  Heavy yield sleeps (nanosleep) instead.  Alone on a
# quiet machine test_mpi.py gained nothing from it (docs/benchmarks.md, 18:25-20:48 UTC); inside the whole suite, where
# three workers' jobs share 2 cores, one fresh-clone run with it took tests/mpiexec 212 CPU s and the run 225 s
# of system time, against 230-245 and 254-264 s in three runs without (docs/benchmarks.md, 21:11-23:41 UTC): thin
# evidence, and no loss.  Every mpiexec a test starts inherits it.
os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")

from hypothesis import settings  # noqa: E402

from refconv.testing.profiles import register_profiles  # noqa: E402

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402
from xdist.scheduler import LoadGroupScheduling  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_algorithm_registry():
    """A test (or a docs page) that registers an algorithm must not leak it into the next test."""
    from refconv import algorithms  # after the simulator switch above: refconv may import numba

    saved = dict(algorithms.REGISTRY)
    yield
    algorithms.REGISTRY.clear()
    algorithms.REGISTRY.update(saved)


LAUNCH_ITEM = re.compile(r"tests/mpiexec/test_mpi\.py::test_mpi\[(\w+)::\w+-(\d+)\]")


def launch_group(nodeid):
    """The pytest-xdist work unit of a test under ``make test`` (``--dist loadgroup``, three workers):
    a test file's tests stay on one worker, as in a serial run, but for tests/mpiexec/test_mpi.py, whose items
    are grouped by the mpiexec launch they share (one tests/mpiexec/launched file at one world size), so the
    launches spread over the workers, and each runs once: the items of a launch on two workers
    would each launch the whole batch."""
    launch = LAUNCH_ITEM.match(nodeid)
    return f"{launch[1]}-{launch[2]}" if launch else nodeid.split("::")[0]


# The work units that take longest under ``make test``, in about seconds of one core (CPU seconds measured
# test by test, docs/benchmarks.md; the 2-rank CUDA layers' is its wall time in the
# suite, which waits on children).  xdist queues the units with the most tests first, so few-test long units
# came last, and one worker ran a minute or more alone at the end while the other had finished: these go
# first instead, longest first (:func:`long_units_first`).  A unit missing here keeps xdist's place after them.
LONG_UNITS = {    # seconds of a worker in a fresh-clone make test, docs/benchmarks.md (2026-12-06, 14:20 UTC)
    "tests/cuda_kernels/test_kernels.py": 87,
    "tests/mpiexec/test_faults.py": 76,
    "tests/cuda_kernels/test_kernel_compile.py": 66,   # when the kept proof misses and it compiles; else 12
    "tests/docs_and_tutorials/test_tutorials.py": 66,
    "tests/plan/test_plan.py": 63,
    "tests/tools/test_bench.py": 48,
    "tests/simulator/test_simulated_planted_bug.py": 47,
    "tests/docs_and_tutorials/test_exercises.py": 42,
    "tests/on_ranks/test_datastore.py": 42,
    "tests/on_ranks/test_training.py": 38,
    "tests/on_ranks/test_records.py": 38,
    "tests/on_ranks/test_layers.py": 36,
    "tests/on_ranks/test_grouped_models.py": 36,
    "tests/mpiexec/test_torch_interop.py": 35,
    "tests/on_ranks/test_volumes.py": 34,
    "tests/on_ranks/test_plan.py": 33,
    "tests/cuda_kernels/test_kernels3d.py": 30,
    "tests/on_ranks/test_overlap.py": 30,
    "plan-2": 24,
    "layers_cuda-2": 22,
}


def long_units_first(workqueue):
    """Move the :data:`LONG_UNITS` of xdist's queue (an OrderedDict of unit -> its items) to its front, longest
    first; the other units keep their order behind them."""
    first = sorted((unit for unit in LONG_UNITS if unit in workqueue), key=LONG_UNITS.get, reverse=True)
    for unit in reversed(first):     # the last moved is the first in the queue
        workqueue.move_to_end(unit, last=False)


class LaunchGroups(LoadGroupScheduling):
    """xdist's ``loadgroup`` scheduling with the work units of :func:`launch_group`, the long ones first."""

    _ordered = False

    def _split_scope(self, nodeid):
        return launch_group(nodeid)

    def _assign_work_unit(self, node):
        if not self._ordered:      # the first assignment: xdist has just filled its queue
            long_units_first(self.workqueue)
            self._ordered = True
        super()._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the work units of :func:`launch_group`.  Not through xdist_group
    marks: xdist 3.8 appends a mark's group to ``item._nodeid``, which pytest 9.2 no longer reads
    (its ``nodeid`` comes from ``item._id``), so every item became a unit of its own."""
    return LaunchGroups(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_addoption(parser):
    parser.addoption("--max-ranks", type=int, default=None, metavar="N",
                     help="deselect the items of tests on simulated ranks (refconv.testing.ranks.on_ranks) that run "
                          "on more than N ranks, e.g. test_x[8 ranks]; `make test-fast` runs the small sizes only")


def pytest_collection_modifyitems(config, items):
    """``--max-ranks N``: the items of ``@on_ranks`` tests (marked ``simulated``) whose size exceeds N
    are deselected, and counted so."""
    limit = config.getoption("max_ranks")
    if limit is None:
        return
    if limit < 1:
        raise pytest.UsageError(f"--max-ranks must be a number of ranks >= 1, got {limit}")
    large = [item for item in items
             if item.get_closest_marker("simulated") and item.callspec.params["ranks"] > limit]
    if large:
        config.hook.pytest_deselected(items=large)
        dropped = set(large)
        items[:] = [item for item in items if item not in dropped]
