"""The ``refconv`` command line: ``refconv COMMAND ...`` (distributed commands run under mpiexec).

Subcommands are registered in :data:`COMMANDS`, one ``(name, module)`` line each.
A command module exposes::

    HELP = "..."                    # its line in ``refconv --help``
    DESCRIPTION = "..."             # the paragraph atop ``refconv NAME --help``
    def add_arguments(parser): ...  # its options, on the subparser main made for it
    def run(args) -> int: ...       # does the work; returns the exit status (0: success)

Adding a command is one new module and one line in ``COMMANDS``.  ``main`` owns
what every command shares, on every rank alike:

- usage errors and ``--help`` are printed by rank 0 only; every rank exits with
  status 2 (or 0 for ``--help``);
- a ``ValueError`` out of ``run`` is a bad input that every rank rejects alike
  (options, data, model files: see :mod:`refconv.train_config`): rank 0 prints
  ``refconv NAME: error: ...`` on one line and the job ends with status 2, no
  traceback (:func:`refconv.failure.exit_on_shared_error`); a
  :class:`refconv.failure.SharedFailure` ends it the same way with its own status
  (3 for a diverged run);
- any other exception ends every rank through the abort hook that ``import refconv``
  installs under more than one rank (:mod:`refconv.failure`).
"""

import argparse
import importlib
import sys

from mpi4py import MPI

from refconv import __version__, collectives, failure
from refconv.train_config import OptionError, flag

COMMANDS = (
    ("train", "refconv.train"),
    ("demo", "refconv.demo"),
    ("plan", "refconv.plan.cli"),
    ("calibrate", "refconv.plan.calibrate"),
    ("info", "refconv.info"),
    ("bench", "refconv.bench.cli"),
    ("sweep", "refconv.sweep"),
    ("plot", "refconv.plot"),
    ("data", "refconv.datastore.convert"),
)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that speaks through rank 0 only (every rank parses the same argv)."""

    def _print_message(self, message, file=None):  # help, usage and errors all print through here
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


def build_parser():
    parser = Parser(
        prog="refconv",
        description="Channel/filter, sample and spatial parallel CNN training.",
        epilog="Run distributed commands under MPI, e.g. "
               "mpiexec -n 4 refconv train --grid sample=2,channel=2 --algorithm stationary-x")
    parser.add_argument("--version", action="version", version=f"refconv {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS:
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv=None):
    collectives.fault_point("startup")      # where REFCONV_FAULT=rank:startup:... strikes
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.run(args)
    except OptionError as exc:
        return failure.exit_on_shared_error(f"refconv {args.command}: error: {exc.render(flag)}")
    except ValueError as exc:
        return failure.exit_on_shared_error(f"refconv {args.command}: error: {' '.join(str(exc).split())}")
    except failure.SharedFailure as exc:
        return failure.exit_on_shared_error(f"refconv {args.command}: {' '.join(str(exc).split())}", exc.status)


if __name__ == "__main__":
    sys.exit(main())
