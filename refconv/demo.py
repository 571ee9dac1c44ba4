"""``python -m refconv.demo``: what ``make demo`` runs, launched from Python.

Distributed training of the digits CNN on 4 ranks (``sample=2 x channel=2``,
Stationary-X), with the first 5 steps replayed on one rank and compared::

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py -m refconv.cli train \\
        --grid sample=2,channel=2 --algorithm stationary-x --epochs 5 --check-serial 5
"""

import os
import subprocess
import sys

ARGS = ["--grid", "sample=2,channel=2", "--algorithm", "stationary-x", "--epochs", "5", "--check-serial", "5"]


def command(extra=()):
    from refconv.testing.mpirun import find_mpiexec

    return [find_mpiexec(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "refconv.cli", "train", *ARGS, *extra]


def main(argv=None):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.call(command(sys.argv[1:] if argv is None else argv), env=env)


if __name__ == "__main__":
    raise SystemExit(main())
