"""refconv's pytest plugin, found through the ``pytest11`` entry point of its install.

It registers the ``simulated`` marker that :func:`refconv.testing.ranks.on_ranks` puts on each
of its items, so that a repository of your own that uses ``@on_ranks`` needs no configuration
(no ``markers`` line; ``--strict-markers`` and ``-W error::pytest.PytestUnknownMarkWarning`` pass).
It imports nothing of refconv: loading it costs a test run nothing.
"""

SIMULATED = "simulated: runs on simulated ranks in this process (refconv.testing.ranks.on_ranks)"


def pytest_configure(config):
    config.addinivalue_line("markers", SIMULATED)
