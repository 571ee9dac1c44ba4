"""The ``refconv`` command line."""

import argparse
import sys

from refconv import __version__


def build_parser():
    parser = argparse.ArgumentParser(
        prog="refconv",
        description="Channel/filter, sample and spatial parallel CNN training.",
    )
    parser.add_argument("--version", action="version", version=f"refconv {__version__}")
    return parser


def main(argv=None):
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
