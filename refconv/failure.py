"""Failure behaviour: one rank's uncaught exception ends the whole job.

Without this, a rank that raises exits while its peers wait forever in the next
collective.  ``install_abort_on_exception()`` sets ``sys.excepthook`` (and
``threading.excepthook``) so that the traceback is printed with every line
prefixed by ``[rank r]`` and then ``MPI.COMM_WORLD.Abort(1)`` ends all ranks.

For user scripts, ``mpiexec -n 4 python -m mpi4py script.py`` does the same
(mpi4py's runner aborts the job on an uncaught exception).
"""

import sys
import threading
import traceback

from mpi4py import MPI


def _report_and_abort(exc_type, exc, tb):
    rank = MPI.COMM_WORLD.Get_rank()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    lines = [f"[rank {rank}] uncaught exception, aborting all ranks"]
    lines += [f"[rank {rank}] {line}" for line in text.rstrip().splitlines()]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    MPI.COMM_WORLD.Abort(1)


def install_abort_on_exception():
    """Make an uncaught exception on any rank (or any thread) abort every rank."""
    sys.excepthook = _report_and_abort
    threading.excepthook = lambda args: _report_and_abort(
        args.exc_type, args.exc_value, args.exc_traceback)
