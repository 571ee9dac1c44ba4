"""One training step on a global batch, the learning rate of each step, and the test metric
(accuracy, or the mean squared error of a regression).  :mod:`refconv.train` exports ``step``,
``evaluate`` and ``learning_rate``."""

import math

import numpy

from refconv import collectives, datastore
from refconv.shapes.errors import NoValues
from refconv.train.inputs import is_regression, smallest_batch


def learning_rate(cfg, step, total_steps):
    """The learning rate of step ``step`` (0-based) of ``total_steps``."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return 0.5 * cfg.lr * (1 + math.cos(math.pi * step / max(total_steps, 1)))


def step(model, optimizer, x_b, y_b):
    """One training step on the global batch ``(x_b, y_b)``; returns the loss (same on every rank), None
    on a shapes-only backend (``x_b`` may then be anything with the batch's shape and dtype)."""
    model.bind(x_b.shape)
    backend = model.backend
    if backend.values:
        x_loc = backend.asarray(datastore.local_block(x_b, model.input_distribution, model.in_grid.rank))
    else:       # no values to cut: a block of this rank's shape
        x_loc = backend.zeros(model.input_distribution.local_shape(model.in_grid.rank), x_b.dtype)
    y_loc = backend.asarray(model.label_block(numpy.asarray(y_b)))
    loss = model.loss(model.forward(x_loc), y_loc)
    model.backward()
    optimizer.step()
    return loss


def evaluate(model, x, y, batch_size):
    """Accuracy on ``(x, y)`` with the running statistics (``model.eval()``), any number of samples
    (the mean squared error, :func:`evaluate_mse`, for a regression).  The same value on any grid.
    A shapes-only model has no outputs to score: ``NoValues``."""
    if not model.backend.values:
        raise NoValues("evaluate (scoring a test set)", "the model's outputs")
    if is_regression(model):
        return evaluate_mse(model, x, y, batch_size)
    correct = sum(int(((out.reshape(len(out), -1).argmax(axis=1) == labels) & real).sum())
                  for out, labels, real in _eval_batches(model, x, y, batch_size))
    total = collectives.allreduce(model.out_grid.axis_comm("sample"), numpy.array([correct], numpy.int64))
    return int(total[0]) / len(y)


def evaluate_mse(model, x, y, batch_size):
    """The mean squared error on ``(x, y)`` (targets ``(n, K)``) with the running statistics."""
    squares = sum(float((((out - targets) * real[:, None]).astype(numpy.float64) ** 2).sum())
                  for out, targets, real in _eval_batches(model, x, y, batch_size))
    total = collectives.allreduce(model.out_grid.axis_comm("sample"), numpy.array([squares]))
    return float(total[0]) / y.size


def _eval_batches(model, x, y, batch_size):
    """Yield ``(outputs, labels, real)`` of this rank's samples, batch by batch, in eval mode.

    Every batch has ``batch_size`` samples (at least :func:`smallest_batch`): the last one
    is padded with copies of its first sample, so it splits over the sample axis and the
    model keeps its binding.  In eval mode a sample's output depends on that sample alone,
    so the padding changes nothing; ``real`` is False on it, so it is not counted."""
    model.eval()
    backend = model.backend
    n, size = len(y), max(batch_size, smallest_batch(model))
    for start in range(0, n, size):
        idx = numpy.arange(start, min(start + size, n))
        real = numpy.arange(size) < len(idx)                       # (size,): False on the padding
        idx = numpy.concatenate([idx, numpy.full(size - len(idx), idx[0])])
        x_b, y_b = x[idx], numpy.asarray(y[idx])
        model.bind(x_b.shape)
        x_loc = backend.asarray(datastore.local_block(x_b, model.input_distribution, model.in_grid.rank))
        out = backend.to_host(model.forward(x_loc))                # (n_loc, K): logits or predictions
        yield out, model.label_block(y_b), model.label_block(real)
    model.train()
