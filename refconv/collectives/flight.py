"""The call record: every rank keeps its last N MPI calls, and writes them when the job fails.

A hang under ``mpiexec`` shows only where each rank waits at the end, often far from the bug
(a send to the wrong peer goes through eagerly; the job stops at a later collective).  So each
rank keeps a ring of its recent calls (PyTorch's Flight Recorder does the same for NCCL), and
``refconv diagnose DIR`` (:mod:`refconv.collectives.divergence`) reads every rank's record and
names the first call where the ranks differ.

One entry per MPI call that ``refconv.collectives`` makes (``bcast`` makes two: its pickled
metadata and its ``Bcast``), entered where the call is guarded by the deadline
(``watchdog.guard``) or started (``requests.Request``).  An entry holds:

===========  ======================================================================================
``seq``      the n-th collective on its communicator (MPI matches the n-th with the n-th); None for
             point-to-point ("halo") calls, which are paired by peer and tag instead
``kind``     refconv's kind (``allreduce``, ``halo``, ``object``, ...); ``call``: MPI's (``Allreduce``)
``comm``     which communicator: its name, size and world ranks (the same on every member)
``bytes``    what every member must agree on, or None where it is legitimately per rank
``root``     the root of a rooted call; ``peers``: ``[tag, [[dst, bytes]...], [[src, bytes]...]]``
``site``     the caller's file and line: the nearest frame outside refconv.collectives (an
             algorithm's line, or the user's), and ``user_site``: the nearest outside refconv
``begin``    when it was called, ``wait``: when the rank began to wait for it, ``end``: when it
             finished (None: pending)
===========  ======================================================================================

Each rank's record is its :class:`refconv.collectives.local.RankState`'s ``flight``: the process's
under MPI, each simulated rank's own on :mod:`refconv.simulated` (:func:`snapshot` of it gives the
same dictionary that a rank writes).  ``REFCONV_RECORD_CALLS`` sets N (default 1000; 0 records
nothing).  Under more than one MPI rank a rank writes ``calls.<run>.rank<R>.json`` (:func:`write`)
to ``REFCONV_RECORD_DIR`` (else :func:`set_directory`'s, else ``./refconv-calls``): when a call
has waited ``SNAPSHOT_S`` (a snapshot: the rank that aborts SIGKILLs the others), on a collective
timeout, an uncaught exception, SIGTERM/SIGINT, and at its exit, removed again once every rank
finalized.  A file is written atomically: whole or absent.

A communicator made outside refconv and freed may have its handle reused by a later one; the two
are then recorded as one.  Communicators made by ``collectives.split``/``node_comm`` are told apart.
"""

import collections
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from mpi4py import MPI

from refconv import failure

FORMAT = "refconv-calls/1"
DEFAULT_CALLS = 1000
SNAPSHOT_S = 0.5        # a call waited this long: write a snapshot (below failure.GRACE_S)
WRITE_GRACE_S = 1.0     # the longest a rank waits for its record's write (a dead file system)
SIGNAL_GRACE_S = 1.0    # after SIGTERM/SIGINT, a rank that wrote its record waits this long before it exits
FIELDS = ("seq", "kind", "call", "comm", "bytes", "root", "peers", "site", "line", "user_site", "user_line",
          "begin", "wait", "end", "error")
# an entry in the ring is a list, for speed: these are its indices
COMM, SEQ, KIND, CALL, BYTES, ROOT, PEERS, CODE, LINE, CODE2, LINE2, BEGIN, WAIT, END, ERROR = range(15)

_HERE = os.path.dirname(__file__) + os.sep                       # refconv/collectives/
_PACKAGE = os.path.dirname(os.path.dirname(__file__)) + os.sep   # refconv/
# frames that are the call's own machinery, not its caller: this package, and refconv.shapes.memory's
# wrappers that count a collective's buffers as communication
_MACHINERY = (_HERE, os.path.join(_PACKAGE, "shapes") + os.sep)


