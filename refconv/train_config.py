"""The training options, defined once: ``TrainConfig`` (the API) and ``refconv train``'s flags.

``OPTIONS`` is the one list.  Each :class:`Option` is a field of :class:`TrainConfig`
(name, default, validation) and a flag of ``refconv train`` (``--name-with-dashes``,
its help text and its ``--help`` section)::

    cfg = TrainConfig(grid={"sample": 2, "channel": 2}, epochs=2)   # validated here
    refconv train --grid sample=2,channel=2 --epochs 2                # the same run

A bad value raises :class:`OptionError`, a ``ValueError`` that names the option:
``"epochs: expected a positive int, got 0"`` from the API, ``"--epochs: ..."`` from
the command line (:meth:`OptionError.render`).  The checks depend only on the
options, so every rank raises the same error before any communication.
"""

import argparse
import dataclasses
import math
import numbers
import re

from refconv import algorithms, checks, recipe
from refconv.backend import BACKENDS, RUN_BACKENDS
from refconv.collectives import DEFAULT_TIMEOUT_S, env_timeout
from refconv.collectives.buckets import BUCKET_BYTES
from refconv.datastore.prefetch import READERS
from refconv.grid import axes_of
from refconv.model_spec import PRESETS, load_spec
from refconv.pricing.machine import DEFAULT_MACHINE, builtin_names

GRID_AXES = axes_of(5)  # the axes --grid takes (refconv.grid's; depth splits the volumes of a 3-D model)
MAX_CLASSES = 100_000   # a classifier head beyond this is a mistake (a label of 2**40), not a model


class OptionError(ValueError):
    """A bad training option.  ``detail`` may name other options as ``{name}``."""

    def __init__(self, option, detail):
        self.option, self.detail = option, detail
        super().__init__(self.render(lambda name: name))

    def render(self, spell):
        """The message with every option name written by ``spell`` (e.g. as its ``--flag``)."""
        detail = re.sub(r"\{(\w+)\}", lambda m: spell(m[1]) if m[1] in BY_NAME else m[0], self.detail)
        return f"{spell(self.option)}: {detail}"


# -- value checks: (value, name) -> normalised value, or ValueError("name: what would be right") --
def _int(minimum, optional=False):
    """An int >= minimum (refconv.checks.integer), or also None when ``optional``."""
    return lambda v, name: None if v is None and optional else checks.integer(v, name, minimum=minimum)


def _one_of(choices):
    """One of ``choices`` (a tuple, or a function giving it: a registry that may grow)."""
    return lambda v, name: checks.one_of(v, name, choices() if callable(choices) else choices)


def _real(minimum, below=math.inf):
    """A finite number in ``[minimum, below)``."""
    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not minimum <= v < below:
            upper = "" if below == math.inf else f" and < {below}"
            raise ValueError(f"{name}: expected a number >= {minimum}{upper}, got {v!r}")
        return float(v)
    return check


def _instance(types, what):
    def check(v, name):
        if not isinstance(v, types):
            raise ValueError(f"{name}: expected {what}, got {v!r}")
        return v
    return check


def _optional(check):
    """``check``, or None (unset: the model's recipe decides, :func:`_apply_recipe`)."""
    return lambda v, name: None if v is None else check(v, name)


def _recipe_unset(key):
    """What leaving option ``key`` unset means, in --help."""
    return f"the model's recipe (docs/training.md), else {recipe.FALLBACK[key]}"


def _timeout(v, name):
    return None if v is None or v == 0 else _real(0)(v, name)


def _algorithms():
    return algorithms.channel_algorithms() + ("auto",)


def parse_grid(text):
    """``"sample=2,channel=2"`` -> ``{"sample": 2, "channel": 2}`` (the ``--grid`` parser).

    Its errors say what is wrong without naming the flag (argparse prefixes it)."""
    grid = {}
    for part in text.split(","):
        axis, sep, size = (s.strip() for s in part.partition("="))
        if not sep or axis not in GRID_AXES:
            raise ValueError(f"expected axis=size pairs with axes {', '.join(GRID_AXES)}, "
                             f"e.g. sample=2,channel=2; got {part.strip()!r}")
        if axis in grid:
            raise ValueError(f"axis {axis!r} is given twice in {text!r}; give each axis once")
        try:
            grid[axis] = int(size)
        except ValueError:
            raise ValueError(f"the size of {axis} must be an int, got {size!r}") from None
        if grid[axis] < 1:
            raise ValueError(f"the size of {axis} must be >= 1, got {grid[axis]}")
    return grid


