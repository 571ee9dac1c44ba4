"""refconv: channel/filter, sample and spatial parallelism for CNN training.

A readable reference implementation of Dryden et al., "Channel and filter
parallelism for large-scale CNN training" (SC '19).  See docs/index.md.
"""

__version__ = "0.1.0"
from refconv.grid import ProcessGrid
from refconv.distribution import Distribution, Split, block_range
from refconv.scatter import scatter, gather, allgather, redistribute  # functions shadow the module name; `from refconv.scatter import ...` still works
from refconv.conv import DistConv2d  # noqa: E402
