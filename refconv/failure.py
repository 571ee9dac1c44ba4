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

A third path covers a rank that **leaves early** while the others train
(:func:`training`, entered by :func:`refconv.train.train`):

- a ``SystemExit`` (of any code) or ``KeyboardInterrupt`` raised inside training,
  and ``os._exit`` called there, print ``[rank r] refconv: rank r is leaving during
  training (...); aborting the job`` and abort every rank (status 1);
- a rank of a ``refconv train`` job (:func:`expect_training`) that reaches its exit
  (``return`` from main, ``sys.exit``) without having entered training tells every
  other rank so, with a small point-to-point message on ``MPI.COMM_WORLD`` (tag
  ``LEAVING_TAG``), before MPI's finalize, which would otherwise wait for ranks that
  wait for it.  A rank inside training that still is, ``LEAVE_CONFIRM_S`` after such
  a notice, prints ``[rank q] refconv: rank r left the job while the others train;
  aborting the job`` (the lowest such rank; the others only if it did not) and aborts
  every rank (status 1).  Only such a rank sends: the others of its job cannot have
  finished (they wait for it), so no notice reaches a rank that is finalizing, which
  MPICH punishes (notices sent by every rank at every exit got 4-rank jobs SIGKILLed
  at their end, 1 run in 3).

What no hook sees: a rank that returns from a script of its own (not ``refconv
train``) while the others train, which the collective timeout ends; ``os._exit(0)``
outside training, or a C library's ``_exit(0)``, after which MPICH's launcher ends
the job at once (under a second) but with status 0.

