"""Hypothesis profiles shared by refconv's tests and users' tests.

- ``ci`` (the default in tests/conftest.py): no deadline (the CUDA simulator and MPI start-up make
  timing meaningless), and derandomized, so a run of the suite draws the examples the last one
  drew: a change that lands or fails, fails on its own merits and not on the day's draw.
- ``mpi``: also without an example database, so that every rank of a multi-rank test draws the
  same examples in the same order.
- ``fast``: ``ci`` with at most 10 examples where a test does not set its own (``make test-fast``,
  the editing loop; ``make test`` draws the full ``ci`` set).
- ``explore``: ``ci`` with random draws, for looking for new failures (``make explore``, a run
  differs from the last); what it finds is printed with a ``@reproduce_failure`` blob.

A property test of CUDA kernels sets its number of examples with :func:`simulated_examples`: under
Numba's CUDA simulator every thread is a Python call, so ``ci`` and ``fast`` draw fewer there, and the
explicit ``@example`` rows of such a test keep each code path in every run.
"""

import os

from hypothesis import HealthCheck, settings

REDUCED_UNDER_THE_SIMULATOR = ("ci", "fast")  # the profiles of make test and make test-fast


def simulated_examples(full, reduced):
    """``max_examples`` for a property test of CUDA kernels: ``reduced`` when the kernels run under Numba's
    CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) and the profile (``HYPOTHESIS_PROFILE``, default ``ci``) is
    ``ci`` or ``fast``; ``full`` on a GPU and under ``explore`` (``make explore``)."""
    if not 1 <= reduced <= full:
        raise ValueError(f"reduced: expected 1 <= reduced <= full = {full}, got {reduced}")
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return reduced if simulated and profile in REDUCED_UNDER_THE_SIMULATOR else full


def register_profiles():
    """Register the ``ci``, ``fast``, ``mpi`` and ``explore`` profiles (idempotent)."""
    settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True, database=None)
    settings.register_profile(
        "mpi",
        deadline=None,
        derandomize=True,
        database=None,
        max_examples=10,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.register_profile("fast", settings.get_profile("ci"), max_examples=10)
    settings.register_profile("explore", deadline=None, print_blob=True, derandomize=False)
