"""Test-session setup: run CUDA kernels under Numba's simulator unless a real GPU is present.

This must happen before numba is first imported, hence at the very top.
"""

import os


def _real_gpu():
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if _real_gpu() else "1"

from hypothesis import settings  # noqa: E402

from refconv.testing.profiles import register_profiles  # noqa: E402

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_algorithm_registry():
    """A test (or a docs page) that registers an algorithm must not leak it into the next test."""
    from refconv import algorithms  # after the simulator switch above: refconv may import numba

    saved = dict(algorithms.REGISTRY)
    yield
    algorithms.REGISTRY.clear()
    algorithms.REGISTRY.update(saved)


def pytest_collection_modifyitems(config, items):
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test`` runs two workers): a test file's
    tests stay on one worker, as in a serial run, but for tests/test_mpi.py, whose items are grouped
    by the mpiexec launch they share (one tests/mpi file at one world size), so the launches spread
    over the workers.  Without xdist the marks are inert."""
    for item in items:
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        if getattr(item, "originalname", None) == "test_mpi" and case:
            path, _, size = case
            group = f"{os.path.basename(path)}-{size}"
        else:
            group = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))

