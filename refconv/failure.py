"""Failure behaviour: an error on any rank ends the whole job, with one line per rank.

Without this, a rank that raises exits while its peers wait forever in the next
collective.  Two paths, both ending every rank:

- **An uncaught exception** (any script).  ``import refconv`` under more than one
  rank installs :func:`install_abort_on_exception`: ``sys.excepthook`` (and
  ``threading.excepthook``) print ONE line, ``[rank r] uncaught ValueError: ...
  (raised at file.py:12 in f)``, wait ``GRACE_S`` so that other ranks raising the
  same error print theirs too, then ``MPI.COMM_WORLD.Abort(1)``.  Set
  ``REFCONV_TRACEBACK=1`` to print the whole traceback as well (its lines prefixed
  ``[rank r]``).  Opt out with ``REFCONV_NO_ABORT_HOOK=1`` in the environment, or
  call :func:`uninstall_abort_on_exception` after the import.
- **A bad input that every rank rejects alike** (:func:`exit_on_shared_error`, used
  by the ``refconv`` commands): rank 0 prints the one line and aborts with status 2;
  the other ranks stay silent.  A :class:`SharedFailure` (a failure every rank meets
  alike that is not bad input, such as a diverged run) ends the same way with its
  own ``status``.  Should a rank outlive rank 0's abort by
  ``SHARED_GRACE_S`` (so the error was not shared after all), it prints its line,
  prefixed ``[rank r]``, and aborts itself: never a hang, never a lost message.

Every line is written whole, newline included, in one ``write`` and flushed, so
lines from different ranks never run together.  MPICH adds its own one-line
``Abort(2) on node 0 ...`` notice after ours.  With one rank nothing is installed
and an error is just printed.
"""

import os
import sys
import threading
import time
import traceback

from mpi4py import MPI

GRACE_S = 1.0          # a raising rank waits this long before aborting, so its peers can print
SHARED_GRACE_S = 10.0  # a rank with a shared error waits this long for rank 0's abort
LINE_GRACE_S = 0.2     # between printing the error line and aborting (the collective watchdog waits the same)

_previous = None       # (sys.excepthook, threading.excepthook) before install


class SharedFailure(RuntimeError):
    """A failure that every rank meets alike and that is not bad input (e.g. a run whose
    loss is no longer finite): the ``refconv`` commands end the job with its message on
    one line and exit status ``status`` (:func:`exit_on_shared_error`)."""

    status = 3


def write_line(text, stream=None):
    """``text`` and a newline in one write, flushed (lines of several ranks stay whole)."""
    stream = stream or sys.stderr
    stream.write(text.rstrip("\n") + "\n")
    stream.flush()


def _where(tb):
    """``file.py:12 in f``: where the exception was raised (the innermost frame)."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return None
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"


def _report_and_abort(exc_type, exc, tb):
    rank = MPI.COMM_WORLD.Get_rank()
    where = _where(tb)
    message = " ".join(str(exc).split()) if exc is not None else ""
    line = f"[rank {rank}] uncaught {exc_type.__name__}: {message}" + (f" (raised at {where})" if where else "")
    if os.environ.get("REFCONV_TRACEBACK") == "1":
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        line += "\n" + "\n".join(f"[rank {rank}] {part}" for part in text.rstrip().splitlines())
    sys.stdout.flush()
    write_line(line)
    time.sleep(GRACE_S)
    MPI.COMM_WORLD.Abort(1)


def install_abort_on_exception():
    """Make an uncaught exception on any rank (or any thread) abort every rank."""
    global _previous
    if _previous is None:
        _previous = (sys.excepthook, threading.excepthook)
    sys.excepthook = _report_and_abort
    threading.excepthook = lambda args: _report_and_abort(args.exc_type, args.exc_value, args.exc_traceback)


def uninstall_abort_on_exception():
    """Restore the hooks that were there before :func:`install_abort_on_exception`."""
    global _previous
    if _previous is not None:
        sys.excepthook, threading.excepthook = _previous
        _previous = None


def installed():
    return _previous is not None


def install_if_several_ranks():
    """What ``import refconv`` does: install the hook when the job has more than one rank,
    unless ``REFCONV_NO_ABORT_HOOK=1``.  (refconv imports mpi4py.MPI anyway, so asking
    COMM_WORLD its size initialises nothing that was not already.)"""
    if os.environ.get("REFCONV_NO_ABORT_HOOK") == "1":
        return False
    if MPI.COMM_WORLD.Get_size() > 1:
        install_abort_on_exception()
        return True
    return False



def exit_on_shared_error(message, status=2, *, grace_s=None):
    """End the job over an error that every rank raised alike; returns ``status`` with one rank.

    Rank 0 prints ``message`` and aborts every rank.  Another rank prints nothing unless
    it is still alive ``grace_s`` later (rank 0 did not fail: the error was this rank's
    own), and then prints ``[rank r] message`` and aborts.
    """
    world = MPI.COMM_WORLD
    sys.stdout.flush()
    if world.Get_size() == 1:
        write_line(message)
        return status
    if world.Get_rank() == 0:
        write_line(message)
        time.sleep(LINE_GRACE_S)  # mpiexec drops a line still in flight when the abort lands first
        world.Abort(status)
    time.sleep(SHARED_GRACE_S if grace_s is None else grace_s)
    write_line(f"[rank {world.Get_rank()}] {message}")
    time.sleep(LINE_GRACE_S)
    world.Abort(status)
    return status  # not reached
