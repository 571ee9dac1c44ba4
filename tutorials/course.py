"""What the tutorials share: running a script on MPI ranks from inside a notebook.

A notebook is one process, and MPI ranks are processes, so a multi-rank step is
written as a small script (a Python string in the notebook), launched with::

    mpiexec -n 4 python -m mpi4py job.py OUT

and its results are read back from files rank 0 wrote into ``OUT`` (``.json``
or ``.npz``).  ``python -m mpi4py`` makes an exception on one rank abort the
whole job instead of leaving the others waiting in a collective, and the
launch has a timeout, so a broken cell fails, it never hangs.  tutorials/README.md
explains why this and not ipyparallel.

The script sees ``sys.argv[1]``, the folder to write into, and the environment
of the notebook plus ``OMP_NUM_THREADS=1``, ``OPENBLAS_NUM_THREADS=1`` (one BLAS
thread per rank) and ``NUMBA_ENABLE_CUDASIM=1`` unless already set; this folder
is on its ``PYTHONPATH``, so a script may ``import course`` for :func:`records`.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap

import numpy

from refconv.testing.mpirun import find_mpiexec

HERE = pathlib.Path(__file__).resolve().parent
RANKS = 4  # every multi-rank tutorial runs on 4 ranks: fine oversubscribed on a 2-core laptop


class Job:
    """A finished launch: ``output`` (stdout and stderr of all ranks) and the files in ``folder``."""

    def __init__(self, output, folder):
        self.output = output
        self.folder = pathlib.Path(folder)

    def json(self, name="result.json"):
        return json.loads((self.folder / name).read_text())

    def arrays(self, name="result.npz"):
        with numpy.load(self.folder / name) as data:
            return dict(data)


def run_on_ranks(script, ranks=RANKS, *, params=None, timeout=120, show=True):
    """Run ``script`` (Python source) on ``ranks`` MPI ranks; return a :class:`Job`.

    ``params``, when given, is written to ``params.json`` in the job's folder
    for the script to read.  Raises RuntimeError with the ranks' output when the job exits non-zero or
    runs past ``timeout`` seconds.  ``show`` prints the output (rank 0's prints, mostly).
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("no mpiexec next to this Python or on PATH: pip install mpich (or refconv[docs])")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="refconv-tutorial-"))
    path = folder / "job.py"
    path.write_text(textwrap.dedent(script))
    if params is not None:
        (folder / "params.json").write_text(json.dumps(params))
    env = dict(os.environ)
    for name, value in (("OMP_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1"), ("NUMBA_ENABLE_CUDASIM", "1")):
        env.setdefault(name, value)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", str(path), str(folder)]
    # a session of its own, so that a timeout kills mpiexec and every rank with it
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{path} on {ranks} ranks did not finish in {timeout} s:\n{output}")
    if proc.returncode != 0:
        raise RuntimeError(f"{path} on {ranks} ranks exited with {proc.returncode}:\n{output}")
    if show:
        print(output, end="")
    return Job(output, folder)


def run_layer(problem, cases, ranks=RANKS):
    """Run ``layer_job.py`` (one DistConv2d per case, checked against the reference) on ``ranks`` ranks.

    ``problem``: dict of N, C, F, H, W, K (and stride, padding, dilation); ``cases``: list
    of dicts with ``grid`` (ProcessGrid keywords), ``algorithm`` and optional
    ``filter_groups``.  Returns the cases with, per rank, its ``coords``, local shapes
    ``x_loc``, ``w_loc``, ``y_loc`` and recorded calls ``records``.
    """
    job = run_on_ranks((HERE / "layer_job.py").read_text(), ranks, params={"problem": problem, "cases": cases})
    return job.json()


def show_ranks(case):
    """Print a case of :func:`run_layer`: per rank its shapes and its calls as ``kind(q) bytes``."""
    print(f"{case['algorithm_used']} on {case['grid']}" + (f", filter_groups={case['filter_groups']}"
                                                           if case.get("filter_groups") else ""))
    for r, info in enumerate(case["ranks"]):
        calls = "  ".join(f"{k}(q={q}) {nb}" for k, q, _, nb in info["records"])
        print(f"  rank {r} {tuple(info['coords'])}: x_loc {tuple(info['x_loc'])} w {tuple(info['w_loc'])} "
              f"y_loc {tuple(info['y_loc'])}\n      {calls}")


# -- collectives simulated in one process: one list entry per rank ------------------------------
def reduce_scatter(parts, blocks, axis=1):
    """Every rank holds a full-size partial sum; rank i gets block ``blocks[i]`` of the total
    (the semantics of ``refconv.collectives.reduce_scatter``)."""
    total = sum(parts)
    return [numpy.take(total, range(*blocks[i]), axis=axis) for i in range(len(parts))]


def allgather(pieces, axis=1):
    """Every rank holds one block; every rank gets all blocks, concatenated in rank order."""
    full = numpy.concatenate(pieces, axis=axis)
    return [full.copy() for _ in pieces]


def records(region):
    """The calls of a ``collectives.stats.recording()`` region as JSON-ready
    ``[kind, comm_size, elements, bytes]`` lists, in call order."""
    return [[r.kind, r.comm_size, r.elements, r.bytes] for r in region.records]


def plot_bytes(ax, per_rank, title, *, moved_only=True):
    """Stacked bars: bytes of each collective kind, one bar per rank.

    ``per_rank[r]`` is rank r's :func:`records`.  ``moved_only`` leaves out calls on
    one-rank communicators (recorded by definition; nothing leaves the rank).
    """
    kinds = sorted({k for recs in per_rank for k, q, _, _ in recs if q > 1 or not moved_only})
    bottom = numpy.zeros(len(per_rank))
    for kind in kinds:
        heights = numpy.array([sum(nb for k, q, _, nb in recs if k == kind and (q > 1 or not moved_only))
                               for recs in per_rank], dtype=float)
        ax.bar(range(len(per_rank)), heights, bottom=bottom, label=kind)
        bottom += heights
    ax.set_xticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
    ax.set_ylabel("bytes (buffer sizes, CommStats)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
