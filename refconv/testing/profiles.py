"""Hypothesis profiles shared by refconv's tests and users' tests.

- ``ci``: no deadline (the CUDA simulator and MPI start-up make timing meaningless).
- ``mpi``: also derandomized and without an example database, so that every rank
  of a multi-rank test draws the same examples in the same order.
"""

from hypothesis import HealthCheck, settings


def register_profiles():
    """Register the ``ci`` and ``mpi`` profiles (idempotent)."""
    settings.register_profile("ci", deadline=None, print_blob=True)
    settings.register_profile(
        "mpi",
        deadline=None,
        derandomize=True,
        database=None,
        max_examples=10,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
