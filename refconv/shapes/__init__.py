"""Shapes-only arrays: a backend whose arrays carry a shape and a dtype, no values and no memory.

A training step on simulated ranks with ``backend="shapes"`` checks what a run with values checks (shapes,
the collectives' calls, sizes and order, buffer reuse) and measures each rank's memory
(:mod:`refconv.shapes.memory`) at a cost that does not grow with the batch or the image.
See docs/simulated-ranks.md.
"""

from refconv.shapes.array import ShapeArray
from refconv.shapes.errors import Mixed, NotSupported, NoValues

__all__ = ["ShapeArray", "Mixed", "NoValues", "NotSupported"]
