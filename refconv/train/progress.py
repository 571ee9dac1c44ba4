"""What a training run reports as it goes (rank 0): the header, progress and per-step metrics.

- :func:`header` echoes the resolved setup: ranks and threads, backend, dtype,
  learning rate, and each run of layers with its grid and its convolutions' algorithms.
- :class:`Progress` writes to stderr: on a terminal a bar redrawn in place (steps,
  loss, elapsed time, ETA, images/s); otherwise (a log file, a Slurm job) one plain
  line every ``every`` steps, so a log never turns into one long line.  Under
  mpiexec rank 0's stderr is a pipe to the launcher, which forwards each write as it
  comes, so the bar is drawn when the launcher's own stderr is a terminal
  (:func:`on_terminal`; ``REFCONV_PROGRESS=bar`` or ``lines`` decides instead).
- :class:`Metrics` appends one JSON line per step to ``--metrics-out`` (the fields are
  listed in docs/training.md), flushed each time, so a killed run keeps its lines.
"""

import collections
import json
import math
import os
import stat
import sys
import time

import numpy


PROGRESS_ENV = "REFCONV_PROGRESS"   # "bar" or "lines": overrides the terminal test
LAUNCHERS = ("mpiexec", "mpirun")   # process names (a prefix: mpiexec.hydra) whose stderr the ranks' goes to


def grid_text(grid):
    """``"sample=2,channel=2"`` (axes of size 1 left out; ``"1 rank"`` when all are)."""
    text = ",".join(f"{n}={p}" for n, p in zip(grid.axes, grid.shape) if p > 1)
    return text or "1 rank"


def _algorithm_text(layer):
    if layer.algorithm == "stationary-w":
        return f"stationary-w (p_f={layer.filter_groups})"
    return layer.algorithm


def layer_runs(model):
    """``[(first, last, grid text, {algorithm: convs})]``: consecutive layers on one grid."""
    runs = []
    for name, layer in model.named_layers():
        text = grid_text(layer.grid)
        if not runs or runs[-1][2] != text:
            runs.append([name, name, text, collections.Counter()])
        runs[-1][1] = name
        if getattr(layer, "algorithm", None):
            runs[-1][3][_algorithm_text(layer)] += 1
    return [tuple(r) for r in runs]


def threads_text(choice):
    """``1 BLAS thread per rank (set by OMP_NUM_THREADS)`` from a :class:`refconv.threads.ThreadChoice`."""
    why = (f"set by {choice.source}" if choice.source != "default"
           else f"the node's {choice.node_cores} cores shared by its {choice.node_ranks} ranks")
    return f"{choice.threads} BLAS thread{'s' if choice.threads > 1 else ''} per rank ({why})"


def timeout_text(seconds):
    """``collective timeout 300 s``: the deadline in force (``--timeout``; see docs/parallel.md)."""
    return "no collective timeout" if seconds is None else f"collective timeout {seconds:g} s"


STORE_KINDS = {"npz": "an .npz, loaded whole on every rank", "npy": "a directory of .npy files",
               "hdf5": "an HDF5 file", "images": "a folder of images, one subfolder per class"}


def data_lines(cfg, x, model, store_kind, adapted=()):
    """What the run trains on: the source and its kind, how each rank gets its block of a batch
    (rank 0's block and its bytes), the prefetch depth and reader; then what was adapted of the
    model to the data (``adapted``: phrases).  Call after the model is bound to the batch."""
    block = tuple(int(n) for n in model.input_distribution.local_shape(model.in_grid.rank))
    nbytes = math.prod(block) * numpy.dtype(cfg.dtype).itemsize
    kind = "volumes" if len(x.shape) == 5 else "images"
    if cfg.synthetic:
        source = f"--synthetic {kind} {tuple(x.shape[1:])} (made from seed {cfg.seed}; the test set: other samples)"
    elif cfg.data:
        source = f"--data {cfg.data} ({STORE_KINDS[store_kind]}; {kind} {tuple(x.shape[1:])})"
    else:
        source = f"the bundled digits {tuple(x.shape[1:])} (in memory on every rank)"
    how = f"rank 0's block {block} {cfg.dtype}, {nbytes:,} bytes"
    if not hasattr(x, "block"):                                  # an array in memory: sliced, not read
        reading = f"each rank takes its block of each batch from memory: {how}; nothing to prefetch"
    else:
        verb, doing = ("makes", "made") if cfg.synthetic else ("reads", "read")
        ahead = (f"{cfg.prefetch} batch{'es' if cfg.prefetch > 1 else ''} ahead by a {cfg.prefetch_reader} "
                 f"(--prefetch, --prefetch-reader)" if cfg.prefetch else "in the step (--prefetch 0)")
        reading = f"each rank {verb} only its block of each batch: {how}; {doing} {ahead}"
    lines = [f"data: {source}", f"  {reading}"]
    if adapted:
        lines.append(f"  the model adapted to the data: {'; '.join(adapted)}")
    return lines