def env_capacity():
    """REFCONV_RECORD_CALLS: how many calls a rank keeps (0: none); default ``DEFAULT_CALLS``."""
    text = os.environ.get("REFCONV_RECORD_CALLS", "").strip()
    try:
        value = int(text) if text else DEFAULT_CALLS
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"REFCONV_RECORD_CALLS: expected a count of calls >= 0 (0: record nothing), got {text!r}")
    return value


class FlightRecord:
    """One rank's ring of its last ``capacity`` calls (see the module's table)."""

    def __init__(self, capacity=DEFAULT_CALLS):
        self.ring = collections.deque(maxlen=capacity)
        self.comms = {}         # communicator handle -> [id, name, size, world ranks, next seq, instance]
        self.instances = collections.Counter()
        self.count = 0          # calls recorded in all (count - len(ring) fell out of the ring)
        self.waiting = None     # the entry this rank waits in now
        self.started = time.time()

    def begin(self, kind, call, comm, nbytes=None, root=None, peers=None):
        """A new entry for an MPI call on ``comm``, made now by the nearest caller outside this package."""
        handle = getattr(comm, "handle", None)
        if handle is None:      # a simulated communicator: its group is its identity (a stand-in: itself)
            handle = getattr(comm, "group", comm)
        info = self.comms.get(handle)
        if info is None:
            info = self._describe(handle, comm)
        if peers is None:
            seq = info[4]
            info[4] = seq + 1
        else:
            seq = None
        f = sys._getframe(1)
        while f.f_code.co_filename.startswith(_MACHINERY):
            f = f.f_back
        code2 = line2 = None
        if f.f_code.co_filename.startswith(_PACKAGE):
            g, n = f.f_back, 0
            while g is not None and g.f_code.co_filename.startswith(_PACKAGE) and n < 30:
                g, n = g.f_back, n + 1
            if g is not None and n < 30:
                code2, line2 = g.f_code, g.f_lineno
        now = time.perf_counter()
        entry = [info, seq, kind, call, nbytes, root, peers, f.f_code, f.f_lineno, code2, line2, now, now, None, None]
        self.ring.append(entry)
        self.count += 1
        return entry

    def _describe(self, handle, comm):
        size = comm.Get_size()
        if hasattr(comm, "world_rank"):         # simulated
            members = [comm.world_rank(r) for r in range(size)]
        elif hasattr(comm, "Get_group"):        # two groups, freed at once: a record must not leak MPI objects
            mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
            members = list(mine.Translate_ranks(list(range(size)), world))
            mine.Free()
            world.Free()
        else:                                   # a stand-in communicator (tests): its own ranks
            members = list(range(size))
        name = comm.Get_name()
        self.instances[(name, tuple(members))] += 1
        info = [len(self.comms), name, size, members, 0, self.instances[(name, tuple(members))]]
        self.comms[handle] = info
        return info

    def forget(self, comm):
        """``comm`` is new (MPI reuses freed handles): its calls start a new communicator."""
        self.comms.pop(getattr(comm, "handle", None), None)


def snapshot(record, rank, world_size, reason="snapshot", detail=""):
    """The record as the dictionary a rank writes (the format :func:`load` reads)."""
    wall, perf = time.time(), time.perf_counter()
    offset = wall - perf
    entries = list(record.ring)          # one C call: atomic under the GIL
    waiting = record.waiting
    comms, sites, calls = {}, {}, []

    def site(code):
        if code is None:
            return None
        key = (code.co_filename, code.co_name)
        return sites.setdefault(key, len(sites))

    def at(t):
        return None if t is None else round(t + offset, 6)
    for e in entries:
        info = e[COMM]
        cid = comms.setdefault(id(info), (len(comms), info))[0]
        calls.append([e[SEQ], e[KIND], e[CALL], cid, e[BYTES], e[ROOT], e[PEERS], site(e[CODE]), e[LINE],
                      site(e[CODE2]), e[LINE2], at(e[BEGIN]), at(e[WAIT]), at(e[END]), e[ERROR]])
    index = next((i for i, e in enumerate(entries) if e is waiting), None)
    return {"format": FORMAT, "run": run_id(), "rank": rank, "world_size": world_size, "host": socket.gethostname(),
            "pid": os.getpid(), "argv": list(sys.argv), "started": record.started, "written": wall,
            "reason": reason, "detail": detail, "capacity": record.ring.maxlen, "dropped": record.count - len(entries),
            "comms": [{"id": cid, "name": info[1], "size": info[2], "ranks": info[3], "instance": info[5]}
                      for cid, info in comms.values()],
            "sites": [list(key) for key in sites], "fields": list(FIELDS), "calls": calls, "waiting": index,
            "waited_s": None if index is None else round(perf - waiting[WAIT], 3)}


