"""refconv: channel/filter, sample and spatial parallelism for CNN training.

A readable reference implementation of Dryden et al., "Channel and filter
parallelism for large-scale CNN training" (SC '19).  See docs/index.md.

``import refconv`` loads only the abort hook (below); the public names and the subpackages load on
first use (PEP 562), so a process that needs one corner of refconv (the kernels' compile proof,
``refconv --help``, one rank of a launched test) does not import the rest.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# First, so that even an error while the rest of refconv imports ends the job: under more
# than one rank, an uncaught exception on any rank ends every rank with one line per rank
# instead of leaving the others waiting (refconv.failure; opt out: REFCONV_NO_ABORT_HOOK=1).
from refconv import failure as _failure  # noqa: E402

_failure.install_if_several_ranks()

# the public names, by the module that defines them
_PUBLIC = {
    "ProcessGrid": "refconv.grid",
    "Distribution": "refconv.distribution", "Split": "refconv.distribution", "block_range": "refconv.distribution",
    "scatter": "refconv.sharding", "gather": "refconv.sharding", "allgather": "refconv.sharding",
    "redistribute": "refconv.sharding",
    "DistConv2d": "refconv.layers", "DistConv3d": "refconv.layers",
    "Model": "refconv.model",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the same names, for tools that read the source (type checkers, the API pages)
    from refconv.distribution import Distribution, Split, block_range  # noqa: F401
    from refconv.grid import ProcessGrid  # noqa: F401
    from refconv.layers import DistConv2d, DistConv3d  # noqa: F401
    from refconv.model import Model  # noqa: F401
    from refconv.sharding import allgather, gather, redistribute, scatter  # noqa: F401


def __getattr__(name):
    """A public name (imported from its module), or a submodule (``refconv.layers``), on first use."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        try:
            value = importlib.import_module(f"refconv.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"refconv.{name}":
                raise
            raise AttributeError(f"module 'refconv' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
