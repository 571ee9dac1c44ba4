"""The ``refconv`` command line: ``refconv COMMAND ...`` (distributed commands run under mpiexec).

Subcommands are registered in :data:`COMMANDS`, one ``(name, module)`` line each.
A command module exposes::

    HELP = "..."                    # its line in ``refconv --help``
    DESCRIPTION = "..."             # the paragraph atop ``refconv NAME --help``
    def add_arguments(parser): ...  # its options, on the subparser main made for it
    def run(args) -> int: ...       # does the work; returns the exit status (0: success)
    def check(args): ...            # optional: raises OptionError for options refused on their own

Adding a command is one new module and one line in ``COMMANDS``.  ``main`` owns
what every command shares, on every rank alike:

- usage errors and ``--help`` are printed by rank 0 only; every rank exits with
  status 2 (or 0 for ``--help``);
- a command's optional ``check(args)`` judges the options alone, before any collective: its
  ``OptionError`` (or ``ValueError``) prints one line from rank 0 and every rank exits with status 2
  at once, as for a usage error (no agreement between the ranks to wait for, so a loaded machine
  whose ranks start seconds apart still ends with status 2);
- a ``ValueError`` out of ``run`` is a bad input that every rank rejects alike
  (options, data, model files: see :mod:`refconv.train_config`): rank 0 prints
  ``refconv NAME: error: ...`` on one line and the job ends with status 2, no
  traceback and, when every rank reports it within seconds, no ``MPI_Abort``
  (:func:`refconv.failure.exit_on_shared_error`); a
  :class:`refconv.failure.SharedFailure` ends it the same way with its own status
  (3 for a diverged run, 4 for a calibration that could not measure a rate);
- any other exception ends every rank through the abort hook that ``import refconv``
  installs under more than one rank (:mod:`refconv.failure`).
"""

import argparse
import functools
import importlib
import os
import re
import sys
import time
import warnings

from mpi4py import MPI

from refconv import __version__, collectives, failure
from refconv.train_config import OptionError, flag

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
COMMANDS = (
    ("train", "refconv.commands.train"),
    ("demo", "refconv.commands.demo"),
    ("plan", "refconv.plan.cli"),
    ("calibrate", "refconv.plan.calibrate"),
    ("info", "refconv.commands.info"),
    ("bench", "refconv.bench.cli"),
    ("sweep", "refconv.commands.sweep"),
    ("plot", "refconv.commands.plot"),
    ("data", "refconv.commands.data"),
    ("simulate", "refconv.commands.simulate"),
    ("diagnose", "refconv.commands.diagnose"),
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
        sub.set_defaults(run=module.run, check=getattr(module, "check", None))
    _mark_parsers(parser)
    return parser


ROLE = re.compile(r":\w+:`~?([^`]+)`")   # :func:`refconv.x` (reST roles, in docstrings shown as help)


def plain(text):
    """``text`` as a terminal shows it: reST's double backticks and roles dropped, their contents
    kept (a command's description is its module's docstring, written for the API docs)."""
    return text if text is None else ROLE.sub(r"\1", text).replace("``", "")


def _mark_parsers(parser):
    """Give every (sub)command's parser itself as the default ``parser_``: the one chosen last
    (``refconv data synth``'s, not ``refconv``'s) is then the one that reports an argument it
    does not take, with its own usage line and prefix.  Every description and help text is made
    :func:`plain` on the way."""
    parser.description = plain(parser.description)
    for action in parser._actions:
        action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in action.choices.values():
                sub.set_defaults(parser_=sub)
                _mark_parsers(sub)


def main(argv=None):
    collectives.fault_point("startup")      # where REFCONV_FAULT=rank:startup:... strikes
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # argparse would blame the top-level parser: "refconv: error:", and its usage
        getattr(args, "parser_", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv  # the command line, for a command that starts mpiexec with it (refconv.launch)
    if args.command is None:
        parser.print_help()
        return 0
    name = getattr(args, "parser_", parser).prog    # "refconv data convert": the subcommand that was run
    if args.check is not None:   # the options alone, before any collective: a usage error, as argparse's
        try:
            args.check(args)
        except OptionError as exc:
            return _refuse(f"{name}: error: {exc.render(flag)}")
        except ValueError as exc:
            return _refuse(f"{name}: error: {' '.join(str(exc).split())}")
    agree = SharedErrors()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
            status = args.run(args)
    except OptionError as exc:
        return agree.exit(f"{name}: error: {exc.render(flag)}")
    except ValueError as exc:
        return agree.exit(f"{name}: error: {' '.join(str(exc).split())}")
    except failure.SharedFailure as exc:
        return agree.exit(f"{name}: {' '.join(str(exc).split())}", exc.status)
    agree.close()
    return status


def _refuse(message):
    """Options that every rank refuses alike, before any collective: rank 0 prints the one line and
    every rank returns status 2 at once, with no agreement to wait for (as argparse's usage errors)."""
    if MPI.COMM_WORLD.Get_rank() == 0:
        failure.write_line(message)
    return 2


def _show_warning(previous, message, category, filename, lineno, file=None, line=None):
    """A refconv UserWarning (it follows from the options, so every rank warns alike) as one line,
    ``refconv: warning: ...``, from rank 0 only; any other warning as Python shows it."""
    if issubclass(category, UserWarning) and os.path.abspath(filename).startswith(PACKAGE_DIR):
        if MPI.COMM_WORLD.Get_rank() == 0:
            failure.write_line(f"refconv: warning: {' '.join(str(message).split())}", file)
        return
    previous(message, category, filename, lineno, file, line)


class SharedErrors:
    """How a command ends over a bad input that every rank rejects alike, without ``MPI_Abort``
    (whose MPICH ``Abort(2) ...`` line would follow the one line) when it can.

    Made by every rank at the start: a duplicate of COMM_WORLD, non-blocking (a rank stopped
    before it holds nobody up).  :meth:`exit` enters a non-blocking barrier on it: when every
    rank arrives within ``AGREE_S`` the error is shared, rank 0 prints the line and every rank
    returns the status (a clean exit).  Otherwise :func:`refconv.failure.exit_on_shared_error`
    ends the job as it always does (rank 0 aborts; another rank waits out the rest of its grace)."""

    AGREE_S = 2.0  # ranks raise a shared error at about the same moment: before any collective

    def __init__(self):
        world = MPI.COMM_WORLD
        self.comm, self._made = world.Idup() if world.Get_size() > 1 else (None, None)

    def exit(self, message, status=2):
        started = time.monotonic()
        if self.comm is not None and self._within(self._made, started) and self._within(self.comm.Ibarrier(), started):
            if MPI.COMM_WORLD.Get_rank() == 0:
                failure.write_line(message)
            self.close()
            return status
        waited = time.monotonic() - started
        return failure.exit_on_shared_error(message, status, grace_s=max(failure.SHARED_GRACE_S - waited, 0.0))

    def _within(self, request, started):
        while not request.Test():
            if time.monotonic() - started > self.AGREE_S:
                return False
            time.sleep(0.005)
        return True

    def close(self):
        """After a command that returned (or an error every rank shared): every rank made the duplicate, so
        it completes, and is freed.  Safe to call twice."""
        if self.comm is not None:
            self._made.Wait()
            self.comm.Free()
            self.comm = None


if __name__ == "__main__":
    sys.exit(main())
