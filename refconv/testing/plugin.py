"""refconv's pytest plugin, found through the ``pytest11`` entry point of its install.

It registers the ``simulated`` marker that :func:`refconv.testing.ranks.on_ranks` puts on each
of its items, so that a repository of your own that uses ``@on_ranks`` needs no configuration
(no ``markers`` line; ``--strict-markers`` and ``-W error::pytest.PytestUnknownMarkWarning`` pass).
Loading it imports the ``refconv`` package (its ``__init__``: mpi4py's MPI, the layers; not numba), as
any test file that uses ``@on_ranks`` does anyway; the module itself defines one hook.
"""

SIMULATED = "simulated: runs on simulated ranks in this process (refconv.testing.ranks.on_ranks)"


def pytest_configure(config):
    config.addinivalue_line("markers", SIMULATED)
