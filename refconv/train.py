"""Distributed training: the loop behind ``refconv train``.

One step, on every rank::

    x_b, y_b = next global batch              same on every rank (refconv.data.batches:
                                              a function of seed and epoch only)
    x_loc = model.input_distribution.extract(x_b, rank)      this rank's block
    y_loc = model.label_block(y_b)                            labels of its samples
    loss  = model.loss(model.forward(x_loc), y_loc)           global mean (allreduce)
    model.backward(); sgd.step()                              local shards only

Nothing but the layers communicates, so ``collectives.stats`` recorded around a
step is exactly the traffic of one training step.  Checkpoints (every epoch, if a
directory is given) hold the parameters, SGD's momentum and BatchNorm's running
statistics; ``resume`` reloads them onto the current grids (any strategy).
"""

import dataclasses
import math
import sys
import time

import numpy

from refconv import collectives, data
from refconv.model import Model
from refconv.optim import SGD

KINDS = ("allreduce", "reduce_scatter", "allgather", "halo", "alltoallv", "bcast", "scatter", "gather")


@dataclasses.dataclass
class TrainConfig:
    """Everything that decides a run; the same config and seed give the same run."""

    model: object = "digits-cnn"          # preset name, dict, or JSON/YAML path
    grid: dict = None                     # defaults.grid override, e.g. {"sample": 2, "channel": 2}
    algorithm: str = None
    filter_groups: int = None
    data: str = None                      # .npz path; None: the bundled digits
    synthetic: bool = False
    synthetic_samples: int = 1024
    image_size: int = 32
    epochs: int = 4
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    backend: str = "auto"
    dtype: str = "float32"
    checkpoint_dir: str = None
    checkpoint_every: int = 0             # also save every this many steps (0: only after each epoch)
    resume: bool = False
    check_serial: int = 0
    lr_schedule: str = "cosine"           # "cosine" (to 0 over the run) or "constant"
    max_steps: int = None                 # stop after this many steps in all (tests, smoke runs)
    progress: bool = True


