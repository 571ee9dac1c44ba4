"""BLAS threads per rank: ``cores on this node / ranks on this node`` unless the user chose.

OpenBLAS starts one worker per core in every process.  Two ranks on two cores
then run four busy threads, and a rank that finishes a GEMM leaves its workers
spinning for about 0.1 s: measured on the 2-core machine, 2 unpinned ranks ran
4.3x slower than 2 ranks with one BLAS thread each.  So every rank gets its
share of the node's cores::

    from refconv import threads
    choice = threads.configure(comm)          # collective over comm
    print(choice.describe())                  # "BLAS threads per rank: 1 (2 cores / 2 ranks on this node)"

The user's choice wins: ``--threads N`` (passed as ``requested``), else
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` from the
environment.  The limit is applied at run time through threadpoolctl, to every
BLAS and OpenMP pool loaded in the process when it runs; a library imported
later (torch, in the benchmarks) gets the same count through :func:`match`.
:func:`oversubscribed` says whether ranks x threads exceeds the cores
(for a warning).
"""

import dataclasses
import os

from threadpoolctl import threadpool_info, threadpool_limits

from refconv import collectives

ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """``threads`` per rank, where the number came from, and the node it was chosen for."""

    threads: int
    source: str  # "--threads", an environment variable's name, or "default"
    node_cores: int
    node_ranks: int

    def describe(self):
        where = f"{self.node_cores} cores / {self.node_ranks} rank{'s' if self.node_ranks != 1 else ''} on this node"
        why = where if self.source == "default" else f"set by {self.source}; {where}"
        return f"BLAS threads per rank: {self.threads} ({why})"


def user_threads(requested=None, environ=None):
    """``(threads, source)`` the user chose, or ``(None, None)``: ``requested`` (``--threads``)
    first, then the first of :data:`ENV_VARS` set in ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    if requested is not None:
        return _positive(requested, "--threads"), "--threads"
    for name in ENV_VARS:
        value = environ.get(name, "").strip()
        if value:
            return _positive(value, name), name
    return None, None


def _positive(value, name):
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"{name}: expected a positive number of threads, got {value!r}")
    return n


def node_layout(comm):
    """``(cores, ranks)`` of this rank's node: the CPUs any rank on the node may run on, and
    the number of ranks there.  Collective over ``comm``."""
    node = collectives.node_comm(comm)
    try:
        cpus = collectives.allgather_object(node, sorted(_usable_cpus()))
        return len(set().union(*map(set, cpus))), node.Get_size()
    finally:
        node.Free()


def _usable_cpus():
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return range(os.cpu_count() or 1)


def default_threads(cores, ranks):
    """``cores // ranks``, at least 1."""
    return max(1, cores // max(1, ranks))


def oversubscribed(threads, cores, ranks):
    """True when ``ranks`` ranks of ``threads`` BLAS threads each need more than ``cores`` cores."""
    return ranks * threads > cores


def configure(comm, requested=None, environ=None):
    """Choose this rank's BLAS threads and apply them (threadpoolctl); returns the
    :class:`ThreadChoice`.  Collective over ``comm`` (it counts the ranks per node);
    a bad ``requested`` or environment value raises on every rank before that."""
    threads, source = user_threads(requested, environ)
    cores, ranks = node_layout(comm)
    if threads is None:
        threads, source = default_threads(cores, ranks), "default"
    limit(threads)
    return ThreadChoice(threads, source, cores, ranks)


def limit(threads):
    """Cap every BLAS and OpenMP pool in this process at ``threads`` (until changed again)."""
    threadpool_limits(limits=_positive(threads, "threads"))


def match(torch):
    """Give ``torch``, imported after :func:`configure`, the thread count the BLAS pools have
    (threadpoolctl limits only the pools loaded when it runs)."""
    counts = [p["num_threads"] for p in threadpool_info() if p["internal_api"] != "openmp"]
    torch.set_num_threads(min(counts) if counts else 1)


def current():
    """``{library: threads}`` of the pools loaded now (what :func:`limit` set), for reports."""
    return {f"{p['internal_api']} ({os.path.basename(p['filepath'])})": p["num_threads"] for p in threadpool_info()}
