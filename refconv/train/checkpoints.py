"""Checkpoint and resume glue of ``refconv train``: what a checkpoint records besides its tensors
(:func:`run_record`), saving one, and resuming from one (the step to continue from, with a
warning when the run resumed has other settings).  The tensors themselves: :mod:`refconv.checkpoint`."""

import warnings

from refconv import checkpoint
from refconv.train_config import OptionError


RUN_KEYS = ("seed", "epochs", "steps_per_epoch", "batch_size", "lr", "lr_schedule", "momentum", "weight_decay")


def run_record(cfg, per_epoch):
    """What decides the steps after a checkpoint besides its tensors: the data order (seed, batch),
    the learning rate of each step (its peak, schedule and the run's length) and SGD's settings."""
    return {"seed": cfg.seed, "epochs": cfg.epochs, "steps_per_epoch": per_epoch, "batch_size": cfg.batch_size,
            "lr": cfg.lr, "lr_schedule": cfg.lr_schedule, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay}


def save(cfg, model, optimizer, global_step, per_epoch):
    """A checkpoint at ``global_step`` with :func:`run_record`; the data position follows from it
    (``divmod(step, per_epoch)``)."""
    checkpoint.save(cfg.checkpoint_dir, model, optimizer, step=global_step, extra=run_record(cfg, per_epoch))


def check_resumed(cfg, extra, per_epoch):
    """Warn (every rank alike: ``extra`` is rank 0's, sent to all) when the run resumed differs from
    the one that saved the checkpoint in what decides its steps: it continues on its own schedule
    (e.g. more --epochs stretch the cosine), so it matches no uninterrupted run of either settings.
    A checkpoint of a run that kept only its seed is compared on the seed."""
    saved = extra if isinstance(extra, dict) else {}
    now = run_record(cfg, per_epoch)
    changed = [f"{key} {saved[key]!r} -> {now[key]!r}" for key in RUN_KEYS if key in saved and saved[key] != now[key]]
    if changed:
        warnings.warn(f"--resume: the checkpoint in {cfg.checkpoint_dir!r} was saved by a run with other settings "
                      f"({', '.join(changed)}); this run continues on its own, so it will not equal an "
                      f"uninterrupted run of either", stacklevel=2)


def resume(cfg, model, optimizer, per_epoch, total_steps):
    """Load the checkpoint of ``cfg.checkpoint_dir`` into ``model`` and ``optimizer``; returns its
    step (the data position follows from it: ``divmod(step, per_epoch)``).  Warns when it was saved
    by a run of other settings (:func:`check_resumed`); a checkpoint at the run's end is an error."""
    global_step, extra = checkpoint.load(cfg.checkpoint_dir, model, optimizer)
    check_resumed(cfg, extra, per_epoch)
    if global_step >= total_steps:
        raise OptionError("resume", f"the checkpoint in {cfg.checkpoint_dir!r} is at step {global_step}, the "
                                    f"end of a {cfg.epochs}-epoch run of {per_epoch} steps per epoch; raise "
                                    f"{{epochs}} to train further")
    return global_step
