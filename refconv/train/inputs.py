"""What a run of ``refconv train`` trains: its data (``--synthetic``, ``--data`` or the digits) and its
model (a preset sized to the data, or a model file), each checked before the first step, every
rank alike (the same ``OptionError`` on every rank).  :mod:`refconv.train` exports
``load_dataset``, ``build_model`` and ``load_model_spec``."""

import json

from refconv import datasets, datastore
from refconv.layers import MeanSquaredError
from refconv.model import Model
from refconv.model_spec import PRESETS, load_spec
from refconv.train_config import MAX_CLASSES, OptionError


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
    """``--data``'s kind (:data:`refconv.train.progress.STORE_KINDS`), or None."""
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
