"""Planning a whole model's parallel strategy from a performance model (docs/planning.md).

- :mod:`refconv.plan.machine`: the machine file (collective and compute costs);
- :mod:`refconv.plan.graph`: a model spec as a chain of stages and residual blocks;
- :mod:`refconv.plan.perf`: predicted time and memory per stage and strategy;
- :mod:`refconv.plan.search`: the exact dynamic programme over the chain;
- :mod:`refconv.plan.calibrate`: ``refconv calibrate``, measuring a machine file;
- :mod:`refconv.plan.cli`: ``refconv plan`` and ``refconv calibrate``;
- :mod:`refconv.plan.validate`: predictions against measurement here;
- :mod:`refconv.plan.project`: the paper-scale projections of docs/planning.md.
"""

from refconv.plan.auto import choose_for_layer
from refconv.plan.machine import MachineError, load as load_machine
from refconv.plan.search import NoFeasiblePlan, Planner, plan_model

__all__ = ["choose_for_layer", "load_machine", "plan_model", "Planner", "MachineError", "NoFeasiblePlan"]