Every line is written whole, newline included, in one ``write`` and flushed, so
lines from different ranks never run together.  MPICH adds its own one-line
``Abort(2) on node 0 ...`` notice after ours.  With one rank nothing is installed
and an error is just printed.
"""

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback

try:
    from mpi4py import MPI
except ModuleNotFoundError as exc:   # the system python3, not the venv's: one line, not a traceback
    if exc.name != "mpi4py":
        raise
    _venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv")
    if not os.path.isdir(_venv):
        _use = "install it with pip install -e '.[test]' from the repository root"
    elif os.path.realpath(sys.prefix) == os.path.realpath(_venv):
        _use = f"run make setup, which installs it into {_venv}/bin/python"
    else:
        _use = f"use {_venv}/bin/python (make setup makes it)"
    raise SystemExit(f"refconv needs mpi4py, which {sys.executable} lacks: {_use}") from None

GRACE_S = 1.0          # a raising rank waits this long before aborting, so its peers can print
SHARED_GRACE_S = 2.0   # a rank with a shared error waits this long for rank 0's abort: rank 0 meets the
                       # same check within this time when the error is shared; when it is not (one rank's
                       # ValueError), this is how long the job takes to end (10 s before: issue 25)
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
    reporter = getattr(exc, "reporter", rank)   # a report every rank holds alike is printed by one of them
    if reporter != rank:
        message = f"{message.splitlines()[0][:200] if message else ''} ... (the same report as rank {reporter}'s)"
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
        die_with_launcher()
        return True
    return False


PR_SET_PDEATHSIG = 1   # prctl(2): the signal this process gets when its parent dies


def die_with_launcher():
    """Linux: have the kernel SIGKILL this rank when its parent (the launcher's proxy that
    started it, e.g. MPICH's hydra_pmi_proxy) dies; strictly, when the parent's thread that
    started it ends.  ``REFCONV_NO_ABORT_HOOK=1`` turns it off with the abort hook.

    Without it, a rank whose proxy was killed runs on, orphaned, after mpiexec has
    returned: it trained on and saved later checkpoints into the directory that the next
    run resumes from (measured: killed at step 18, the directory reached step 30 a few
    seconds later).  Returns whether it is in force."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
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


# -- a rank that leaves early ---------------------------------------------------------------------
LEAVING_TAG = 32_001   # the notices' tag on COMM_WORLD (MPI allows tags up to at least 32767)
LEAVE_CONFIRM_S = 1.0  # a notice ends the job only if this rank is still training this much later
LEAVE_POLL_S = 0.1     # how often a training rank looks for notices


class _Leaving:
    """This process's state: how deep inside training it is, whether it owes the job a
    training run, the notices received, and the watcher thread that looks for them."""

    def __init__(self):
        self.depth = 0
        self.owed = False            # a rank of a refconv train job that has not entered training yet
        self.request = None         # the posted receive of a notice
        self.notice = bytearray(8)
        self.left = None            # (rank that left, monotonic time its notice arrived)
        self.thread = None
        self.real_exit = None       # os._exit, while it is wrapped
        self.pid = None
        self.lock = threading.Lock()  # the watcher's Test and the exit's Cancel of the one request


_leaving = _Leaving()


def _leave_line(rank, how):
    return f"[rank {rank}] refconv: rank {rank} is leaving during training ({how}); aborting the job"


def _leave_now(how):
    """This rank leaves inside training: one line, then end every rank."""
    sys.stdout.flush()
    write_line(_leave_line(MPI.COMM_WORLD.Get_rank(), how))
    time.sleep(LINE_GRACE_S)
    MPI.COMM_WORLD.Abort(1)


def _wrapped_exit(status):
    """os._exit inside training: it skips every Python hook, so this one speaks first (in
    this process only: a child forked by a library calls the real one)."""
    if _leaving.depth and os.getpid() == _leaving.pid:
        _leave_now(f"os._exit({status})")
    _leaving.real_exit(status)


def _watch_for_leavers():
    """Daemon thread: a notice from a rank that left, while this rank trains, ends the job."""
    world = MPI.COMM_WORLD
    me, status = world.Get_rank(), MPI.Status()
    while True:
        time.sleep(LEAVE_POLL_S)
        with _leaving.lock:
            if _leaving.request is None:
                return                  # this process is exiting
            if _leaving.left is None and _leaving.request.Test(status):
                _leaving.left = (status.Get_source(), time.monotonic())
        if _leaving.left is None or not _leaving.depth:
            continue
        rank, since = _leaving.left
        if time.monotonic() - since < LEAVE_CONFIRM_S:
            continue                # a rank that just finished training with the others is let go
        first = 1 if rank == 0 else 0
        if me != first:
            time.sleep(GRACE_S)     # the lowest training rank speaks; the others only if it did not
        sys.stdout.flush()
        write_line(f"[rank {me}] refconv: rank {rank} left the job while the others train (it reached its exit "
                   f"before training); aborting the job")
        time.sleep(LINE_GRACE_S)
        world.Abort(1)


def expect_training():
    """This rank is one of a job whose every rank trains (``refconv train``): should it exit
    before it enters :func:`training`, it tells the others, who would wait for it."""
    _leaving.owed = True


def _notify_at_exit():
    """atexit (before MPI's finalize): a rank that owes the job a training run tells the
    others it is leaving (they wait in collectives for it)."""
    world = MPI.COMM_WORLD
    if MPI.Is_finalized() or world.Get_size() == 1:
        return
    with _leaving.lock:
        if _leaving.request is not None and _leaving.left is None:
            _leaving.request.Cancel()    # MPI's finalize wants no receive left pending
            _leaving.request.Wait()
        _leaving.request = None
    if not _leaving.owed:
        return
    me = world.Get_rank()
    note = bytearray(me.to_bytes(8, "little"))
    requests = [world.Isend([note, MPI.BYTE], dest=r, tag=LEAVING_TAG) for r in range(world.Get_size()) if r != me]
    MPI.Request.Waitall(requests)   # small: sent eagerly, so this does not wait for the receivers


@contextlib.contextmanager
def training(comm):
    """``with training(comm):`` marks this rank as training with the other ranks of
    ``comm`` (every rank of ``MPI.COMM_WORLD``): leaving early by any route inside ends
    the job, and a notice that another rank left ends it too."""
    if comm.Get_size() == 1 or getattr(comm, "simulated", False) or comm.Get_size() != MPI.COMM_WORLD.Get_size():
        yield        # nobody to strand, not every rank trains, or simulated ranks (their world reports a rank that left)
        return
    if _leaving.thread is None and MPI.Query_thread() == MPI.THREAD_MULTIPLE:  # the watcher calls MPI too
        _leaving.request = MPI.COMM_WORLD.Irecv([_leaving.notice, MPI.BYTE], source=MPI.ANY_SOURCE,
                                                tag=LEAVING_TAG)
        _leaving.thread = threading.Thread(target=_watch_for_leavers, name="refconv-leavers", daemon=True)
        _leaving.thread.start()
    if _leaving.depth == 0:
        _leaving.real_exit, _leaving.pid, os._exit = os._exit, os.getpid(), _wrapped_exit
    _leaving.depth += 1
    _leaving.owed = False
    try:
        yield
    except (SystemExit, KeyboardInterrupt) as exc:
        where = _where(exc.__traceback__)
        code = f"({exc.code!r})" if isinstance(exc, SystemExit) else ""
        _leave_now(f"{type(exc).__name__}{code}" + (f" raised at {where}" if where else ""))
    finally:
        _leaving.depth -= 1
        if _leaving.depth == 0:
            os._exit = _leaving.real_exit


atexit.register(_notify_at_exit)


# -- hooks of the call record (refconv.collectives.flight) -------------------------------------------------
# before_abort: called with the rank's line before an uncaught exception aborts the job; at_exit: at
# the rank's exit, before MPI's finalize (which waits for ranks that may be waiting for this one);
# after_finalize: once every rank has finalized, the job ended well.  Each hook's own failure is ignored.
before_abort = []
at_exit = []
after_finalize = []


def _run_hooks(hooks, *args):
    for hook in list(hooks):
        try:
            hook(*args)
        except Exception:
            pass


_report_and_abort_only = _report_and_abort


def _report_and_abort(exc_type, exc, tb):   # noqa: F811  (the hooks first, then the line and the abort)
    where = _where(tb)
    message = " ".join(str(exc).split()) if exc is not None else ""
    _run_hooks(before_abort, f"uncaught {exc_type.__name__}: {message}" + (f" (raised at {where})" if where else ""))
    _report_and_abort_only(exc_type, exc, tb)


def _at_exit():
    """atexit, in place of _notify_at_exit: the at_exit hooks, the notice of a rank that leaves,
    then (when there are after_finalize hooks) MPI's finalize, and those hooks."""
    if MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    _run_hooks(at_exit)
    _notify_at_exit()
    if after_finalize:
        MPI.Finalize()      # waits for every rank: past it, the job ended well
        _run_hooks(after_finalize)


atexit.unregister(_notify_at_exit)
atexit.register(_at_exit)
