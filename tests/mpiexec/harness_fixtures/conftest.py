# Deliberately failing harness fixtures: run only by tests/mpiexec/test_mpi.py::test_harness_*.
# never in the pytest process itself.
collect_ignore_glob = ["*.py"]
