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
:class:`Diverged` on every rank alike, naming the step and the tensor; ``refconv
train`` ends with that one line and exit status 3.  Nothing after the last good
step is saved: the last checkpoint stays as it was.

Every check of the options, the data and the model runs before the first step and
depends only on them, so every rank raises the same ``ValueError``.  The options
themselves are defined once, in :mod:`refconv.train_config`.
"""

import contextlib
import json
import math
import os
import time
import warnings

import numpy
from mpi4py import MPI

from refconv import (checkpoint, checks, collectives, datasets, datastore, device, failure, overlap, progress, threads,
                     train_config)
from refconv.collectives import KINDS
from refconv.layers import MeanSquaredError
from refconv.model import Model
from refconv.model_spec import PRESETS, load_spec
from refconv.optim import SGD
from refconv.pricing import machine as machine_mod
from refconv.train_config import MAX_CLASSES, OptionError, TrainConfig

__all__ = ["TrainConfig", "Diverged", "train", "step", "evaluate", "learning_rate", "format_summary", "add_arguments",
           "run"]

class Diverged(failure.SharedFailure):
    """The loss or the model stopped being finite (raised on every rank alike; exit status 3)."""

    status = 3




# -- what the run trains on ----------------------------------------------------------------------
def load_model_spec(model, **preset_kwargs):
    """The spec dict of ``model``; a file that does not parse is an OptionError, not yaml's own."""
    try:
        return load_spec(model, **preset_kwargs)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OptionError("model", f"{model!r} is not valid JSON: {exc}") from None
    except ImportError:
        raise OptionError("model", f"{model!r}: reading YAML needs PyYAML (pip install pyyaml)") from None
    except ValueError as exc:
        raise OptionError("model", str(exc).removeprefix("spec: ")) from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "yaml":
            raise
        text = " ".join(str(exc).split())   # yaml's message spans lines; e.g. a !!python tag is refused
        raise OptionError("model", f"{model!r} is not a valid YAML model (safe_load: {text})") from None


def load_dataset(cfg, dtype):
    """``(x_train, y_train, x_test, y_test, num_classes)``: ``--synthetic`` samples (of the model's
    channels, images or volumes as its ``dims``), ``--data``, or the digits; for a regression
    ``num_classes`` is the number of targets per sample.  The data must be of the model's dims,
    and bring targets to a regression (loss ``"mse"``) and class labels to a classifier."""
    spec = load_model_spec(cfg.model)
    name, dims = spec.get("name", cfg.model), spec.get("dims", 2)
    if cfg.synthetic:
        data = load_synthetic(cfg, spec, dtype)
    elif cfg.data:
        data = load_data(cfg, dtype)
    elif dims == 3:
        raise OptionError("model", f"{name!r} is a model of volumes (dims 3), which trains on --synthetic volumes "
                                   f"or on --data with volumes (N, C, D, H, W); add one of them")
    else:
        data = (*datasets.load_digits(dtype=dtype), 10)
    x, y = data[0], data[1]
    if x.ndim - 2 != dims:
        raise OptionError("data", f"{cfg.data!r} holds {'volumes' if x.ndim == 5 else 'images'} {tuple(x.shape[1:])} "
                                  f"per sample but {name!r} is a model of dims {dims}; give it "
                                  f"{'volumes (N, C, D, H, W)' if dims == 3 else 'images (N, C, H, W)'}")
    regression = spec.get("loss") == "mse"
    if regression and not datasets.is_targets(y):
        raise OptionError("model", f"{name!r} regresses (loss 'mse') float targets (N, K), which --synthetic "
                                   f"volumes or --data with float targets bring; the images here have class labels: "
                                   f"use loss 'cross-entropy'")
    if datasets.is_targets(y) and not regression:
        raise OptionError("data", f"{cfg.data!r} holds float targets y (N, {y.shape[1]}), which only a regression "
                                  f"takes; give the model loss 'mse', or give class labels y (N,) ints")
    return data


