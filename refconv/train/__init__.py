"""Distributed training: the loop behind ``refconv train`` and its parts, one module each.

- :mod:`refconv.train.loop`: :func:`train`, the loop over epochs and steps;
- :mod:`refconv.train.inputs`: the data and the model, checked (:func:`load_dataset`, :func:`build_model`, ...);
- :mod:`refconv.train.stepping`: one :func:`step`, the :func:`learning_rate` of each step, and the test
  metric (:func:`evaluate`);
- :mod:`refconv.train.guards`: :class:`Diverged` and the loss guards;
- :mod:`refconv.train.checkpoints`: what a checkpoint records besides its tensors, saving and resuming;
- :mod:`refconv.train.report`: the end-of-run summary (:func:`format_summary`), the overlap measured
  and --timeline;
- :mod:`refconv.train.serial_check`: ``--check-serial``'s one-rank replay;
- :mod:`refconv.train.progress`: the header lines, the progress bar and --metrics-out.

The options are :class:`refconv.train_config.TrainConfig`, outside this package so that a tool
reads them without loading the loop; the ``refconv train`` command is
:mod:`refconv.commands.train`.  The names below are spelled ``refconv.train.NAME`` everywhere;
every other name is spelled with its module (``refconv.train.guards.GROWTH_FACTOR``).
"""

from refconv.train.guards import Diverged
from refconv.train.inputs import build_model, load_dataset, load_model_spec
from refconv.train.loop import train
from refconv.train.report import format_summary
from refconv.train.stepping import evaluate, learning_rate, step

__all__ = ["train", "step", "evaluate", "learning_rate", "Diverged", "format_summary", "build_model", "load_dataset",
           "load_model_spec"]
