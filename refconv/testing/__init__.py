"""Tools for property-testing decompositions against the serial reference.

- :mod:`refconv.testing.strategies`: Hypothesis strategies for problems and grids.
- :mod:`refconv.testing.asserts`: ``assert_close`` with a reduction-aware tolerance.
- :mod:`refconv.testing.mutants`: ``expect_mismatch``, asserting that a deliberately wrong layer is caught.
- :mod:`refconv.testing.profiles`: the ``ci`` and ``mpi`` Hypothesis profiles.
- :mod:`refconv.testing.mpirun`: the multi-rank test harness.
"""
