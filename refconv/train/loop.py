"""Distributed training: the loop behind ``refconv train``.

One step, on every rank::

    x_b, y_b = next global batch              same on every rank (refconv.datasets.batches:
                                              a function of seed and epoch only)
    x_loc = model.input_distribution.extract(x_b, rank)      this rank's block (of a store: read, of
                                              --synthetic samples: made, and only it:
                                              refconv.datastore.local_block)
    y_loc = model.label_block(y_b)                            labels of its samples
    loss  = model.loss(model.forward(x_loc), y_loc)           global mean (allreduce)
    model.backward(); sgd.step()                              local shards only

Nothing but the layers communicates, so ``collectives.stats`` recorded around a
step is exactly the traffic of one training step.  Checkpoints (every epoch, if a
directory is given) hold the parameters, SGD's momentum and BatchNorm's running
statistics; ``resume`` reloads them onto the current grids (any strategy).

A run that diverges stops: a loss that is not finite (the same on every rank: it is
an allreduced mean), or a parameter, buffer or momentum shard with a NaN or an
infinity on any rank before a checkpoint is saved or the run ends, raises
:class:`refconv.train.Diverged` on every rank alike, naming the step and the tensor; ``refconv
train`` ends with that one line and exit status 3.  Nothing after the last good
step is saved: the last checkpoint stays as it was.

Every check of the options, the data and the model runs before the first step and
depends only on them, so every rank raises the same ``ValueError``.  The options
themselves are defined once, in :mod:`refconv.train_config`.

This module is the loop (:func:`train`); the ``refconv train`` command that runs it is
:mod:`refconv.commands.train`, and the rest of a run lives beside it in :mod:`refconv.train`:

- :mod:`refconv.train.inputs`: the data and the model, checked (``load_dataset``, ``build_model``, ...);
- :mod:`refconv.train.stepping`: one step, the learning rate of each step, and the test metric;
- :mod:`refconv.train.guards`: :class:`~refconv.train.guards.Diverged` and the loss guards;
- :mod:`refconv.train.checkpoints`: what a checkpoint records besides its tensors, saving and resuming;
- :mod:`refconv.train.report`: the end-of-run summary, the overlap measured and --timeline;
- :mod:`refconv.train.serial_check`: ``--check-serial``'s one-rank replay;
- :mod:`refconv.train.progress`: the header lines, the progress bar and --metrics-out.
"""

import contextlib
import os
import time

import numpy
from mpi4py import MPI

from refconv import checkpoint, checks, collectives, datasets, datastore, device, failure, overlap, threads, train_config
from refconv.collectives import KINDS, flight
from refconv.optim import SGD
from refconv.train import checkpoints, progress
from refconv.train.guards import check_finite, check_growth, check_loss
from refconv.train.inputs import (adaptation, build_model, check_channels, check_model_fits, is_regression, load_dataset,
                                  store_kind)
from refconv.train.report import TIMELINE_STEPS, overlap_report
from refconv.train.serial_check import check_serial
from refconv.train.stepping import evaluate, learning_rate, step
from refconv.train_config import OptionError

__all__ = ["train"]


def train(cfg, *, comm=None, log=print, report=None):
    """Run ``cfg`` (a :class:`refconv.train_config.TrainConfig`); returns a dict of results (``losses`` per step,
    ``epochs``, ``accuracy``, ``time_per_step``, ``bytes_per_step`` and ``calls_per_step`` per
    kind averaged over ranks, ``serial_check``).  ``log`` prints rank 0's lines; ``report``
    (default: stderr) receives progress.  Every collective runs under ``cfg.timeout``."""
    cfg.validate()
    comm = comm or MPI.COMM_WORLD
    with collectives.timeout(cfg.timeout), failure.training(comm), _outputs(cfg, comm):
        return _train(cfg, comm, log if comm.Get_rank() == 0 else (lambda *a, **k: None), report)


