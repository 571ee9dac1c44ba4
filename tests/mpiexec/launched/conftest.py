# These modules run under mpiexec through refconv.testing.mpirun (see tests/mpiexec/test_mpi.py),
# never in the pytest process itself.
collect_ignore_glob = ["*.py"]