def _grid(v, name):
    if v is None:
        return None
    if not isinstance(v, dict) or not v:
        raise ValueError(f"{name}: expected a dict like {{'sample': 2, 'channel': 2}} or unset, got {v!r}")
    for axis in v:
        if axis not in GRID_AXES:
            raise ValueError(f"{name}: unknown axis {axis!r}; axes are {', '.join(GRID_AXES)}")
    return {axis: checks.integer(size, f"{name}: the size of {axis}") for axis, size in v.items()}


def check_grid_ranks(grid, ranks):
    """OptionError on ``grid`` unless its sizes multiply to ``ranks``: the one message, in
    ``refconv train`` and ``refconv bench``, for a grid that does not fit the job (most often:
    mpiexec forgotten, or its ``-n`` not the grid's)."""
    product = math.prod(grid.values())
    if product != ranks:
        text = ",".join(f"{axis}={size}" for axis, size in grid.items() if size > 1) or "sample=1"
        started = "1 was started" if ranks == 1 else f"{ranks} were started"
        raise OptionError("grid", f"{text} needs {product} ranks but {started}; launch it as mpiexec -n {product} "
                                  f"..., or choose sizes whose product is {ranks} (axes left out have size 1)")


# -- the options ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Option:
    """One training option: a :class:`TrainConfig` field and a ``refconv train`` flag."""

    name: str              # the TrainConfig field; the flag is --name-with-dashes
    default: object
    check: object          # (value, name) -> normalised value; ValueError("name: what would be right")
    group: str             # the --help section
    help: str
    parse: object = None   # the flag's text -> value (argparse type); None: a switch (bool)
    metavar: str = None
    choices: object = None  # listed in --help: a tuple, or a function giving it
    unset: str = None      # what an unset option (default None) means, in --help: "; unset: ..."
    choice_help: dict = None  # choice -> what it means, in --help where the command offers that choice

    @property
    def flag(self):
        """``--batch-size``; a switch that is on by default is turned off by ``--no-...``."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.parse is None and self.default else f"--{dashed}"


STRATEGY = "parallel strategy (defaults for every layer; a model file may override per layer)"
DATA = "model and data"
OPTIM = "optimisation"
RUN = "run"
OUTPUT = "output"
_PATH = _instance((str, type(None)), "a path (str) or unset")
_BOOL = _instance(bool, "True or False")

OPTIONS = (
    Option("grid", None, _grid, STRATEGY, "process grid, e.g. sample=2,channel=2 or sample=2,height=2 (and "
           "depth for a model of volumes: channel=2,depth=2,height=2); the product must be the number of ranks",
           parse=parse_grid, metavar="AXIS=SIZE,...",
           unset="the model's (sample=<ranks> for the presets)"),
    Option("algorithm", None, lambda v, name: v if v is None else _one_of(_algorithms)(v, name), STRATEGY,
           "channel/filter algorithm of the convolutions when channel > 1", parse=str, choices=_algorithms,
           unset="the model's (stationary-x for the presets)",
           choice_help={"auto": "priced per layer by the planner's model with --machine"}),
    Option("filter_groups", None, _int(1, optional=True), STRATEGY,
           "p_f of stationary-w, a divisor of the channel size; only with --algorithm stationary-w",
           parse=int),
    Option("machine", None, _instance((str, type(None)), "a machine file or a built-in name"), STRATEGY,
           f"the machine the planner prices with (--algorithm auto, refconv plan): a machine file (refconv calibrate "
           f"--out) or a built-in name ({', '.join(builtin_names())})", parse=str, metavar="FILE|NAME",
           unset=f"the built-in {DEFAULT_MACHINE} figures, with a warning"),
    Option("model", "digits-cnn", _instance((str, dict), "a preset name, a JSON/YAML path or a spec dict"), DATA,
           f"a preset ({', '.join(PRESETS)}) or a JSON/YAML model file", parse=str,
           metavar="PRESET|FILE"),
    Option("data", None, _PATH, DATA,
           "an .npz with x (N,C,H,W) images or (N,C,D,H,W) volumes and y (N,) labels or (N,K) float targets, "
           "loaded whole; or a store each rank reads only its block of: "
           "a directory with x.npy (or shards x-00000.npy, ...) and y.npy, an HDF5 file (.h5) with x and y, or "
           "a folder of images with one subfolder per class (docs/data.md); 20%% is held out for testing; unset: the bundled digits",
           parse=str, metavar="NPZ|DIR|H5|FOLDER"),
    Option("prefetch", 1, _int(0), DATA, "with a store: blocks read ahead in a thread while a step trains "
           "(0: read in the step)", parse=int, metavar="BATCHES"),
    Option("prefetch_reader", "thread", _one_of(READERS), DATA, "what reads ahead: a thread of each rank, or a "
           "process forked by each rank, which shares no lock with the step (Linux; docs/data.md)", parse=str,
           choices=READERS),
    Option("synthetic", False, _BOOL, DATA, "train on generated images instead (scaling runs)"),
    Option("synthetic_samples", 1024, _int(1), DATA, "training images with --synthetic", parse=int),
    Option("image_size", None, _int(1, optional=True), DATA, "height and width of --synthetic images (and depth of "
           "--synthetic volumes), and of the images of a --data folder (resized)", parse=int,
           unset=f"the model's recipe (a planned file's image size), else {recipe.FALLBACK['image_size']}"),
    Option("epochs", 4, _int(1), OPTIM, "passes over the training set", parse=int),
    Option("batch_size", 32, _int(1), OPTIM, "global batch size (split over the sample axis)", parse=int),
    Option("lr", None, _optional(_real(0)), OPTIM, "peak SGD learning rate", parse=float,
           unset="the model's recipe: for the ImageNet presets (and a file planned from one) 0.1 x batch-size / 256, "
                 "the linear scaling rule; cosmoflow 0.01; else 0.1"),
    Option("lr_schedule", None, _optional(_one_of(recipe.SCHEDULES)), OPTIM,
           "cosine: decay to 0 over the run", parse=str, choices=recipe.SCHEDULES, unset=_recipe_unset("lr_schedule")),
    Option("momentum", None, _optional(_real(0, below=1)), OPTIM, "SGD momentum", parse=float,
           unset=_recipe_unset("momentum")),
    Option("weight_decay", None, _optional(_real(0)), OPTIM, "L2 penalty added to each gradient", parse=float,
           unset=_recipe_unset("weight_decay")),
    Option("seed", 0, _int(0), OPTIM, "parameters and data order: same seed, same run", parse=int),
    Option("max_steps", None, _int(1, optional=True), OPTIM, "stop after this many steps in all",
           parse=int),
    Option("backend", "auto", _one_of(BACKENDS), RUN,
           "numpy: the CPU path; cuda: the Numba kernels; auto: cuda when a GPU answers", parse=str,
           choices=RUN_BACKENDS),
    Option("dtype", "float32", _one_of(("float32", "float64")), RUN, "parameter and activation dtype",
           parse=str, choices=("float32", "float64")),
    Option("threads", None, _int(1, optional=True), RUN, "BLAS threads per rank", parse=int,
           unset="OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or MKL_NUM_THREADS if set, else the node's cores shared by "
                 "its ranks"),
    Option("oversubscribe_gpus", False, _BOOL, RUN, "let ranks of a node share a GPU (more ranks than GPUs; "
           "also REFCONV_OVERSUBSCRIBE_GPUS=1)"),
    Option("overlap", True, _BOOL, RUN, "wait for each layer's gradient allreduce at once, instead of leaving "
           "it in flight behind the backward of the layers before it until the optimizer's step (the same "
           "gradients, bit for bit; docs/parallel.md, \"Overlap\")"),
    Option("bucket_kib", BUCKET_BYTES // 1024, _int(0), RUN, "pack the gradients' allreduces into buckets of at "
           "least this many KiB, as DDP does (0: each gradient its own allreduce, started the moment it is ready); "
           "the same buckets with --no-overlap, so the same bits (measured: docs/benchmarks.md)", parse=int,
           metavar="KIB"),
    Option("timeout", env_timeout(DEFAULT_TIMEOUT_S), _timeout, RUN,
           "seconds any one collective may wait before the job is ended (0: no deadline; the default is "
           "REFCONV_TIMEOUT's when set)", parse=float,
           metavar="SECONDS"),
    Option("checkpoint_dir", None, _PATH, RUN, "save a checkpoint here after every epoch", parse=str,
           metavar="DIR"),
    Option("checkpoint_every", 0, _int(0), RUN, "also save every STEPS steps (0: only after each epoch)",
           parse=int, metavar="STEPS"),
    Option("resume", False, _BOOL, RUN, "continue from the checkpoint in --checkpoint-dir (it may come "
           "from another grid or algorithm)"),
    Option("check_serial", 0, _int(0), RUN, "replay the first K steps on one rank (rank 0) and assert "
           "the losses agree (0: no replay)", parse=int, metavar="K"),
    Option("progress", True, _BOOL, OUTPUT, "no progress report on stderr (a bar on a terminal, else a "
           "line every --log-every steps)"),
    Option("log_every", 50, _int(1), OUTPUT, "steps between progress lines when stderr is not a terminal",
           parse=int, metavar="STEPS"),
    Option("metrics_out", None, _PATH, OUTPUT, "append one JSON line per step to this file (rank 0; "
           "fields in docs/training.md), and one of every rank's overlap figures at the end", parse=str,
           metavar="JSONL"),
    Option("timeline", None, _PATH, OUTPUT, "write every rank's collective calls of steps 2 to 4 of the run to "
           "this .json file and draw them beside it (.png): when each started, was waited for and finished "
           "(docs/parallel.md, \"Overlap, measured\")", parse=str, metavar="JSON"),
)
BY_NAME = {o.name: o for o in OPTIONS}


def _check_together(cfg):
    """Checks that involve more than one option."""
    if cfg.filter_groups is not None and cfg.algorithm != "stationary-w":
        raise OptionError("filter_groups", f"only stationary-w splits the filters into groups; give "
                                           f"{{algorithm}} stationary-w, or leave {{filter_groups}} unset "
                                           f"(got algorithm {cfg.algorithm!r})")
    if cfg.resume and not cfg.checkpoint_dir:
        raise OptionError("resume", "needs {checkpoint_dir}, the directory of the run to continue")
    if cfg.synthetic and cfg.data is not None:
        raise OptionError("synthetic", "give either {data} or {synthetic}, not both")
    _apply_recipe(cfg)


RECIPE_OPTIONS = ("lr", "lr_schedule", "momentum", "weight_decay", "image_size")  # unset: the recipe's


def model_recipe(model):
    """The recipe (:mod:`refconv.recipe`) of ``model``: a preset's, or a model file's ``"train"``
    section (checked: an OptionError naming the key).  A file that cannot be read gives none here;
    loading the model says why, with its own error."""
    name = model if isinstance(model, str) and model in PRESETS else None
    spec = {}
    if name is None:
        try:
            spec = load_spec(model)
        except Exception:  # noqa: BLE001  (refconv.train.load_model_spec reports it, as one line)
            return {}
    try:
        return recipe.of(spec, name)
    except ValueError as exc:
        where = model if isinstance(model, str) else "the model dict"
        raise OptionError("model", f"{where!r}: {exc}") from None


def _apply_recipe(cfg):
    """Every option of :data:`RECIPE_OPTIONS` left unset takes the model's recipe (else the
    fallback).  For the run's header, ``cfg.lr_rule`` says how an unset learning rate was reached
    and ``cfg.recipe_source`` whose recipe the unset options took (None: the fallbacks')."""
    unset = [name for name in RECIPE_OPTIONS if getattr(cfg, name) is None]
    if not unset:
        return
    found = model_recipe(cfg.model)
    preset = isinstance(cfg.model, str) and cfg.model in PRESETS
    cfg.recipe_source = None        # a preset's recipe is documented; a file's is named in the header
    if found and not preset and any(name in found for name in unset):
        cfg.recipe_source = f"the recipe of {cfg.model if isinstance(cfg.model, str) else 'the model dict'}"
    for name in unset:
        if name == "lr":
            cfg.lr = recipe.learning_rate(found, cfg.batch_size)
            cfg.lr_rule = recipe.lr_text(found, cfg.batch_size)
        else:
            setattr(cfg, name, recipe.value(found, name))


def _validate(cfg):
    """Check and normalise every field (called on construction, and again by ``train``)."""
    for o in OPTIONS:
        try:
            setattr(cfg, o.name, o.check(getattr(cfg, o.name), o.name))
        except ValueError as exc:
            raise OptionError(o.name, str(exc).removeprefix(f"{o.name}: ")) from None
    _check_together(cfg)
    return cfg


TrainConfig = dataclasses.make_dataclass(
    "TrainConfig", [(o.name, object, dataclasses.field(default=o.default)) for o in OPTIONS],
    namespace={"__post_init__": _validate, "validate": _validate,
               "__doc__": "Everything that decides a run (fields: ``refconv.train_config.OPTIONS``); the same "
                          "config and seed give the same run.  Validated on construction."})
TrainConfig.__module__ = __name__


# -- the command line ------------------------------------------------------------------------------
def add_arguments(parser, defaults=None):
    """Add every option to ``parser`` (an argparse parser), one section per group;
    ``defaults`` (name -> value) replaces some defaults (``refconv demo``'s).  The usage line
    says ``[OPTION ...]`` rather than listing every option."""
    parser.usage = "%(prog)s [OPTION ...]"
    groups, defaults = {}, defaults or {}
    for o in OPTIONS:
        if o.group not in groups:
            groups[o.group] = parser.add_argument_group(o.group)
        groups[o.group].add_argument(o.flag, **_argparse_keywords(o, defaults.get(o.name, o.default)))
    return parser


_OWN = object()  # add_option: the option's own default / unset text


def add_option(parser, name, *, default=_OWN, choices=None, unset=_OWN, purpose=None, **keywords):
    """Add option ``name``'s flag to another command's ``parser`` (a parser or group) as
    ``refconv train`` defines it: its spelling, parser, metavar, choices and help.  So
    ``--grid``, ``--algorithm``, ``--backend``, ``--threads``, ``--model`` and ``--machine``
    read alike in every command.  For this command: ``default`` replaces the default,
    ``unset`` what leaving it unset means, ``choices`` narrows the choices (a tuple), and
    ``purpose`` opens the help; the choices are checked when the flag is parsed.  Other
    ``keywords`` go to argparse (``required=True``)."""
    o = BY_NAME[name]
    kwargs = _argparse_keywords(o, o.default if default is _OWN else default,
                                choices or (o.choices() if callable(o.choices) else o.choices),
                                o.unset if unset is _OWN else unset)
    if purpose:
        kwargs["help"] = f"{purpose}: {kwargs['help']}"
    kwargs.update(keywords)
    return parser.add_argument(o.flag, **kwargs)


def _argparse_keywords(o, default, choices=None, unset=_OWN):
    """The ``add_argument`` keywords of option ``o`` with this ``default``, narrower ``choices``
    (checked when parsed) and ``unset`` text."""
    unset = o.unset if unset is _OWN else unset
    kwargs = {"dest": o.name, "help": o.help + (f"; unset: {unset}" if unset and default is None else ""),
              "default": default}
    if o.parse is None:
        kwargs["action"] = "store_false" if o.default else "store_true"
        return kwargs
    listed = choices or (o.choices() if callable(o.choices) else o.choices)
    kwargs["help"] += "".join(f"; {c}: {text}" for c, text in (o.choice_help or {}).items() if c in (listed or ()))
    metavar = "{" + ",".join(listed) + "}" if listed else {int: "N", float: "X"}.get(o.parse, "VALUE")
    kwargs.update(type=_argparse_type(o.parse, choices), metavar=o.metavar or metavar)  # narrowed: checked here
    if default is not None:
        kwargs["help"] += f" (default: {_text(default)})"
    return kwargs


def _argparse_type(parse, choices=None):
    """``parse``; a parser of ours has its ValueError's text shown as is (argparse adds the flag).
    With ``choices`` a value outside them is refused at parsing, as argparse's ``choices`` would
    (a registry that grows is read when the flag is parsed)."""
    if parse in (int, float, str) and not choices:
        return parse                                   # argparse says "invalid int value: 'x'"

    def convert(text):
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(choices)})")
        return value
    convert.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in "invalid ... value"
    return convert


def from_arguments(args):
    """The :class:`TrainConfig` of parsed arguments (validated)."""
    return TrainConfig(**{o.name: getattr(args, o.name) for o in OPTIONS})


def flag(name):
    """How the command line spells option ``name`` (for :meth:`OptionError.render`)."""
    return BY_NAME[name].flag if name in BY_NAME else name


def _text(value):
    """A value as its flag takes it: ``{"sample": 2, "channel": 2}`` -> ``"sample=2,channel=2"``."""
    if isinstance(value, dict):
        return ",".join(f"{axis}={size}" for axis, size in value.items())
    return str(value)


def to_arguments(args):
    """The flags that give the options of ``args`` (parsed arguments) where they differ from
    the defaults: the inverse of parsing, e.g. to launch the same run under mpiexec."""
    out = []
    for o in OPTIONS:
        value = getattr(args, o.name)
        if value == o.default:
            continue
        out += [o.flag] if o.parse is None else [o.flag, _text(value)]  # a switch given: not the default
    return out
