"""What stops or warns a run that goes wrong: a loss or a tensor that is no longer finite
(:class:`Diverged` on every rank alike, exit status 3, nothing after the last good step saved),
and a loss that grows by a large factor in the first steps (a warning).  :mod:`refconv.train` exports ``Diverged``."""

import math
import warnings

from refconv import checkpoint, collectives, failure


class Diverged(failure.SharedFailure):
    """The loss or the model stopped being finite (raised on every rank alike; exit status 3)."""

    status = 3


def _kept(cfg, saved):
    """What a diverged run leaves behind, for its one line."""
    if not cfg.checkpoint_dir:
        return "lower --lr (it is {:g})".format(cfg.lr)
    last = f"the checkpoint of step {saved}" if saved is not None else "any checkpoint already there"
    return f"{last} in {cfg.checkpoint_dir!r} is kept; lower --lr (it is {cfg.lr:g})"


def check_loss(cfg, loss, global_step, saved):
    """Raise :class:`Diverged` if ``loss`` (the same on every rank) is not finite; a shapes-only run
    (``loss`` None) has no loss to check."""
    if loss is not None and not math.isfinite(loss):
        raise Diverged(f"training diverged: the loss of step {global_step} is {loss}; nothing of it is "
                       f"saved: {_kept(cfg, saved)}")


GROWTH_STEPS, GROWTH_FACTOR = 20, 4.0  # the loss guard: the first 20 steps, 4 x the first step's loss


def check_growth(cfg, losses, first_step):
    """Warn (once; the loss is the same on every rank, so every rank alike) when a loss of the run's
    first :data:`GROWTH_STEPS` steps exceeds :data:`GROWTH_FACTOR` x its first: a learning rate too
    large for the batch.  ResNet-50 at lr 0.1 and batch 8 went 7.29, 23.3, 21.3, 51.6 (7 x at the
    fourth step) where its recipe's 0.003125 stays within 1.02 x (2026-12-04, --synthetic 32x32); a
    loss that falls has no reason to quadruple, and a noisy one of a small batch stays under it."""
    k = len(losses)
    if None in losses:   # a shapes-only run: no loss
        return
    if k > GROWTH_STEPS or k < 2 or losses[-1] <= GROWTH_FACTOR * losses[0] \
            or any(loss > GROWTH_FACTOR * losses[0] for loss in losses[1:-1]):
        return
    warnings.warn(f"the loss grew from {losses[0]:.4g} (step {first_step}) to {losses[-1]:.4g} (step "
                  f"{first_step + k - 1}), more than {GROWTH_FACTOR:g} x in the first {GROWTH_STEPS} steps: the "
                  f"learning rate {cfg.lr:g} may be too large for batch {cfg.batch_size} (--lr; unset, the model's "
                  f"recipe decides, docs/training.md)", stacklevel=2)


def check_finite(cfg, comm, model, optimizer, global_step, saved):
    """Collective: raise :class:`Diverged` on every rank if any rank holds a tensor with a
    NaN or an infinity (named in the message) after step ``global_step``.  A shapes-only model has no
    values to check (every rank runs the same backend, so none calls the collective)."""
    if not getattr(getattr(model, "backend", None), "values", True):    # a model without a backend has values
        return
    bad = [b for b in collectives.allgather_object(comm, checkpoint.nonfinite(model, optimizer)) if b]
    if bad:
        raise Diverged(f"training diverged: after step {global_step}, {bad[0]} are not finite (NaN or "
                       f"inf); nothing of it is saved: {_kept(cfg, saved)}")