def run_id():
    """REFCONV_RUN_ID, else the batch system's job id, else ``"local"``."""
    env = os.environ
    if env.get("REFCONV_RUN_ID"):
        return env["REFCONV_RUN_ID"]
    if env.get("SLURM_JOB_ID"):
        return env["SLURM_JOB_ID"] + (f".{env['SLURM_STEP_ID']}" if env.get("SLURM_STEP_ID") else "")
    for name in ("PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID"):
        if env.get(name):
            return env[name]
    return "local"


class LoadError(ValueError):
    """A file that is not a whole call record this refconv can read (the message says why)."""


def load(path):
    """A record written by :func:`write`, as a dictionary, each call a dict keyed by ``FIELDS``
    (``site``/``user_site`` as file names).  Raises :class:`LoadError` saying what is wrong."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise LoadError(f"unreadable ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise LoadError("not a refconv call record (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise LoadError(f"unreadable (JSON cut or broken at byte {exc.pos} of {len(raw)})") from None
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith("refconv-calls/"):
        raise LoadError("not a refconv call record")
    if data["format"] != FORMAT:
        raise LoadError(f"format {data['format']} is not {FORMAT}, which this refconv reads")
    try:
        fields, sites = data["fields"], [s[0] for s in data["sites"]]
        calls = [dict(zip(fields, c)) for c in data["calls"]]
        for c in calls:
            for key in ("site", "user_site"):
                c[key] = sites[c[key]] if c[key] is not None else None
        comms = {c["id"]: c for c in data["comms"]}
        for c in calls:
            c["comm"] = comms[c["comm"]]
        int(data["rank"]), int(data["world_size"]), float(data["written"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise LoadError(f"not a whole refconv call record ({type(exc).__name__}: {exc})") from None
    data["calls"] = calls
    return data


# -- this process's record, written when it matters -------------------------------------------------------
_directory = None           # set_directory's
_default_directory = os.path.abspath("refconv-calls")   # resolved at import: a later chdir does not move it


class _Writer:
    def __init__(self):
        self.lock = threading.Lock()
        self.written = set()        # the reasons written (each once; snapshots again and again)
        self.last = None            # the path written
        self.snapped = None         # the entry of the last snapshot
        self.warned = False
        self.rank, self.size = 0, 1
        self.final = False          # a final record (timeout, exception, signal) is on disk: snapshot no more
        self.thread = None
        self.wakeup = None
        self.record = None          # this process's FlightRecord (install)


_writer = _Writer()


def set_directory(path):
    """Where this rank writes its record unless REFCONV_RECORD_DIR is set (``refconv train``:
    ``<checkpoint dir>/calls``)."""
    global _directory
    _directory = os.path.abspath(path)


def directory():
    """Where this rank's record goes: REFCONV_RECORD_DIR, else set_directory's, else ./refconv-calls."""
    return os.environ.get("REFCONV_RECORD_DIR") or _directory or _default_directory


def path_of(rank, folder=None):
    return os.path.join(folder or directory(), f"calls.{run_id()}.rank{rank}.json")


def write(reason, detail="", record=None):
    """Write this process's record (or ``record``; see the module's docstring): at most once per reason
    but ``"blocked"``, atomically, waiting at most ``WRITE_GRACE_S``.  Returns the path, or None."""
    record = record or _writer.record
    if record is None or (reason != "blocked" and reason in _writer.written) or \
            (reason == "blocked" and _writer.final):
        return None
    if reason in ("timeout", "exception", "signal"):
        _writer.final = True
    _writer.written.add(reason)
    done = []

    def work():
        with _writer.lock:
            done.append(_write_file(snapshot(record, _writer.rank, _writer.size, reason, detail)))
    thread = threading.Thread(target=work, name="refconv-record-write", daemon=True)
    thread.start()
    thread.join(WRITE_GRACE_S)
    return done[0] if done else None


def _write_file(data):
    path = path_of(data["rank"])
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if not _writer.warned and _writer.rank == 0:    # one line per job: every rank fails alike
            sys.stderr.write(f"[rank 0] refconv: could not write the call record to {os.path.dirname(path)} "
                             f"({exc.strerror or exc}); set REFCONV_RECORD_DIR to a writable folder\n")
            sys.stderr.flush()
        _writer.warned = True
        try:
            os.remove(tmp)
        except OSError:
            pass
        return None
    _writer.last = path
    return path


def _watch(wakeup_fd):
    """Daemon thread: writes a snapshot when a call has waited SNAPSHOT_S, and the record on
    SIGTERM/SIGINT (even while the main thread is inside MPI), then ends the process."""
    record = _writer.record
    while True:
        ready = select.select([wakeup_fd], [], [], 0.1)[0] if wakeup_fd is not None else time.sleep(0.1)
        if ready:
            got = os.read(wakeup_fd, 64)
            if got:
                sig = got[-1]
                try:
                    name = signal.Signals(sig).name
                except ValueError:
                    name = str(sig)
                write("signal", name)
                time.sleep(SIGNAL_GRACE_S)      # the first rank to exit gets the others killed: let them write
                os._exit(128 + sig)
        entry = record.waiting
        if entry is not None and entry is not _writer.snapped and entry[END] is None and \
                time.perf_counter() - entry[WAIT] > SNAPSHOT_S:
            _writer.snapped = entry
            write("blocked")


def _ignore_signal(signum, frame):
    """The Python-level handler: the watcher thread, woken by the wakeup fd, does the work."""


def install(record, rank, size):
    """Under more than one MPI rank, for the process's ``record``: the watcher thread, the signal
    handlers, the exit hooks."""
    if _writer.thread is not None or record is None:
        return
    _writer.record, _writer.rank, _writer.size = record, rank, size
    wakeup = None
    if threading.current_thread() is threading.main_thread():
        try:
            if all(signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler)
                   for s in (signal.SIGTERM, signal.SIGINT)):
                r, w = os.pipe()
                os.set_blocking(w, False)
                if signal.set_wakeup_fd(w) == -1:
                    wakeup = r
                    for s in (signal.SIGTERM, signal.SIGINT):
                        signal.signal(s, _ignore_signal)
                else:
                    signal.set_wakeup_fd(-1)    # someone else's (asyncio): leave signals alone
        except (ValueError, OSError):
            wakeup = None
    _writer.wakeup = wakeup
    _writer.thread = threading.Thread(target=_watch, args=(wakeup,), name="refconv-record", daemon=True)
    _writer.thread.start()
    failure.before_abort.append(lambda line: write("exception", line))
    failure.at_exit.append(lambda: write("exit"))
    failure.after_finalize.append(_remove_exit_record)


def _remove_exit_record():
    """Every rank finalized: the job ended well, so its exit record is litter."""
    if not _writer.final and _writer.last:
        try:
            os.remove(_writer.last)
            os.rmdir(os.path.dirname(_writer.last))     # only if empty: another rank's file keeps it
        except OSError:
            pass
