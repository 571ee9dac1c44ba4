"""The zoo's programs as data: each pattern is written once, with its mistake behind a flag.

A pattern is ``body(comm, z, **variant)``; ``@pattern`` registers it as one :class:`Program` per variant.
``z`` (a :class:`Mistake`) says whether this is the incorrect program (``z.wrong``), which world rank
makes the mistake (``z.guilty``) and whether it is this rank (``z.mine(comm)``).  The two programs of
the contract, ``incorrect(comm, guilty)`` and ``correct(comm, guilty)``, are the body with the flag set
and cleared, so a twin differs from its incorrect program only where the body says so.

Rules for a body (the zoo's runner, zoo.py, relies on them):

- arrays of a few elements; no loop that waits on time (a run ends within its timeout);
- a wrong answer that a correct MPI gives only to an incorrect program is :func:`expect`'s
  :class:`WrongAnswer`: for the incorrect program it counts as missed (the bug got through), for
  the correct twin as a false positive (the world got a correct program wrong);
- ``feature="RMA"`` or ``"persistent"`` marks a program that may be refused by name (the contract).
"""

import dataclasses

CLASSES = ("Invalid Parameter", "Resource Leak", "Request Lifecycle", "Local Concurrency", "Message Race",
           "Parameter Matching", "Call Matching", "Global Concurrency", "Buffering Hazard")
FEATURES = (None, "RMA", "persistent")   # the features a program may be refused for, by name
VIAS = ("raw", "collectives")             # mpi4py's communicator calls, or refconv.collectives' wrappers
PROGRAMS = []                             # every registered Program, in registration order


class WrongAnswer(Exception):
    """A program's own check failed: MPI delivered what the program did not expect."""


def expect(ok, what):
    """Raise :class:`WrongAnswer` (``what`` says what was wrong) unless ``ok``."""
    if not ok:
        raise WrongAnswer(what)


@dataclasses.dataclass(frozen=True)
class Mistake:
    """Who errs in one run: the incorrect program (``wrong``) at world rank ``guilty``."""

    wrong: bool
    guilty: int

    def mine(self, comm):
        """True on the guilty rank of the incorrect program (``comm``: the world communicator)."""
        return self.wrong and comm.rank == self.guilty


@dataclasses.dataclass(frozen=True)
class Program:
    """One incorrect program and its correct twin (``body`` with ``wrong`` set and cleared)."""

    name: str
    mbi_class: str
    body: object
    variant: dict
    ranks: tuple          # world sizes it runs at, from 2, 3, 4 and 8
    via: str              # "raw" or "collectives"
    feature: str = None   # "RMA" or "persistent": a refusal by name is allowed
    blame: bool = True    # one rank is at fault: a detection must name it
    races: bool = False   # the mistake shows only in some match orders: run with schedules="all"

    def incorrect(self, comm, guilty):
        return self.body(comm, Mistake(True, guilty), **self.variant)

    def correct(self, comm, guilty):
        return self.body(comm, Mistake(False, guilty), **self.variant)

    def guilty_ranks(self, n):
        """The first, middle and last rank of a world of ``n`` (fewer where they coincide)."""
        return sorted({0, n // 2, n - 1})

    def runs(self):
        """``[(ranks, guilty), ...]``: every run of this program."""
        return [(n, g) for n in self.ranks for g in self.guilty_ranks(n)]


def pattern(mbi_class, *, ranks, via, variants=None, feature=None, blame=True, races=False):
    """Register ``body`` as one Program per variant (``{label: kwargs}``; none: one program)."""
    if mbi_class not in CLASSES:
        raise ValueError(f"pattern: mbi_class must be one of {CLASSES}, got {mbi_class!r}")
    if via not in VIAS or feature not in FEATURES:
        raise ValueError(f"pattern: via must be one of {VIAS} and feature one of {FEATURES}, got {via!r}, {feature!r}")
    if not ranks or not set(ranks) <= {2, 3, 4, 8} or (races and max(ranks) > 4):
        raise ValueError(f"pattern: ranks must be from (2, 3, 4, 8), at most 4 for a race, got {ranks!r}")

    def register(body):
        for label, kwargs in (variants or {"": {}}).items():
            name = f"{body.__module__}.{body.__name__}" + (f"[{label}]" if label else "")
            PROGRAMS.append(Program(name, mbi_class, body, dict(kwargs), tuple(ranks), via, feature, blame, races))
        return body

    return register
