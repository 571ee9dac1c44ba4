"""refconv: channel/filter, sample and spatial parallelism for CNN training.

A readable reference implementation of Dryden et al., "Channel and filter
parallelism for large-scale CNN training" (SC '19).  See docs/index.md.
"""

__version__ = "0.1.0"

# First, so that even an error while the rest of refconv imports ends the job: under more
# than one rank, an uncaught exception on any rank ends every rank with one line per rank
# instead of leaving the others waiting (refconv.failure; opt out: REFCONV_NO_ABORT_HOOK=1).
from refconv import failure as _failure  # noqa: E402

_failure.install_if_several_ranks()

from refconv.grid import ProcessGrid  # noqa: E402
from refconv.distribution import Distribution, Split, block_range  # noqa: E402
from refconv.sharding import scatter, gather, allgather, redistribute  # noqa: E402
from refconv.layers import DistConv2d, DistConv3d  # noqa: E402
from refconv.model import Model  # noqa: E402
