"""Starting ``mpiexec`` from one process: what ``refconv demo`` and ``refconv calibrate`` do
when they are run without it::

    refconv calibrate --out m.yaml      ->  mpiexec -n 4 python -m refconv.cli calibrate --out m.yaml

The ranks run the same command line under ``mpiexec`` (``sys.executable``, so they import
this refconv), with one BLAS thread each unless ``OMP_NUM_THREADS`` says otherwise.
"""

import os
import subprocess
import sys

from refconv.testing.mpirun import find_mpiexec


def command(ranks, argv):
    """The mpiexec command line that runs ``refconv ARGV...`` on ``ranks`` ranks."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise ValueError(f"no mpiexec next to {sys.executable} or on PATH to start {ranks} ranks with: install "
                         f"an MPI (pip install mpich), or launch it yourself as mpiexec -n {ranks} refconv "
                         f"{' '.join(argv)}")
    return [mpiexec, "-n", str(ranks), sys.executable, "-m", "refconv.cli", *argv]


def relaunch(ranks, argv):
    """Run ``refconv ARGV...`` on ``ranks`` ranks under mpiexec and wait; its exit status."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.call(command(ranks, argv), env=env)
