"""``python -m refconv.bench ...``: the same as ``refconv bench ...``."""

import sys

from refconv.bench.cli import main

sys.exit(main())
