"""The losses, over the global batch: softmax cross-entropy (classification) and mean
squared error (regression, as CosmoFlow's).  ``LOSSES`` names them as a model spec's
``"loss"`` does."""

from refconv import collectives
from refconv.backend import get_backend
from refconv.pricing.records import loss_records


class SoftmaxCrossEntropy:
    """Mean cross-entropy over the **global** batch, on the grid of the logits.

    ``loss = allreduce_sample(sum of local losses) / N``; ``dlogits = (p - onehot) / N``.
    Every channel and spatial peer holds the same logits and computes the same values.
    """

    def __init__(self, *, grid, backend="auto"):
        self.grid = grid
        self.backend = get_backend(backend) if isinstance(backend, str) else backend

    def forward(self, logits_loc, labels_loc, global_batch):
        """``logits_loc (n, K)``, ``labels_loc (n,)`` ints -> the global mean loss (a float)."""
        xp = self.backend.xp
        n, K = logits_loc.shape
        if tuple(labels_loc.shape) != (n,):
            raise ValueError(f"labels_loc: expected {n} labels (this rank's samples), got shape {tuple(labels_loc.shape)}")
        shifted = logits_loc - logits_loc.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        labels = xp.asarray(labels_loc)
        local_sum = -log_probs[xp.arange(n), labels].sum(keepdims=True)  # (1,)
        total = collectives.allreduce(self.grid.axis_comm("sample"), local_sum)
        self._probs, self._labels, self._N = xp.exp(log_probs), labels, global_batch
        value = self.backend.scalar(total)    # None on a shapes-only backend: no loss to report
        return None if value is None else value / global_batch

    def records(self, itemsize=4):
        """The call one forward and backward make on this rank, for logits of ``itemsize`` bytes."""
        return loss_records(self.grid.shape, itemsize)

    def backward(self):
        """``dlogits (n, K) = (softmax - onehot(labels)) / N`` with N the global batch."""
        xp = self.backend.xp
        d = self._probs.copy()
        d[xp.arange(d.shape[0]), self._labels] -= 1
        return d / self._N


class MeanSquaredError:
    """Mean squared error over the **global** batch and every output, on the grid of the predictions.

    ``loss = allreduce_sample(sum of local (pred - target)^2) / (N K)``;
    ``dpred = 2 (pred - target) / (N K)``.  Every channel and spatial peer holds the same
    predictions and computes the same values (forward: one allreduce over the sample axis ·
    backward: local), as :class:`SoftmaxCrossEntropy` does.
    """

    def __init__(self, *, grid, backend="auto"):
        self.grid = grid
        self.backend = get_backend(backend) if isinstance(backend, str) else backend

    def forward(self, pred_loc, targets_loc, global_batch):
        """``pred_loc (n, K)``, ``targets_loc (n, K)`` floats -> the global mean loss (a float)."""
        xp = self.backend.xp
        if tuple(targets_loc.shape) != tuple(pred_loc.shape):
            raise ValueError(f"targets_loc: expected this rank's targets of shape {tuple(pred_loc.shape)} "
                             f"(its samples x the head's outputs), got {tuple(targets_loc.shape)}")
        diff = pred_loc - xp.asarray(targets_loc, dtype=pred_loc.dtype)  # (n, K)
        local_sum = (diff * diff).sum(keepdims=True).reshape(1)  # (1,)
        total = collectives.allreduce(self.grid.axis_comm("sample"), local_sum)
        self._diff, self._count = diff, global_batch * pred_loc.shape[1]
        value = self.backend.scalar(total)
        return None if value is None else value / self._count

    def records(self, itemsize=4):
        """The call one forward and backward make on this rank, for predictions of ``itemsize`` bytes."""
        return loss_records(self.grid.shape, itemsize)

    def backward(self):
        """``dpred (n, K) = 2 (pred - target) / (N K)``."""
        return self._diff * (2.0 / self._count)


LOSSES = {"cross-entropy": SoftmaxCrossEntropy, "mse": MeanSquaredError}
