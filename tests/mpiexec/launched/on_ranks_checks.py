"""A tests/on_ranks/ module loaded by a tests/mpiexec/launched/ file, to run its checks under mpiexec too.

The checks of a simulated test module are functions of a rank's communicator; a real-MPI file
runs the same functions on ``MPI.COMM_WORLD``, so that one body is the check in both places.
(Not a test file: refconv.testing.mpirun lists ``test_*.py`` only.)
"""

import importlib.util
import pathlib
import sys

ON_RANKS = pathlib.Path(__file__).resolve().parents[2] / "on_ranks"


def load(stem):
    """The module tests/on_ranks/<stem>.py, imported once per process under its own name."""
    name = f"refconv_on_ranks_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ON_RANKS / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
