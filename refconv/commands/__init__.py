"""The commands: modules with a command-line entry point (``refconv NAME``, or ``python -m``), kept out of
the library packages so that no library module imports one.

- :mod:`refconv.commands.train`: ``refconv train`` (the loop: :mod:`refconv.train`);
- :mod:`refconv.commands.demo`: ``refconv demo``, the digits CNN on 4 ranks;
- :mod:`refconv.commands.info`: ``refconv info``, what a job runs on;
- :mod:`refconv.commands.sweep` and :mod:`refconv.commands.plot`: ``refconv sweep`` and ``refconv plot``;
- :mod:`refconv.commands.data`: ``refconv data convert`` and ``refconv data synth`` (the writers:
  :mod:`refconv.datastore.convert`);
- :mod:`refconv.commands.simulate`: ``refconv simulate``, a plan's training steps on simulated ranks
  priced on the logical clock, beside the plan (the per-rank steps: :mod:`refconv.commands.simulate_steps`).
- :mod:`refconv.commands.diagnose`: ``refconv diagnose DIR``, the first call where the ranks of a hung
  MPI job differ (from their call records: :mod:`refconv.collectives.flight`);

``refconv plan``, ``calibrate`` and ``bench`` live with their tools (:mod:`refconv.plan`,
:mod:`refconv.bench`).  The command line itself, and its table of commands, is :mod:`refconv.cli`.
"""
