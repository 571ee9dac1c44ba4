"""``python -m tutorials.exercises check N [--solution] [--examples K]``: check exercise N.

Exit status 0 when every part passes, 1 when one does not (a mismatch, a crash, a part
not written yet), 2 on a bad command line.
"""

import argparse
import sys

from tutorials.exercises.harness import EXERCISES, check


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.exercises",
                                     description="Check an exercise of the course against the serial reference.")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("check", help="run exercise N's checker on your file (or the reference solution)")
    one.add_argument("number", type=int, choices=range(1, len(EXERCISES) + 1), metavar="N",
                     help=f"the exercise, 1 to {len(EXERCISES)}")
    one.add_argument("--solution", action="store_true", help="check the reference solution instead of your file")
    one.add_argument("--examples", type=int, default=None,
                     help="Hypothesis examples per part (default: the checker's own, fewer under CI)")
    sub.add_parser("list", help="list the exercises")
    args = parser.parse_args(argv)
    if args.command == "list":
        for n, slug in enumerate(EXERCISES, 1):
            print(f"{n:2d}  {slug}")
        return 0
    result = check(args.number, solution=args.solution, examples=args.examples)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
