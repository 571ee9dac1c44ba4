"""refconv: channel/filter, sample and spatial parallelism for CNN training.

A readable reference implementation of Dryden et al., "Channel and filter
parallelism for large-scale CNN training" (SC '19).  See docs/index.md.
"""

__version__ = "0.1.0"

from refconv.grid import ProcessGrid  # noqa: E402
from refconv.distribution import Distribution, Split, block_range  # noqa: E402
from refconv.sharding import scatter, gather, allgather, redistribute  # noqa: E402
from refconv.layers import DistConv2d  # noqa: E402
from refconv.model import Model  # noqa: E402
