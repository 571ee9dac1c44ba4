"""``refconv demo`` (what ``make demo`` runs): the digits CNN trained on 4 ranks, checked serially.

Distributed training of the digits CNN on 4 ranks (``sample=2 x channel=2``,
Stationary-X), with the first 5 steps replayed on one rank and compared.  From a
plain shell it launches itself under MPI::

    OMP_NUM_THREADS=1 mpiexec -n 4 refconv train \\
        --grid sample=2,channel=2 --algorithm stationary-x --epochs 5 --check-serial 5

Under ``mpiexec -n 4`` it runs that training in place.  It takes every ``refconv
train`` option, with the demo's defaults (``refconv demo --epochs 1``).
"""

from mpi4py import MPI

from refconv import launch, train_config
from refconv.commands import train

RANKS = 4
DEFAULTS = {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x", "epochs": 5, "check_serial": 5}


def command(args):
    """The mpiexec command line the demo launches from one process (``args``: its options)."""
    return launch.command(RANKS, ["train", *train_config.to_arguments(args)])


HELP = f"train the digits CNN on {RANKS} ranks (sample=2 x channel=2, Stationary-X) and replay its first 5 steps on one rank"
DESCRIPTION = (f"Train the digits CNN on {RANKS} ranks (sample=2 x channel=2, Stationary-X) and replay its first 5 "
               f"steps on one rank. From one process it starts mpiexec -n {RANKS} itself; under mpiexec -n {RANKS} "
               f"it trains in place. It takes every refconv train option, with the demo's defaults.")


def add_arguments(parser):
    train_config.add_arguments(parser, DEFAULTS)


def check(args):
    """The options alone, as ``refconv train`` checks them, before the demo launches anything."""
    train.check(args)


def run(args):
    size = MPI.COMM_WORLD.Get_size()
    if size == 1:
        return launch.relaunch(RANKS, ["train", *train_config.to_arguments(args)])
    if size != RANKS:
        raise ValueError(f"it runs on {RANKS} ranks (sample=2 x channel=2), not {size}: launch it without "
                         f"mpiexec (it starts its own), or with mpiexec -n {RANKS}")
    return train.run(args)
