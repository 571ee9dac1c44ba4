"""The pricing model: what one training step costs on a machine, and the best strategy for it.

Pure computation on shapes and machine files: it runs no layer and imports no tool
(tests/architecture/test_architecture.py checks it), so layers and training can ask it.

- :mod:`refconv.pricing.machine`: the machine file (collective and compute costs);
- :mod:`refconv.pricing.graph`: a model spec as a chain of stages and residual blocks;
- :mod:`refconv.pricing.perf`: predicted time and memory per stage and strategy, from
  the layers' own ``records()``;
- :mod:`refconv.pricing.chooser`: ``algorithm: auto`` for one convolution (the one chooser);
- :mod:`refconv.pricing.search`: the exact dynamic programme over the chain.

The tools that use it (``refconv plan``, ``refconv calibrate``, validation, the
projections) are :mod:`refconv.plan`.
"""

from refconv.pricing.chooser import choose_for_layer
from refconv.pricing.machine import MachineError, load as load_machine
from refconv.pricing.search import NoFeasiblePlan, Planner, plan_model

__all__ = ["choose_for_layer", "load_machine", "plan_model", "Planner", "MachineError", "NoFeasiblePlan"]
