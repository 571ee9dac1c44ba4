"""What the checkers share: drawn cases of a convolution on a world of simulated ranks, and blocks.

Sizes are at least the number of ranks that split them, so no block is empty, and uneven
blocks (``numpy.array_split``'s) arise whenever a size is not a multiple of its split: drawn
by construction, never filtered (``refconv.testing.strategies``, whose strategies these use).
"""

import dataclasses

from hypothesis import strategies as st

from refconv.distribution import block_range
from refconv.testing.strategies import conv_problems

WORLD_SIZES = (1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """A convolution problem on ``ranks`` simulated ranks (the channel group, unless a checker says)."""

    problem: object
    ranks: int
    seed: int = 0

    def __str__(self):
        p = self.problem
        return (f"{self.ranks} rank{'s' if self.ranks > 1 else ''}, x {p.x_shape}, w {p.w_shape}, "
                f"stride {p.stride}, padding {p.padding}, dilation {p.dilation}")


def blocks(length, parts):
    """``[(start, stop)]`` of each of ``parts`` blocks of ``length``."""
    return [block_range(length, parts, r) for r in range(parts)]


@st.composite
def channel_cases(draw, sizes=WORLD_SIZES, *, min_channels=None, min_batch=1, max_batch=2):
    """A problem whose C and F split over the drawn world size (at least ``min_channels(ranks)``
    each, default the size)."""
    ranks = draw(st.sampled_from(sizes))
    least = ranks if min_channels is None else min_channels(ranks)
    problem = draw(conv_problems(max_batch=max_batch, min_batch=min_batch, max_channels=least + 3,
                                 min_channels=least, groups=False, max_kernel=3, max_extra=3))
    return LayerCase(problem, ranks)


def geometry(problem):
    """``(stride, padding, dilation)`` of ``problem``, as the kit's convolutions take them."""
    return problem.stride, problem.padding, problem.dilation
