"""A model's training recipe: what ``refconv train`` uses for the options left unset.

A preset brings its own (:data:`PRESET_RECIPES`); a model file may hold one under ``"train"``,
and ``refconv plan --out`` writes the planned preset's there, with the image size it planned
for, so that ``refconv train --model plan.yaml`` trains as ``--model resnet50`` does::

    train:
      lr: 0.1            # the peak learning rate at a global batch of lr_batch ...
      lr_batch: 256      # ... scaled linearly to --batch-size (Goyal et al. 2017); null: not scaled
      lr_schedule: cosine
      momentum: 0.9
      weight_decay: 0.0001
      loss: cross-entropy  # must be the model's own "loss" (a record, checked, not a setting)
      image_size: 224      # the planned input size (--synthetic samples, a --data folder's images)

A flag given on the command line (or a :class:`refconv.train_config.TrainConfig` field set)
wins over the recipe; an option neither sets takes :data:`FALLBACK`.  :func:`check` refuses a
recipe edited into nonsense with a ValueError naming the key and what would be right; it depends
on the file only, so every rank raises it alike.
"""

import math
import numbers

from refconv.spec_tree import LOSSES

FALLBACK = {"lr": 0.1, "lr_batch": None, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 1e-4,
            "image_size": 32}
SCHEDULES = ("cosine", "constant")
KEYS = tuple(FALLBACK) + ("loss",)
IMAGENET = {"lr": 0.1, "lr_batch": 256, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 1e-4}

# The presets trained on ImageNet take SGD's 0.1 at a batch of 256 and scale it linearly with the
# batch (Goyal et al., "Accurate, large minibatch SGD", 2017).  At batch 4, ResNet-50 with 0.1
# diverged (loss 2.8 -> 70 in one step on --synthetic images); with 0.0016 it does not.
# CosmoFlow regresses targets in [-1, 1) with mean squared error: 0.01, docs/volumes.md's rate.
PRESET_RECIPES = {
    "digits-cnn": {"lr": 0.1, "lr_batch": None, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 1e-4},
    "cosmoflow": {"lr": 0.01, "lr_batch": None, "lr_schedule": "cosine", "momentum": 0.9, "weight_decay": 1e-4},
    **{name: IMAGENET for name in ("resnet50", "resnet50-wide2", "resnet50-wide4", "resnext50-32x4d",
                                   "mobilenet")},
}


def _positive(value, key, where, *, integer=False, optional=False, below=math.inf, zero=False):
    if optional and value is None:
        return
    ok = isinstance(value, numbers.Integral if integer else numbers.Real) and not isinstance(value, bool) \
        and (value >= 0 if zero else value > 0) and value < below and math.isfinite(value)
    if not ok:
        what = "an int" if integer else "a number"
        bound = ">= 0" if zero else "> 0"
        upper = "" if below == math.inf else f" and < {below:g}"
        raise ValueError(f"{where}.{key}: expected {what} {bound}{upper}{' or null' if optional else ''}, "
                         f"got {value!r}")


def check(recipe, where="train", loss=None):
    """``recipe`` (a model file's ``"train"`` dict) checked key by key; ``loss``: the model's own."""
    if not isinstance(recipe, dict):
        raise ValueError(f"{where}: expected a mapping of {', '.join(KEYS)}, got {type(recipe).__name__}")
    bad = sorted(set(recipe) - set(KEYS))
    if bad:
        raise ValueError(f"{where}: unknown key {bad[0]!r}; a recipe takes {', '.join(KEYS)}")
    _positive(recipe.get("lr", 1), "lr", where)
    _positive(recipe.get("lr_batch"), "lr_batch", where, integer=True, optional=True)
    _positive(recipe.get("momentum", 0), "momentum", where, below=1, zero=True)
    _positive(recipe.get("weight_decay", 0), "weight_decay", where, zero=True)
    _positive(recipe.get("image_size", 1), "image_size", where, integer=True)
    if recipe.get("lr_schedule", "cosine") not in SCHEDULES:
        raise ValueError(f"{where}.lr_schedule: expected one of {', '.join(SCHEDULES)}, got "
                         f"{recipe['lr_schedule']!r}")
    if "loss" in recipe and recipe["loss"] not in LOSSES:
        raise ValueError(f"{where}.loss: expected one of {', '.join(LOSSES)}, got {recipe['loss']!r}")
    if "loss" in recipe and loss is not None and recipe["loss"] != loss:
        raise ValueError(f"{where}.loss: the recipe says {recipe['loss']!r} but the model trains with {loss!r} "
                         f"(its top-level 'loss'); make them the same")
    return recipe


def of(spec, name=None):
    """The recipe of a model: ``name``'s preset recipe when it is a preset, else the ``"train"``
    section of ``spec`` (a dict), checked; keys it leaves out are absent (not filled in)."""
    if name in PRESET_RECIPES:
        return dict(PRESET_RECIPES[name])
    if isinstance(spec, dict) and "train" in spec:
        return dict(check(spec["train"], loss=spec.get("loss", LOSSES[0])))
    return {}


def value(recipe, key):
    """``recipe``'s ``key``, else the fallback."""
    return recipe.get(key, FALLBACK[key])


def learning_rate(recipe, batch_size):
    """The peak learning rate at ``batch_size``: ``lr`` x batch_size / ``lr_batch`` (the linear
    scaling rule), or ``lr`` itself when the recipe does not scale it."""
    lr, batch = value(recipe, "lr"), value(recipe, "lr_batch")
    return lr if batch is None else lr * batch_size / batch


def lr_text(recipe, batch_size):
    """How the learning rate of ``recipe`` was reached, for the run's header."""
    lr, batch = value(recipe, "lr"), value(recipe, "lr_batch")
    return f"{lr:g}" if batch is None else f"{lr:g} x batch {batch_size} / {batch}"


def for_plan(spec, name, image_size):
    """The ``"train"`` section ``refconv plan --out`` writes: the model's recipe (a preset's, or
    the file's own), every key filled in, with the ``image_size`` it planned for."""
    out = {key: value(of(spec, name), key) for key in FALLBACK}
    out["loss"] = spec.get("loss", LOSSES[0])
    out["image_size"] = int(image_size)
    return out
