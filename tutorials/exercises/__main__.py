"""``python -m tutorials.exercises COMMAND``: the course's exercises from the command line.

    list                                  each exercise, its status, difficulty and time
    check N [--solution] [--examples K]   check exercise N (your file, or the reference solution)
    hint N                                the next hint of exercise N, one more each time
    reset N                               exercise N's file back to its skeleton (yours kept in .backup/)

Exit status 0 when every part passes (or the command did its work), 1 when a part does not (a
mismatch, a crash, a part not written yet), 2 on a bad command line or an exercise that does not exist.
"""

import argparse
import sys

from tutorials.exercises import harness, state


def _number(text):
    """The exercise number ``text`` names, or None."""
    try:
        n = int(text)
    except ValueError:
        return None
    return n if 1 <= n <= len(harness.EXERCISES) else None


def _list():
    progress = state.load()
    for n, slug in enumerate(harness.EXERCISES, 1):
        spec = harness.checker(n)
        status = progress.get(str(n), {}).get("status", "not started")
        stars = "★" * spec.LEVEL + "☆" * (3 - spec.LEVEL)
        print(f"{n:3d}  {slug[3:]:26}{status:13}{stars}  ~{spec.MINUTES} min")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.exercises",
                                     description="The course's exercises: check, hint, reset, list.")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("check", help="run exercise N's checker on your file (or the reference solution)")
    one.add_argument("number", metavar="N", help=f"the exercise, 1 to {len(harness.EXERCISES)}")
    one.add_argument("--solution", action="store_true", help="check the reference solution instead of your file")
    one.add_argument("--examples", type=int, default=None,
                     help="Hypothesis examples per part (default: the checker's own, fewer under CI)")
    sub.add_parser("hint", help="the next hint of exercise N").add_argument("number", metavar="N")
    sub.add_parser("reset", help="exercise N's file back to its skeleton; yours is kept in .backup/").add_argument(
        "number", metavar="N")
    sub.add_parser("list", help="each exercise, its status, difficulty and time")
    args = parser.parse_args(argv)
    if args.command == "list":
        _list()
        return 0
    number = _number(args.number)
    if number is None:
        print(f"no exercise {args.number}: the exercises are 1-{len(harness.EXERCISES)} "
              f"(python -m tutorials.exercises list)")
        return 2
    if args.command == "hint":
        print(state.next_hint(number))
        return 0
    if args.command == "reset":
        print(state.reset(number))
        return 0
    result = harness.check(number, solution=args.solution, examples=args.examples)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