@contextlib.contextmanager
def _outputs(cfg, comm):
    """Collective: check --metrics-out and --checkpoint-dir on every rank before any work (the
    first rank's error is raised on every rank alike), then hold the checkpoint folder's lock
    (rank 0) for the run, so that a second run writing it is refused at its start."""
    error = None
    for name, check in (("metrics_out", checks.output_file), ("checkpoint_dir", checks.output_folder),
                        ("timeline", overlap.check_timeline_path)):
        try:
            if getattr(cfg, name) is not None:
                check(getattr(cfg, name), name)
        except ValueError as exc:
            error = error or (name, str(exc).removeprefix(f"{name}: "))
    held = None
    if error is None and cfg.checkpoint_dir and comm.Get_rank() == 0:
        try:
            held = checkpoint.lock(cfg.checkpoint_dir)
        except (OSError, checkpoint.CheckpointError) as exc:
            error = ("checkpoint_dir", str(exc))
    errors = [e for e in collectives.allgather_object(comm, error) if e]
    if errors:
        if held is not None:
            os.close(held)
        raise OptionError(*errors[0])
    if cfg.checkpoint_dir:      # the ranks' call records, should the run hang (refconv diagnose)
        flight.set_directory(os.path.join(cfg.checkpoint_dir, "calls"))
    try:
        yield
    finally:
        if held is not None:
            os.close(held)


def _bind(cfg, comm):
    """BLAS threads per rank, then this rank's GPU (collectives: every rank calls them)."""
    choice = threads.configure(comm, requested=cfg.threads)
    binding, _ = device.bind(comm, cfg.backend, oversubscribe=cfg.oversubscribe_gpus)
    return choice, binding


def _prepare(cfg, comm):
    """Data, model and optimizer, every input checked (the same errors on every rank)."""
    ranks = comm.Get_size()
    if cfg.grid:
        train_config.check_grid_ranks(cfg.grid, ranks)
    x_train, y_train, x_test, y_test, num_classes = load_dataset(cfg, numpy.dtype(cfg.dtype))
    check_channels(cfg, x_train.shape)
    model = build_model(cfg, comm=comm, in_channels=x_train.shape[1], num_classes=num_classes)
    model.set_overlap(cfg.overlap)  # gradient allreduces behind backward (--no-overlap: waited at once)
    model.set_buckets(cfg.bucket_kib * 1024)  # the same buckets either way
    check_model_fits(model, cfg, x_train.shape, num_classes)
    per_epoch = datasets.num_batches(len(y_train), cfg.batch_size, drop_last=True)
    if per_epoch < 1:
        raise OptionError("batch_size", f"{cfg.batch_size} is larger than the training set "
                                        f"({len(y_train)} samples)")
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return model, optimizer, (x_train, y_train, x_test, y_test, num_classes), per_epoch


