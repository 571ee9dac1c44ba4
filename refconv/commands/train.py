"""``refconv train``: the training loop (:func:`refconv.train.train`) on every rank of MPI.COMM_WORLD,
its options those of :mod:`refconv.train_config`, its summary printed by rank 0."""

from mpi4py import MPI

from refconv import failure, train_config
from refconv.train import format_summary, train

# the command protocol of refconv.cli
HELP = "train a CNN with sample, channel/filter and spatial parallelism"
DESCRIPTION = ("Train a CNN on the process grid of every rank of MPI.COMM_WORLD. Rank 0 prints the setup, the "
               "loss and test accuracy per epoch, and a summary of the time and bytes communicated per step by "
               "kind of collective; progress goes to stderr.")


def add_arguments(parser):
    train_config.add_arguments(parser)


def check(args):
    """The options alone (:class:`refconv.train_config.TrainConfig` validates them), before any collective."""
    train_config.from_arguments(args)


def run(args):
    failure.expect_training()      # every rank of this job trains: one that leaves before it tells the others
    result = train(train_config.from_arguments(args))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(format_summary(result), flush=True)
    return 0
