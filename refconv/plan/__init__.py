"""Planning tools around the pricing model of :mod:`refconv.pricing` (docs/planning.md).

- :mod:`refconv.plan.cli`: ``refconv plan``;
- :mod:`refconv.plan.calibrate`: ``refconv calibrate``, measuring a machine file;
- :mod:`refconv.plan.report`: the plan as text;
- :mod:`refconv.plan.validate`: predictions against measurement here;
- :mod:`refconv.plan.project`: the paper-scale projections of docs/planning.md.

These run layers, training steps and benchmarks; the model they price with imports none
of them.
"""
