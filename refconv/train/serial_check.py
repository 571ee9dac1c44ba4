"""``--check-serial K``: rank 0 replays the run's first K steps on the model's one-rank twin and
compares the losses."""

import numpy

from refconv import collectives, datasets
from refconv.optim import SGD
from refconv.train.inputs import build_model
from refconv.train.stepping import learning_rate, step


def serial_losses(cfg, model, k, x_train, y_train):
    """The first ``k`` losses of the same run on ``model``, the one-rank twin (numpy backend)."""
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    out, epoch = [], 0
    total = datasets.num_batches(len(y_train), cfg.batch_size, drop_last=True) * cfg.epochs
    while len(out) < k:
        for x_b, y_b in datasets.batches(x_train, y_train, cfg.batch_size, seed=cfg.seed, epoch=epoch,
                                         drop_last=True):
            optimizer.lr = learning_rate(cfg, len(out), total)
            out.append(step(model, optimizer, x_b, y_b))
            if len(out) == k:
                break
        epoch += 1
    return out


def check_serial(cfg, losses, comm, x_train, y_train, num_classes, say):
    """Rank 0 replays the first K steps on one rank and compares; returns the largest relative difference."""
    if cfg.resume:
        say("check-serial: skipped (the serial replay starts from step 0; this run was resumed)")
        return None
    k = min(cfg.check_serial, len(losses))
    rtol = 1e-6 if numpy.dtype(cfg.dtype) == numpy.float64 else 1e-3
    worst = numpy.zeros(1)
    if comm.Get_rank() == 0:
        twin = build_model(cfg, serial=True, in_channels=x_train.shape[1], num_classes=num_classes)
        serial = serial_losses(cfg, twin, k, x_train, y_train)
        twin.close()
        say(f"check-serial: the first {k} steps replayed on one rank (rtol {rtol:g})")
        say(f"  {'step':>4}  {'distributed':>14}  {'serial':>14}  {'rel. diff':>9}")
        for i, (a, b) in enumerate(zip(losses, serial)):
            rel = abs(a - b) / max(abs(b), 1e-30)
            worst[0] = max(worst[0], rel)
            say(f"  {i + 1:>4}  {a:14.8f}  {b:14.8f}  {rel:9.2e}")
    worst = collectives.bcast(comm, worst)
    ok = worst[0] <= rtol
    say(f"check-serial: {'OK' if ok else 'MISMATCH'} (largest relative difference {worst[0]:.2e})")
    if not ok:
        raise AssertionError(f"check-serial: distributed and serial losses differ by {worst[0]:.2e} > {rtol:g}")
    return float(worst[0])