def load_dataset(cfg, dtype):
    """``(x_train, y_train, x_test, y_test, num_classes)``."""
    if cfg.synthetic:
        channels = 3
        if not isinstance(cfg.model, str) or not cfg.model.startswith("resnet"):
            channels = _spec_in_channels(cfg.model)
        s = cfg.image_size
        x, y = data.synthetic(cfg.synthetic_samples, channels, s, s, 10, seed=cfg.seed, dtype=dtype)
        xt, yt = data.synthetic(max(cfg.synthetic_samples // 4, 1), channels, s, s, 10, seed=cfg.seed + 1, dtype=dtype)
        return x, y, xt, yt, 10
    if cfg.data:
        x, y = data.load_npz(cfg.data, dtype=dtype)
        x_train, y_train, x_test, y_test = data.split(x, y, 0.2, seed=cfg.seed)
        return x_train, y_train, x_test, y_test, int(y.max()) + 1
    return (*data.load_digits(dtype=dtype), 10)


def _spec_in_channels(model):
    from refconv.model_spec import load_spec

    return load_spec(model).get("in_channels", 3)


def build_model(cfg, *, comm=None, serial=False, in_channels=None, num_classes=None):
    """The model of ``cfg`` on ``comm`` (or its serial twin on one rank)."""
    preset_kwargs = {}
    if isinstance(cfg.model, str) and not cfg.model.endswith((".json", ".yaml", ".yml")):
        preset_kwargs = {k: v for k, v in (("in_channels", in_channels), ("num_classes", num_classes)) if v}
    defaults = {"grid": cfg.grid, "algorithm": cfg.algorithm, "filter_groups": cfg.filter_groups}
    return Model.from_spec(cfg.model, comm=comm, backend="numpy" if serial else cfg.backend, dtype=cfg.dtype,
                           seed=cfg.seed, serial=serial, defaults=defaults, **preset_kwargs)


def _save(cfg, model, optimizer, global_step):
    """A checkpoint at ``global_step``; the data position follows from it (``divmod(step, per_epoch)``)."""
    from refconv import checkpoint

    checkpoint.save(cfg.checkpoint_dir, model, optimizer, step=global_step, extra={"seed": cfg.seed})


def learning_rate(cfg, step, total_steps):
    """The learning rate of step ``step`` (0-based) of ``total_steps``."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        return 0.5 * cfg.lr * (1 + math.cos(math.pi * step / max(total_steps, 1)))
    raise ValueError(f"lr_schedule: expected 'cosine' or 'constant', got {cfg.lr_schedule!r}")


def step(model, optimizer, x_b, y_b):
    """One training step on the global batch ``(x_b, y_b)``; returns the loss (same on every rank)."""
    model.bind(x_b.shape)
    backend = model.body.layers[0].backend
    x_loc = backend.asarray(model.input_distribution.extract(numpy.asarray(x_b), model.in_grid.rank))
    y_loc = backend.asarray(model.label_block(numpy.asarray(y_b)))
    loss = model.loss(model.forward(x_loc), y_loc)
    model.backward()
    optimizer.step()
    return loss


def evaluate(model, x, y, batch_size):
    """Accuracy on ``(x, y)`` with the running statistics (``model.eval()``)."""
    model.eval()
    backend = model.body.layers[0].backend
    n = len(y)
    correct = 0
    for idx in numpy.array_split(numpy.arange(n), max(1, -(-n // batch_size))):
        x_b, y_b = numpy.asarray(x[idx]), numpy.asarray(y[idx])
        model.bind(x_b.shape)
        x_loc = backend.asarray(model.input_distribution.extract(x_b, model.in_grid.rank))
        logits = backend.to_host(model.forward(x_loc))
        correct += int((logits.argmax(axis=1) == model.label_block(y_b)).sum())
    model.train()
    total = collectives.allreduce(model.out_grid.axis_comm("sample"), numpy.array([correct], numpy.int64))
    return int(total[0]) / n


def _bar(epoch, epochs, done, total, loss, width=30):
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\repoch {epoch + 1}/{epochs} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{total} loss {loss:.4f}")
    sys.stderr.flush()


def _add(totals, summary):
    for kind, s in summary.items():
        t = totals.setdefault(kind, {"calls": 0, "bytes": 0})
        t["calls"] += s["calls"]
        t["bytes"] += s["bytes"]


def train(cfg, *, comm=None, log=print):
    """Run ``cfg``; returns a dict of results (``losses`` per step, ``epochs``, ``accuracy``,
    ``time_per_step``, ``bytes_per_step`` per kind averaged over ranks, ``serial_check``)."""
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()
    say = log if rank == 0 else (lambda *a, **k: None)
    dtype = numpy.dtype(cfg.dtype)
    x_train, y_train, x_test, y_test, num_classes = load_dataset(cfg, dtype)
    in_channels = x_train.shape[1]
    model = build_model(cfg, comm=comm, in_channels=in_channels, num_classes=num_classes)
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    per_epoch = data.num_batches(len(y_train), cfg.batch_size, drop_last=True)
    if per_epoch < 1:
        raise ValueError(f"batch_size: {cfg.batch_size} is larger than the training set ({len(y_train)} samples)")
    start_epoch, start_batch, global_step = 0, 0, 0
    if cfg.resume:
        from refconv import checkpoint

        if not cfg.checkpoint_dir:
            raise ValueError("resume: needs checkpoint_dir")
        global_step, extra = checkpoint.load(cfg.checkpoint_dir, model, optimizer)
        start_epoch, start_batch = divmod(global_step, per_epoch)
        say(f"resumed from {cfg.checkpoint_dir} at step {global_step} (epoch {start_epoch + 1})")
    say(f"model {model.spec.get('name', 'custom')}: {model.num_parameters()} parameters, "
        f"{len(model.named_layers())} layers; {comm.Get_size()} ranks; "
        f"train {len(y_train)} / test {len(y_test)} samples")

    losses, epochs, totals, step_times = [], [], {}, []
    stop = False
    for epoch in range(start_epoch, cfg.epochs):
        epoch_losses = []
        batches = data.batches(x_train, y_train, cfg.batch_size, seed=cfg.seed, epoch=epoch, drop_last=True,
                               start=start_batch if epoch == start_epoch else 0)
        for b, (x_b, y_b) in enumerate(batches, start=start_batch if epoch == start_epoch else 0):
            optimizer.lr = learning_rate(cfg, global_step, per_epoch * cfg.epochs)
            t0 = time.perf_counter()
            with collectives.stats.recording() as region:
                loss = step(model, optimizer, x_b, y_b)
            step_times.append(time.perf_counter() - t0)
            _add(totals, region.summary(moved_only=True))  # calls on one-rank communicators move nothing
            losses.append(loss)
            epoch_losses.append(loss)
            global_step += 1
            if cfg.progress and rank == 0:
                _bar(epoch, cfg.epochs, b + 1, per_epoch, loss)
            if cfg.checkpoint_dir and cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0:
                _save(cfg, model, optimizer, global_step)
            if cfg.max_steps is not None and len(losses) >= cfg.max_steps:
                stop = True
                break
        if cfg.progress and rank == 0:
            sys.stderr.write("\n")
        accuracy = evaluate(model, x_test, y_test, cfg.batch_size)
        mean_loss = float(numpy.mean(epoch_losses)) if epoch_losses else float("nan")
        epochs.append({"epoch": epoch + 1, "loss": mean_loss, "accuracy": accuracy})
        say(f"epoch {epoch + 1}/{cfg.epochs}: loss {mean_loss:.4f}, test accuracy {accuracy:.4f}")
        if cfg.checkpoint_dir and not (cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0):
            _save(cfg, model, optimizer, global_step)
        if stop:
            break

    steps = len(losses)
    kinds = numpy.array([[totals.get(k, {}).get("bytes", 0), totals.get(k, {}).get("calls", 0)] for k in KINDS],
                        numpy.float64)
    kinds = collectives.allreduce(comm, kinds) / comm.Get_size()  # averaged over ranks
    result = {
        "losses": losses, "epochs": epochs, "accuracy": epochs[-1]["accuracy"] if epochs else None,
        "steps": steps, "time_per_step": float(numpy.mean(step_times)) if steps else 0.0,
        "bytes_per_step": {k: kinds[i, 0] / max(steps, 1) for i, k in enumerate(KINDS) if kinds[i, 1]},
        "calls_per_step": {k: kinds[i, 1] / max(steps, 1) for i, k in enumerate(KINDS) if kinds[i, 1]},
        "model": model, "serial_check": None,
    }
    if cfg.check_serial:
        result["serial_check"] = check_serial(cfg, losses, comm, x_train, y_train, in_channels, num_classes, say)
    return result


def serial_losses(cfg, k, x_train, y_train, in_channels=None, num_classes=None):
    """The first ``k`` losses of the same run on one rank (numpy backend)."""
    model = build_model(cfg, serial=True, in_channels=in_channels, num_classes=num_classes)
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    out, epoch = [], 0
    total = data.num_batches(len(y_train), cfg.batch_size, drop_last=True) * cfg.epochs
    while len(out) < k:
        for x_b, y_b in data.batches(x_train, y_train, cfg.batch_size, seed=cfg.seed, epoch=epoch, drop_last=True):
            optimizer.lr = learning_rate(cfg, len(out), total)
            out.append(step(model, optimizer, x_b, y_b))
            if len(out) == k:
                break
        epoch += 1
    return out


def check_serial(cfg, losses, comm, x_train, y_train, in_channels, num_classes, say):
    """Rank 0 replays the first K steps on one rank and compares; returns the largest relative difference."""
    if cfg.resume:
        say("check-serial: skipped (the serial replay starts from step 0; this run was resumed)")
        return None
    k = min(cfg.check_serial, len(losses))
    rtol = 1e-6 if numpy.dtype(cfg.dtype) == numpy.float64 else 1e-3
    worst = numpy.zeros(1)
    if comm.Get_rank() == 0:
        serial = serial_losses(cfg, k, x_train, y_train, in_channels, num_classes)
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


def format_summary(result, cfg):
    """The end-of-run report: time per step and bytes per step by kind of collective."""
    lines = [f"trained {result['steps']} steps: {result['time_per_step'] * 1e3:.1f} ms per step, "
             f"final test accuracy {result['accuracy']:.4f}",
             "communication per step and rank (mean over ranks):",
             f"  {'collective':<16}{'calls':>8}{'bytes':>14}"]
    total = 0
    for kind, b in result["bytes_per_step"].items():
        lines.append(f"  {kind:<16}{result['calls_per_step'][kind]:>8.1f}{b:>14,.0f}")
        total += b
    lines.append(f"  {'total':<16}{'':>8}{total:>14,.0f}")
    return "\n".join(lines)

