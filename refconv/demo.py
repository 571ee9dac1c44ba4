"""``refconv demo`` (what ``make demo`` runs): the digits CNN trained on 4 ranks, checked serially.

Distributed training of the digits CNN on 4 ranks (``sample=2 x channel=2``,
Stationary-X), with the first 5 steps replayed on one rank and compared.  From a
plain shell it launches itself under MPI::

    OMP_NUM_THREADS=1 mpiexec -n 4 refconv train \\
        --grid sample=2,channel=2 --algorithm stationary-x --epochs 5 --check-serial 5

Under ``mpiexec -n 4`` it runs that training in place.  Extra arguments are
``refconv train`` options and override the demo's (``refconv demo --epochs 1``).
"""

import argparse
import os
import subprocess
import sys

from mpi4py import MPI

from refconv import cli, train, train_config
from refconv.testing.mpirun import find_mpiexec

RANKS = 4
ARGS = ["--grid", "sample=2,channel=2", "--algorithm", "stationary-x", "--epochs", "5", "--check-serial", "5"]


def command(extra=()):
    """The mpiexec command line the demo launches from one process."""
    return [find_mpiexec(), "-n", str(RANKS), sys.executable, "-m", "refconv.cli", "train", *ARGS, *extra]


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "demo", help=f"train the digits CNN on {RANKS} ranks (sample=2 x channel=2, Stationary-X) and "
                     f"replay its first 5 steps on one rank",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("train_args", nargs=argparse.REMAINDER, metavar="TRAIN_OPTION",
                        help="refconv train options that override the demo's, e.g. --epochs 1")
    return parser


def run(args):
    size = MPI.COMM_WORLD.Get_size()
    if size == 1:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        return subprocess.call(command(args.train_args), env=env)
    if size != RANKS:
        raise ValueError(f"demo: runs on {RANKS} ranks (sample=2 x channel=2), not {size}; launch it "
                         f"without mpiexec (it starts its own), or with mpiexec -n {RANKS}")
    parser = train_config.add_arguments(cli.Parser(prog="refconv demo"))
    return train.run(parser.parse_args(ARGS + args.train_args))