def load_synthetic(cfg, spec, dtype):
    """``load_dataset`` of ``--synthetic``: :func:`refconv.datasets.synthetic_for`'s samples for
    training, and a quarter as many other samples of the same classes (``part=1``: the class
    patterns depend on the seed only) for testing, each a lazy
    :class:`refconv.datastore.StoreImages` over its generator.  A batch is then a list of sample
    numbers, and a rank makes only its block of it (its samples, and of them its channels,
    planes, rows and columns), read ahead as a store's block is; the labels, every rank all."""
    x, y, k = datasets.synthetic_for(spec, cfg.synthetic_samples, cfg.image_size, seed=cfg.seed, dtype=dtype)
    xt, yt, _ = datasets.synthetic_for(spec, max(cfg.synthetic_samples // 4, 1), cfg.image_size,
                                       seed=cfg.seed, dtype=dtype, part=1)
    return datastore.StoreImages(x, range(len(x)), dtype), y, datastore.StoreImages(xt, range(len(xt)), dtype), yt, k


def load_data(cfg, dtype):
    """``load_dataset`` of ``--data``: an .npz in memory or a store read by block, 20% held out
    for testing (of each class; of all samples for targets)."""
    x, y = datastore.load(cfg.data, dtype=dtype, image_size=cfg.image_size)
    if datasets.is_targets(y):
        num_classes = y.shape[1]                                         # targets per sample
    else:
        num_classes = int(y.max()) + 1
        if num_classes > MAX_CLASSES:
            raise OptionError("data", f"{cfg.data!r} has a label {num_classes - 1}: labels must be class "
                                      f"numbers 0..num_classes-1, with at most {MAX_CLASSES:,} classes")
    x_train, y_train, x_test, y_test = datasets.split(x, y, 0.2, seed=cfg.seed)
    if len(y_test) == 0:
        raise OptionError("data", f"{cfg.data!r} has too few samples to hold any out for testing (20% of "
                                  f"each class, rounded); give at least 3 samples of some class")
    return x_train, y_train, x_test, y_test, num_classes


def data_text(cfg):
    """The data a run trains on, in words (its errors and its header)."""
    if cfg.synthetic:
        return "--synthetic samples"
    return f"--data {cfg.data!r}" if cfg.data else "the bundled digits"


def check_channels(cfg, x_shape):
    """A model file (a plan of another preset, say) must take the data's channels: one OptionError
    naming both, and the input the file was planned for, before a layer refuses the shape."""
    if isinstance(cfg.model, str) and cfg.model in PRESETS:
        return                                           # a preset is sized to the data (build_model)
    spec = load_model_spec(cfg.model)
    channels = spec.get("in_channels")
    if channels is None or channels == x_shape[1]:
        return
    planned = spec.get("train", {}).get("image_size")
    planned = f", planned for {channels}-channel inputs of size {planned}" if planned else ""
    raise OptionError("model", f"{spec.get('name', cfg.model)!r} ({cfg.model if isinstance(cfg.model, str) else 'a dict'}"
                               f"{planned}) takes {channels} input channels but {data_text(cfg)} have {x_shape[1]} "
                               f"(samples {tuple(x_shape[1:])}); give data of {channels} channels (--synthetic makes "
                               f"them), or plan the model for this data")


def store_kind(cfg):
    """``--data``'s kind (:data:`refconv.progress.STORE_KINDS`), or None."""
    if not cfg.data:
        return None
    return "images" if datastore.is_image_folder(cfg.data) else datastore.kind_of(cfg.data)


def adaptation(cfg, model, x_shape, num_classes):
    """What of the model was fitted to the data, as phrases for the header: a preset's input
    channels and classes (``build_model`` sizes them to the data), an image folder's resizing,
    and a planned file's image size where the data's differs."""
    out = []
    if isinstance(cfg.model, str) and cfg.model in PRESETS and not is_regression(model):
        default = PRESETS[cfg.model]()
        classes = default["layers"][-1]["out"]
        if default.get("in_channels", 3) != x_shape[1]:
            out.append(f"{cfg.model} takes {x_shape[1]} input channels (its own: {default.get('in_channels', 3)})")
        if classes != num_classes:
            out.append(f"{num_classes} classes (its own: {classes})")
    if store_kind(cfg) == "images":
        out.append(f"the images are resized to {cfg.image_size}x{cfg.image_size} (--image-size)")
    planned = (model.spec or {}).get("train", {}).get("image_size")
    if planned and any(n != planned for n in x_shape[2:]):
        out.append(f"planned for inputs of size {planned}, trained on {tuple(x_shape[2:])}")
    return out


def is_regression(model):
    """True for a model trained with mean squared error: its targets are floats ``(N, K)``, and its
    test metric is the mean squared error (``"mse"``) instead of the accuracy."""
    return isinstance(model.head, MeanSquaredError)


def build_model(cfg, *, comm=None, serial=False, in_channels=None, num_classes=None):
    """The model of ``cfg`` on ``comm`` (or its serial twin on one rank); a preset is sized to
    ``in_channels`` and ``num_classes`` (a model file or dict is taken as it is)."""
    preset_kwargs = {}
    if isinstance(cfg.model, str) and cfg.model in PRESETS:
        preset_kwargs = {k: v for k, v in (("in_channels", in_channels), ("num_classes", num_classes)) if v}
    defaults = {"grid": cfg.grid, "algorithm": cfg.algorithm, "filter_groups": cfg.filter_groups,
                "machine": cfg.machine}
    return Model.from_spec(load_model_spec(cfg.model, **preset_kwargs), comm=comm,
                           backend="numpy" if serial else cfg.backend, dtype=cfg.dtype, seed=cfg.seed,
                           serial=serial, defaults=defaults)


def smallest_batch(model):
    """The smallest global batch every layer can split: the largest sample split of any layer, or of
    the grid the input lies on (a leading residual block's input grid, which is no layer's)."""
    return max([model.in_grid.P_N] + [layer.grid.P_N for _, layer in model.named_layers()])


def check_model_fits(model, cfg, x_shape, num_classes):
    """Bind ``model`` to the batch shape and check its head against the labels (every rank alike)."""
    need = smallest_batch(model)
    if cfg.batch_size < need:
        where = next((f"layer {name}" for name, layer in model.named_layers() if layer.grid.P_N == need),
                     "the grid the input lies on (defaults.grid: the model opens with a residual block)")
        raise OptionError("batch_size", f"{cfg.batch_size} samples cannot be split over the sample={need} "
                                        f"ranks of {where} (each needs at least one); use {{batch_size}} "
                                        f">= {need}")
    model.bind((cfg.batch_size,) + tuple(x_shape[1:]))
    outputs = model.body.output_shape[1]
    if is_regression(model) and outputs != num_classes:
        raise OptionError("model", f"its head has {outputs} outputs but the data have {num_classes} targets per "
                                   f"sample; give the last 'linear' layer out = {num_classes}")
    if num_classes > outputs:
        raise OptionError("model", f"its classifier head has {outputs} outputs (classes 0..{outputs - 1}) but "
                                   f"the labels go up to {num_classes - 1}; give the last 'linear' layer "
                                   f"out >= {num_classes}")


# -- one step, and evaluation -------------------------------------------------------------------------
def learning_rate(cfg, step, total_steps):
    """The learning rate of step ``step`` (0-based) of ``total_steps``."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return 0.5 * cfg.lr * (1 + math.cos(math.pi * step / max(total_steps, 1)))


def step(model, optimizer, x_b, y_b):
    """One training step on the global batch ``(x_b, y_b)``; returns the loss (same on every rank)."""
    model.bind(x_b.shape)
    backend = model.backend
    x_loc = backend.asarray(datastore.local_block(x_b, model.input_distribution, model.in_grid.rank))
    y_loc = backend.asarray(model.label_block(numpy.asarray(y_b)))
    loss = model.loss(model.forward(x_loc), y_loc)
    model.backward()
    optimizer.step()
    return loss


def evaluate(model, x, y, batch_size):
    """Accuracy on ``(x, y)`` with the running statistics (``model.eval()``), any number of samples
    (the mean squared error, :func:`evaluate_mse`, for a regression).  The same value on any grid."""
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


# -- the run ---------------------------------------------------------------------------------------------
def _add(totals, summary):
    for kind, s in summary.items():
        t = totals.setdefault(kind, {"calls": 0, "bytes": 0})
        t["calls"] += s["calls"]
        t["bytes"] += s["bytes"]


RUN_KEYS = ("seed", "epochs", "steps_per_epoch", "batch_size", "lr", "lr_schedule", "momentum", "weight_decay")


def run_record(cfg, per_epoch):
    """What decides the steps after a checkpoint besides its tensors: the data order (seed, batch),
    the learning rate of each step (its peak, schedule and the run's length) and SGD's settings."""
    return {"seed": cfg.seed, "epochs": cfg.epochs, "steps_per_epoch": per_epoch, "batch_size": cfg.batch_size,
            "lr": cfg.lr, "lr_schedule": cfg.lr_schedule, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay}


def _save(cfg, model, optimizer, global_step, per_epoch):
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


def _kept(cfg, saved):
    """What a diverged run leaves behind, for its one line."""
    if not cfg.checkpoint_dir:
        return "lower --lr (it is {:g})".format(cfg.lr)
    last = f"the checkpoint of step {saved}" if saved is not None else "any checkpoint already there"
    return f"{last} in {cfg.checkpoint_dir!r} is kept; lower --lr (it is {cfg.lr:g})"


def check_loss(cfg, loss, global_step, saved):
    """Raise :class:`Diverged` if ``loss`` (the same on every rank) is not finite."""
    if not math.isfinite(loss):
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
    if k > GROWTH_STEPS or k < 2 or losses[-1] <= GROWTH_FACTOR * losses[0] \
            or any(loss > GROWTH_FACTOR * losses[0] for loss in losses[1:-1]):
        return
    warnings.warn(f"the loss grew from {losses[0]:.4g} (step {first_step}) to {losses[-1]:.4g} (step "
                  f"{first_step + k - 1}), more than {GROWTH_FACTOR:g} x in the first {GROWTH_STEPS} steps: the "
                  f"learning rate {cfg.lr:g} may be too large for batch {cfg.batch_size} (--lr; unset, the model's "
                  f"recipe decides, docs/training.md)", stacklevel=2)


def check_finite(cfg, comm, model, optimizer, global_step, saved):
    """Collective: raise :class:`Diverged` on every rank if any rank holds a tensor with a
    NaN or an infinity (named in the message) after step ``global_step``."""
    bad = [b for b in collectives.allgather_object(comm, checkpoint.nonfinite(model, optimizer)) if b]
    if bad:
        raise Diverged(f"training diverged: after step {global_step}, {bad[0]} are not finite (NaN or "
                       f"inf); nothing of it is saved: {_kept(cfg, saved)}")


def train(cfg, *, comm=None, log=print, report=None):
    """Run ``cfg`` (a :class:`TrainConfig`); returns a dict of results (``losses`` per step,
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
        global_step, extra = checkpoint.load(cfg.checkpoint_dir, model, optimizer)
        check_resumed(cfg, extra, per_epoch)
        if global_step >= total_steps:
            raise OptionError("resume", f"the checkpoint in {cfg.checkpoint_dir!r} is at step {global_step}, the "
                                        f"end of a {cfg.epochs}-epoch run of {per_epoch} steps per epoch; raise "
                                        f"{{epochs}} to train further")
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
                    _save(cfg, model, optimizer, global_step, per_epoch)
                    saved = global_step
                if cfg.max_steps is not None and len(losses) >= cfg.max_steps:
                    stop = True
                    break
            bar.end_epoch()
            check_finite(cfg, comm, model, optimizer, global_step, saved)
            metric = "mse" if is_regression(model) else "accuracy"
            score = evaluate(model, x_test, y_test, cfg.batch_size)
            epochs.append({"epoch": epoch + 1, "loss": float(numpy.mean(epoch_losses)), metric: score})
            say(f"epoch {epoch + 1}/{cfg.epochs}: loss {epochs[-1]['loss']:.4f}, test {metric} {score:.4f}")
            if cfg.checkpoint_dir and not (cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0):
                _save(cfg, model, optimizer, global_step, per_epoch)
                saved = global_step
            if stop:
                break
        measured = _overlap_report(cfg, comm, model, hidden, drawn, len(losses), metrics)
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
    return result


# -- the one-rank replay -----------------------------------------------------------------------------
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


TIMELINE_STEPS = 4  # --timeline draws the run's steps 2 to 4 (the first warms the caches)


def _overlap_report(cfg, comm, model, hidden, drawn, steps, metrics):
    """Collective: every rank's overlap figures (:func:`refconv.overlap.hidden_by_kind` summed over
    the steps) to every rank, the planner's prediction beside them; --metrics-out's last line, and
    --timeline's file (rank 0)."""
    per_rank = collectives.allgather_object(comm, hidden)
    predicted = predicted_overlap(cfg, model)
    metrics.write(summary={"steps": steps, "overlap_per_rank": per_rank, "predicted": predicted})
    if cfg.timeline:
        rows = collectives.allgather_object(comm, drawn)
        if comm.Get_rank() == 0:
            keep = [name for name in rows[0]][1:] or list(rows[0])   # the first step only if it is all
            title = (f"{model.spec.get('name', 'model') if model.spec else 'model'}, {comm.Get_size()} ranks, "
                     f"{'overlapped' if cfg.overlap else '--no-overlap'}")
            overlap.write_timeline(cfg.timeline, [{name: r[name] for name in keep} for r in rows], title)
    return {"overlap": per_rank, "overlap_predicted": predicted}


def predicted_overlap(cfg, model):
    """What the planner predicted of the overlap, in words: a planned file's record (``plan:``), or
    with ``--algorithm auto`` the machine's share hidden of each gradient allreduce; else None."""
    spec = model.spec or {}
    planned = spec.get("plan")
    if isinstance(planned, dict) and "allreduce_hidden" in planned:
        text = (f"refconv plan (machine {planned.get('machine')}, {planned.get('ranks')} ranks): weight-gradient "
                f"allreduce {planned.get('grad_allreduce_ms', 0):.3f} ms per step, {planned['allreduce_hidden']:.0%} "
                f"of it hidden")
        if planned.get("halo_ms"):
            text += f"; halo {planned['halo_ms']:.3f} ms, {planned.get('halo_hidden_ms', 0):.3f} ms of it hidden"
        return text
    if cfg.algorithm == "auto" or (spec.get("defaults") or {}).get("algorithm") == "auto":
        with warnings.catch_warnings():      # "no machine file given" was said when auto chose the algorithms
            warnings.simplefilter("ignore")
            m = machine_mod.load(cfg.machine or (spec.get("defaults") or {}).get("machine"))
        return f"the planner's machine {m.name}: {m.overlap:.0%} of each weight-gradient allreduce hidden"
    return None


def format_summary(result):
    """The end-of-run report: time per step and bytes per step by kind of collective."""
    lines = [f"trained {result['steps']} steps: {result['time_per_step'] * 1e3:.1f} ms per step, "
             + next(f"final test {m} {result[m]:.4f}" for m in ("accuracy", "mse") if m in result),
             "communication per step and rank (mean over ranks):",
             f"  {'collective':<16}{'calls':>8}{'bytes':>14}"]
    total = 0
    for kind, b in result["bytes_per_step"].items():
        lines.append(f"  {kind:<16}{result['calls_per_step'][kind]:>8.1f}{b:>14,.0f}")
        total += b
    lines.append(f"  {'total':<16}{'':>8}{total:>14,.0f}")
    if "overlap" in result:
        lines += overlap.summary_lines(result["overlap"], result["steps"], result.get("overlap_predicted"))
    return "\n".join(lines)


# -- ``refconv train`` (the command protocol of refconv.cli) ------------------------------------------
HELP = "train a CNN with sample, channel/filter and spatial parallelism"
DESCRIPTION = ("Train a CNN on the process grid of every rank of MPI.COMM_WORLD. Rank 0 prints the setup, the "
               "loss and test accuracy per epoch, and a summary of the time and bytes communicated per step by "
               "kind of collective; progress goes to stderr.")


def add_arguments(parser):
    train_config.add_arguments(parser)


def run(args):
    failure.expect_training()      # every rank of this job trains: one that leaves before it tells the others
    result = train(train_config.from_arguments(args))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(format_summary(result), flush=True)
    return 0