def header(model, cfg, ranks, binding, threads, n_train, n_test, per_epoch, data=()):
    """The lines that open a run (call after the model is bound, so ``auto`` has chosen).
    ``binding``: this rank's :class:`refconv.device.Binding`; ``threads``: its
    :class:`refconv.threads.ThreadChoice`; ``data``: :func:`data_lines`, after the model's line."""
    gpu = f" (rank 0 on GPU {binding.gpu_id})" if binding.gpu is not None else ""
    lines = [f"model {model.spec.get('name', 'custom') if model.spec else 'custom'}: "
             f"{model.num_parameters()} parameters, {len(model.named_layers())} layers; "
             f"train {n_train} / test {n_test} samples", *data,
             f"{ranks} rank{'s' if ranks > 1 else ''}; backend {binding.backend}{gpu}, {cfg.dtype}; "
             f"{threads_text(threads)}; {timeout_text(cfg.timeout)}",
             f"batch {cfg.batch_size}, {per_epoch} steps per epoch; lr {cfg.lr:g}{_rule(cfg)} ({cfg.lr_schedule}), "
             f"momentum {cfg.momentum:g}, weight decay {cfg.weight_decay:g}{_source(cfg)}"]
    for first, last, grid, convs in layer_runs(model):
        where = f"layer {first}" if first == last else f"layers {first}..{last}"
        conv = "; convolutions: " + ", ".join(f"{a} x{n}" for a, n in convs.items()) if convs else ""
        lines.append(f"  {where}: grid {grid}{conv}")
    return lines


def _rule(cfg):
    """`` = 0.1 x batch 8 / 256`` when an unset --lr was scaled by the recipe's rule."""
    rule = getattr(cfg, "lr_rule", None)
    return f" = {rule}" if rule and rule != f"{cfg.lr:g}" else ""


def _source(cfg):
    """``; unset options from the recipe of plan.yaml`` (:mod:`refconv.recipe`)."""
    source = getattr(cfg, "recipe_source", None)
    return f"; unset options from {source}" if source else ""


def per_kind(moved, seconds):
    """A metrics line's ``collectives``: kind -> calls, bytes and seconds, for the kinds whose calls
    moved data (one-rank communicators and metadata calls such as communicator splits are left out)."""
    return {kind: {"calls": moved[kind]["calls"], "bytes": moved[kind]["bytes"], "seconds": seconds.get(kind, 0.0)}
            for kind in sorted(moved)}


def _duration(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def on_terminal(stream, environ=None, proc="/proc"):
    """Whether a bar redrawn in place suits ``stream``: ``REFCONV_PROGRESS`` when it is ``bar``
    or ``lines``; else True when ``stream`` is a terminal, or when it is a pipe to a launcher
    on this node (MPICH's ``mpiexec``, through its ``hydra_pmi_proxy``) whose own stderr is one.
    A launcher on another node (ssh), a Slurm step or no ``/proc``: lines."""
    choice = (os.environ if environ is None else environ).get(PROGRESS_ENV)
    if choice in ("bar", "lines"):
        return choice == "bar"
    if stream.isatty():
        return True
    try:
        if stream.fileno() != 2 or not stat.S_ISFIFO(os.fstat(2).st_mode):
            return False  # not this process's stderr, or not a pipe (a file: a log)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return False
    pid = os.getppid()
    for _ in range(3):  # rank -> hydra_pmi_proxy -> mpiexec
        try:
            with open(f"{proc}/{pid}/comm") as f:
                name = f.read().strip()
            if name.startswith(LAUNCHERS):
                return os.readlink(f"{proc}/{pid}/fd/2").startswith(("/dev/pts/", "/dev/tty"))
            with open(f"{proc}/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the name: state, then ppid
        except (OSError, ValueError, IndexError):
            return False
    return False


class Progress:
    """Rank 0's progress on ``stream``: a bar on a terminal, else a line every ``every`` steps."""

    def __init__(self, *, total_steps, epochs, batch_size, every, stream=None, enabled=True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.terminal = enabled and on_terminal(self.stream)
        self.total, self.epochs, self.batch, self.every = total_steps, epochs, batch_size, every
        self.start = time.perf_counter()
        self.done = 0                     # steps taken by this process (a resumed run starts at 0)

    def step(self, epoch, in_epoch, per_epoch, global_step, loss):
        """After a step: ``in_epoch`` steps done of ``per_epoch``; ``global_step`` of the whole run."""
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - global_step) / rate if rate else 0.0
        shown = "none (shapes-only run)" if loss is None else f"{loss:.4f}"
        tail = (f"loss {shown} | {_duration(elapsed)} elapsed, ETA {_duration(eta)}, "
                f"{rate * self.batch:,.0f} images/s")
        if self.terminal:
            width = 24
            filled = int(width * in_epoch / max(per_epoch, 1))
            self.stream.write(f"\repoch {epoch + 1}/{self.epochs} [{'#' * filled}{'.' * (width - filled)}] "
                              f"{in_epoch}/{per_epoch} {tail}")
            self.stream.flush()
        elif global_step % self.every == 0 or global_step == self.total:
            self.stream.write(f"epoch {epoch + 1}/{self.epochs} step {global_step}/{self.total} {tail}\n")
            self.stream.flush()

    def end_epoch(self):
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


class Metrics:
    """``--metrics-out``: one JSON object per step, appended (rank 0 only; ``path=None``: off)."""

    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8") if path else None

    def write(self, **fields):
        if self.file is not None:
            self.file.write(json.dumps(fields) + "\n")
            self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()
            self.file = None