def _train(cfg, comm, say, report):
    rank = comm.Get_rank()
    choice, binding = _bind(cfg, comm)
    model, optimizer, (x_train, y_train, x_test, y_test, num_classes), per_epoch = _prepare(cfg, comm)
    total_steps = per_epoch * cfg.epochs
    start_epoch, start_batch, global_step = 0, 0, 0
    if cfg.resume:
        global_step = checkpoints.resume(cfg, model, optimizer, per_epoch, total_steps)
        start_epoch, start_batch = divmod(global_step, per_epoch)
        say(f"resumed from {cfg.checkpoint_dir} at step {global_step} (epoch {start_epoch + 1})")
    data = progress.data_lines(cfg, x_train, model, store_kind(cfg), adaptation(cfg, model, x_train.shape, num_classes))
    for line in progress.header(model, cfg, comm.Get_size(), binding, choice, len(y_train), len(y_test), per_epoch,
                                data):
        say(line)

    bar = progress.Progress(total_steps=total_steps, epochs=cfg.epochs, batch_size=cfg.batch_size,
                            every=cfg.log_every, stream=report, enabled=cfg.progress and rank == 0)
    metrics = progress.Metrics(cfg.metrics_out if rank == 0 else None)
    losses, epochs, totals, step_times = [], [], {}, []
    hidden, drawn = {}, {}            # this rank's overlap figures summed over steps; --timeline's steps
    saved = global_step if cfg.resume else None      # the step of the last checkpoint this run vouches for
    stop = False
    try:
        for epoch in range(start_epoch, cfg.epochs):
            first = start_batch if epoch == start_epoch else 0
            epoch_losses = []
            batches = datastore.batches(x_train, y_train, cfg.batch_size, seed=cfg.seed, epoch=epoch,  # read ahead
                                        drop_last=True, start=first, distribution=model.input_distribution,
                                        rank=model.in_grid.rank, depth=cfg.prefetch, reader=cfg.prefetch_reader)
            for b, (x_b, y_b) in enumerate(batches, start=first):
                optimizer.lr = learning_rate(cfg, global_step, total_steps)
                t0 = time.perf_counter()
                with collectives.stats.recording() as region, collectives.stats.timeline() as events:
                    loss = step(model, optimizer, x_b, y_b)
                seconds = time.perf_counter() - t0
                hid = overlap.hidden_by_kind([e for e in events if e["kind"] in KINDS])  # not communicator splits
                overlap.add(hidden, hid)
                if cfg.timeline and len(losses) < TIMELINE_STEPS:
                    drawn[f"step {global_step + 1}"] = {"seconds": seconds, "calls": overlap.relative(events, t0)}
                global_step += 1
                check_loss(cfg, loss, global_step, saved)
                losses.append(loss)
                check_growth(cfg, losses, global_step - len(losses) + 1)
                moved = region.summary(moved_only=True)  # calls on one-rank communicators move nothing
                _add(totals, moved)
                step_times.append(seconds)
                epoch_losses.append(loss)
                metrics.write(step=global_step, epoch=epoch + 1, loss=loss, lr=optimizer.lr, step_time_s=seconds,
                              images_per_s=cfg.batch_size / seconds, collectives=progress.per_kind(moved, region.seconds),
                              overlap=hid)
                bar.step(epoch, b + 1, per_epoch, global_step, loss)
                if cfg.checkpoint_dir and cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0:
                    check_finite(cfg, comm, model, optimizer, global_step, saved)
                    checkpoints.save(cfg, model, optimizer, global_step, per_epoch)
                    saved = global_step
                if cfg.max_steps is not None and len(losses) >= cfg.max_steps:
                    stop = True
                    break
            bar.end_epoch()
            check_finite(cfg, comm, model, optimizer, global_step, saved)
            metric = "mse" if is_regression(model) else "accuracy"
            if model.backend.values:
                score = evaluate(model, x_test, y_test, cfg.batch_size)
                epochs.append({"epoch": epoch + 1, "loss": float(numpy.mean(epoch_losses)), metric: score})
                say(f"epoch {epoch + 1}/{cfg.epochs}: loss {epochs[-1]['loss']:.4f}, test {metric} {score:.4f}")
            else:       # shapes-only: no loss, no outputs to score
                epochs.append({"epoch": epoch + 1, "loss": None, metric: None})
                say(f"epoch {epoch + 1}/{cfg.epochs}: no loss and no test {metric} (shapes-only run)")
            if cfg.checkpoint_dir and not (cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0):
                checkpoints.save(cfg, model, optimizer, global_step, per_epoch)
                saved = global_step
            if stop:
                break
        measured = overlap_report(cfg, comm, model, hidden, drawn, len(losses), metrics)
    finally:
        metrics.close()

    steps = len(losses)
    kinds = numpy.array([[totals.get(k, {}).get("bytes", 0), totals.get(k, {}).get("calls", 0)] for k in KINDS],
                        numpy.float64)
    kinds = collectives.allreduce(comm, kinds) / comm.Get_size()  # averaged over ranks
    result = {
        "losses": losses, "epochs": epochs, **{m: e[m] for e in epochs[-1:] for m in ("accuracy", "mse") if m in e},
        "steps": steps, "time_per_step": float(numpy.mean(step_times)),
        "bytes_per_step": {k: kinds[i, 0] / steps for i, k in enumerate(KINDS) if kinds[i, 1]},
        "calls_per_step": {k: kinds[i, 1] / steps for i, k in enumerate(KINDS) if kinds[i, 1]},
        "model": model, "serial_check": None, **measured,
    }
    if cfg.check_serial:
        result["serial_check"] = check_serial(cfg, losses, comm, x_train, y_train, num_classes, say)
    model.close()   # its grids' sub-communicators (collective): result["model"] is for reading (weights, records), not for steps
    return result


def _add(totals, summary):
    for kind, s in summary.items():
        t = totals.setdefault(kind, {"calls": 0, "bytes": 0})
        t["calls"] += s["calls"]
        t["bytes"] += s["bytes"]
