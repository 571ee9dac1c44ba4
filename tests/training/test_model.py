"""The model, its specs and presets, serial equivalence with refconv.reference, training,
checkpoint resume, and the ``refconv train`` command line (a small mpiexec run)."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy
import pytest
import yaml

from refconv import datasets, reference as ref
from refconv.layers.container import entry_name
from refconv.model import Model
from refconv.model_spec import PRESETS, load_spec
from refconv.optim import SGD
from refconv.pricing import graph
from refconv.testing.mpirun import find_mpiexec
from refconv.train import step, train
from refconv.train_config import TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


# -- a serial run written directly with refconv.reference (no distributed layer involved) ------
def _init(rng_seed, shape, fan_in):
    rng = numpy.random.default_rng(rng_seed)
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape), rng.uniform(-bound, bound, shape[0])


def serial_reference_loss(spec, x_batches, y_batches, *, lr, momentum, weight_decay, seed=0):
    """Losses of SGD on a sequential spec (conv, batchnorm, relu, maxpool, avgpool, gap,
    linear), computed with refconv.reference only, in float64."""
    params, layers, channels, k = [], [], spec["in_channels"], 0
    for L in spec["layers"]:
        t = L["type"]
        if t == "conv":
            kk = L["kernel"]
            w, b = _init(seed + k, (L["out"], channels, kk, kk), channels * kk * kk)
            k += 1
            layers.append(("conv", dict(stride=L.get("stride", 1), padding=L.get("padding", 0)), len(params)))
            params += [w, b]
            channels = L["out"]
        elif t == "batchnorm":
            layers.append(("bn", {}, len(params)))
            params += [numpy.ones(channels), numpy.zeros(channels)]
        elif t == "linear":
            w, b = _init(seed + k, (L["out"], channels), channels)
            k += 1
            layers.append(("linear", {}, len(params)))
            params += [w, b]
        else:
            layers.append((t, L, None))
    bufs = [numpy.zeros_like(p) for p in params]
    losses = []
    for x, labels in zip(x_batches, y_batches):
        x = x.astype(numpy.float64)
        saved = []
        for t, a, i in layers:  # forward
            if t == "conv":
                saved.append(x)
                x = ref.conv2d_forward(x, params[i], params[i + 1], **a)
            elif t == "bn":
                y, s = ref.batch_norm_forward(x, params[i], params[i + 1])
                saved.append((x, s))
                x = y
            elif t == "relu":
                saved.append(x)
                x = ref.relu_forward(x)
            elif t == "maxpool":
                saved.append(x.shape)
                x, am = ref.max_pool2d_forward(x, a["kernel"], a.get("stride"), a.get("padding", 0))
                saved[-1] = (saved[-1], am)
            elif t == "avgpool":
                saved.append(x.shape)
                x = ref.avg_pool2d_forward(x, a["kernel"], a.get("stride"), a.get("padding", 0))
            elif t == "gap":
                saved.append(x.shape)
                x = ref.global_avg_pool_forward(x)
            elif t == "linear":
                saved.append(x)
                x = ref.linear_forward(x, params[i], params[i + 1])
        loss, probs = ref.softmax_cross_entropy_forward(x, labels)
        losses.append(loss)
        d = ref.softmax_cross_entropy_backward(probs, labels)
        grads = [None] * len(params)
        for (t, a, i), s in zip(reversed(layers), reversed(saved)):  # backward
            if t == "conv":
                grads[i] = ref.conv2d_backward_filter(s, d, params[i].shape, **a)
                grads[i + 1] = ref.conv2d_backward_bias(d)
                d = ref.conv2d_backward_data(d, params[i], s.shape, **a)
            elif t == "bn":
                d, grads[i], grads[i + 1] = ref.batch_norm_backward(d, s[0], params[i], s[1])
            elif t == "relu":
                d = ref.relu_backward(d, s)
            elif t == "maxpool":
                d = ref.max_pool2d_backward(d, s[1], s[0], a["kernel"], a.get("stride"), a.get("padding", 0))
            elif t == "avgpool":
                d = ref.avg_pool2d_backward(d, s, a["kernel"], a.get("stride"), a.get("padding", 0))
            elif t == "gap":
                d = ref.global_avg_pool_backward(d, s)
            elif t == "linear":
                d, grads[i], grads[i + 1] = ref.linear_backward(d, s, params[i])
        for p, g, buf in zip(params, grads, bufs):  # PyTorch's SGD, written out
            g = g + weight_decay * p
            buf *= momentum
            buf += g
            p -= lr * buf
    return losses


def test_digits_cnn_one_rank_equals_reference_loop():
    spec = load_spec("digits-cnn")
    x, y, _, _ = datasets.load_digits(dtype=numpy.float64)
    batches = list(datasets.batches(x, y, 16, seed=3, drop_last=True))[:4]
    expected = serial_reference_loss(spec, [b[0] for b in batches], [b[1] for b in batches],
                                     lr=0.1, momentum=0.9, weight_decay=1e-3, seed=7)
    model = Model.from_spec(spec, serial=True, backend="numpy", dtype=numpy.float64, seed=7)
    opt = SGD(model, 0.1, momentum=0.9, weight_decay=1e-3)
    got = [step(model, opt, xb, yb) for xb, yb in batches]
    numpy.testing.assert_allclose(got, expected, rtol=1e-10)


# -- specs and presets -------------------------------------------------------------------------
GOOD = {"in_channels": 1, "layers": [{"type": "conv", "out": 4, "kernel": 3}, {"type": "gap"},
                                     {"type": "linear", "out": 3}]}


def _with(layer_index=None, **changes):
    spec = {"in_channels": 1, "layers": [dict(l) for l in GOOD["layers"]]}
    if layer_index is None:
        spec.update(changes)
    else:
        spec["layers"][layer_index].update(changes)
    return spec


@pytest.mark.parametrize("spec, match", [
    (_with(0, kernal=3), r"layers\[0\]: unknown key 'kernal' for a 'conv' layer"),
    (_with(0, type="convolution"), r"layers\[0\].type: unknown layer type 'convolution'"),
    ({"in_channels": 1, "layers": [{"type": "conv", "out": 4}]}, r"layers\[0\]: a 'conv' layer needs 'kernel'"),
    (_with(0, grid={"samples": 1}), r"layers\[0\].grid: unknown axis 'samples'"),
    (_with(0, grid={"sample": 2}), r"layers\[0\].grid: grid: sample\*channel\*height\*width = 2"),
    (_with(0, algorithm="stationary-z"), r"layers\[0\].algorithm: expected one of"),
    (_with(layers=[{"type": "conv", "out": 4, "kernel": 3}, {"type": "linear", "out": 3}]),
     r"layers\[1\]: 'linear' needs features"),
    (_with(layers=[{"type": "conv", "out": 4, "kernel": 3}]), r"the last layer must be 'linear'"),
    (_with(layers=[{"type": "gap"}, {"type": "conv", "out": 4, "kernel": 3}]), r"layers\[1\]: a 'conv' layer cannot follow"),
    (_with(1, type="linear", out=3, **{"in": 7}), r"layers\[1\]"),
    (_with(colour="red"), r"spec: unknown key 'colour'"),
    (_with(defaults={"grid": {"sample": 1}, "algo": "x"}), r"spec.defaults"),
    ("resnet18", r"neither a preset"),
    ({"in_channels": 1, "layers": [{"type": "residual", "layers": [{"type": "conv", "out": 4, "kernel": 1}]},
                                   {"type": "gap"}, {"type": "linear", "out": 2}]},
     r"layers\[0\]: the body ends with 4 channels but the shortcut gives 1"),
])
def test_spec_errors_name_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        Model.from_spec(spec, backend="numpy")


@pytest.mark.parametrize("spec", [
    _with(0, kernal=3),
    _with(0, type="convolution"),
    {"in_channels": 1, "layers": [{"type": "conv", "out": 4}]},
    _with(layers=[{"type": "conv", "out": 4, "kernel": 3}, {"type": "linear", "out": 3}]),
    _with(layers=[{"type": "conv", "out": 4, "kernel": 3}]),
    _with(layers=[{"type": "gap"}, {"type": "conv", "out": 4, "kernel": 3}]),
    _with(layers=[{"type": "residual", "layers": [{"type": "gap"}]}, {"type": "linear", "out": 3}]),
    _with(colour="red"),
    {"in_channels": 1, "layers": []},
])
def test_the_builder_and_the_planner_refuse_a_spec_with_the_same_message(spec):
    """Both read the spec's structure through refconv.spec_tree.parse, never by themselves."""
    with pytest.raises(ValueError) as built:
        Model.from_spec(spec, backend="numpy")
    with pytest.raises(graph.BindError) as planned:
        graph.bind(spec, (2, 1, 8, 8))
    assert str(planned.value) == str(built.value)


def test_spec_from_json_and_yaml(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(GOOD))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(GOOD))
    for name in ("m.json", "m.yaml"):
        model = Model.from_spec(str(tmp_path / name), backend="numpy")
        assert [q for q, _, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_bind_error_names_the_layer():
    model = Model.from_spec({"in_channels": 1, "layers": [{"type": "maxpool", "kernel": 4}, {"type": "gap"},
                                                          {"type": "linear", "out": 2}]}, backend="numpy")
    with pytest.raises(ValueError, match="layer 0"):
        model.bind((2, 1, 2, 2))


def test_a_bind_error_of_a_redistribution_names_the_layer_it_leads_to():
    """A Redistribute has no name (``None`` in the chain's names): its error names the next layer."""
    names = [None, "0", None, "1", None]
    assert [entry_name(names, at) for at in range(5)] == [
        "the redistribution before layer 0", "layer 0", "the redistribution before layer 1", "layer 1",
        "the redistribution at the end of the block"]


@pytest.mark.parametrize("name, params", [("digits-cnn", 28970), ("resnet50", 25557032),
                                          ("resnet50-wide2", 68883240)])
def test_presets_build(name, params):
    model = Model.from_spec(name, backend="numpy", serial=True)
    assert model.num_parameters() == params  # torchvision's resnet50 and wide_resnet50_2 have these counts
    assert len(model.named_parameters()) == len({q for q, _, _ in model.named_parameters()})


def test_wide_presets_scale_the_bottleneck():
    for name, width in (("resnet50", 1), ("resnet50-wide2", 2), ("resnet50-wide4", 4)):
        block = load_spec(name)["layers"][4]
        assert [c["out"] for c in block["layers"] if c["type"] == "conv"] == [64 * width, 64 * width, 256]


def test_resnet50_forward_backward_at_32x32():
    model = Model.from_spec("resnet50", backend="numpy", serial=True, num_classes=10)
    x = numpy.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(numpy.float32)
    model.bind(x.shape)
    loss = model.loss(model.forward(x), numpy.array([1, 7]))
    assert 1.0 < loss < 5.0
    dx = model.backward()
    assert dx.shape == x.shape and numpy.isfinite(dx).all()
    assert all(layer.gradients()[p] is not None for _, layer, p in model.named_parameters())


def test_presets_listed():
    assert set(PRESETS) == {"digits-cnn", "resnet50", "resnet50-wide2", "resnet50-wide4", "resnext50-32x4d",
                            "mobilenet", "cosmoflow"}


# -- training, evaluation and resume (one rank) ----------------------------------------------------
def _small_npz(tmp_path):
    x, y, _, _ = datasets.load_digits(upsample=1)  # 8x8: cheap
    path = tmp_path / "small.npz"
    numpy.savez(path, x=x[:200], y=y[:200])
    return str(path)


def test_training_is_deterministic_and_resume_continues_exactly(tmp_path):
    cfg = dict(data=_small_npz(tmp_path), batch_size=32, epochs=2, progress=False, dtype="float64", backend="numpy")
    quiet = lambda *a, **k: None  # noqa: E731
    full = train(TrainConfig(**cfg), log=quiet)
    again = train(TrainConfig(**cfg), log=quiet)
    assert full["losses"] == again["losses"]
    assert full["steps"] == 10 and 0.0 <= full["accuracy"] <= 1.0
    ckpt = str(tmp_path / "ckpt")
    first = train(TrainConfig(**dict(cfg, epochs=2, max_steps=5), checkpoint_dir=ckpt), log=quiet)
    rest = train(TrainConfig(**cfg, checkpoint_dir=ckpt, resume=True), log=quiet)
    assert first["losses"] + rest["losses"] == full["losses"]
    assert rest["accuracy"] == full["accuracy"]


# -- the command line ------------------------------------------------------------------------------
def test_cli_help_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "refconv.cli", "train", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for option in ("--grid", "--algorithm", "--filter-groups", "--model", "--data", "--synthetic", "--epochs",
                   "--batch-size", "--lr", "--momentum", "--weight-decay", "--seed", "--backend", "--dtype",
                   "--checkpoint-dir", "--resume", "--check-serial", "--timeout", "--metrics-out", "--log-every"):
        assert option in out
    top = subprocess.run([sys.executable, "-m", "refconv.cli", "--version"], capture_output=True, text=True).stdout
    assert top.startswith("refconv ")


def test_cli_bad_grid_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "refconv.cli", "train", "--grid", "samples=2"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--grid" in r.stderr


def test_cli_train_two_ranks_with_serial_check_and_resharded_resume(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    base = [find_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "refconv.cli", "train",
            "--data", _small_npz(tmp_path), "--batch-size", "32", "--no-progress", "--dtype", "float64",
            "--backend", "numpy", "--checkpoint-dir", str(tmp_path / "ckpt")]
    metrics = tmp_path / "metrics.jsonl"
    r = subprocess.run(base + ["--grid", "sample=2", "--epochs", "1", "--check-serial", "3", "--metrics-out",
                               str(metrics)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check-serial: OK" in r.stdout and "bytes" in r.stdout and "epoch 1/1" in r.stdout
    assert "2 ranks;" in r.stdout and "grid sample=2" in r.stdout

    *lines, last = [json.loads(line) for line in metrics.read_text().splitlines()]  # rank 0's, one per step
    assert [m["step"] for m in lines] == list(range(1, 6)) and len(last["summary"]["overlap_per_rank"]) == 2
    allreduce = lines[0]["collectives"]["allreduce"]
    assert allreduce["calls"] > 0 and allreduce["bytes"] > 0 and allreduce["seconds"] > 0
    r = subprocess.run(base + ["--grid", "channel=2", "--algorithm", "stationary-y", "--epochs", "2", "--resume"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed" in r.stdout and "epoch 2/2" in r.stdout and "reduce_scatter" in r.stdout


def test_a_killed_run_resumes_exactly(tmp_path):
    """SIGKILL a training process after a periodic checkpoint; resuming reproduces the losses."""
    npz, ckpt = _small_npz(tmp_path), tmp_path / "ckpt"
    cfg = dict(data=npz, batch_size=16, epochs=40, progress=False, dtype="float64", backend="numpy")
    run = [sys.executable, "-m", "refconv.cli", "train", "--data", npz, "--batch-size", "16", "--epochs", "40",
           "--dtype", "float64", "--backend", "numpy", "--no-progress",
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"]
    proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest, deadline, saved = ckpt / "manifest.json", time.monotonic() + 60, 0
    try:
        while time.monotonic() < deadline and saved < 6:
            if manifest.exists():
                saved = json.loads(manifest.read_text())["step"]
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    step = json.loads(manifest.read_text())["step"]  # whatever the kill left: a whole checkpoint
    assert step >= 6  # a periodic save (a multiple of 3) or, if the kill came late, an end-of-epoch one
    quiet = lambda *a, **k: None  # noqa: E731
    rest = train(TrainConfig(**cfg, checkpoint_dir=str(ckpt), resume=True, max_steps=4), log=quiet)
    full = train(TrainConfig(**cfg, max_steps=step + 4), log=quiet)
    assert rest["losses"] == full["losses"][step:]


def test_cli_bad_input_under_mpiexec_is_a_clear_error_not_a_hang(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad = tmp_path / "bad.npz"
    bad.write_text("not an archive")
    for args, message in ((["--grid", "sample=3"], "product is 2"),
                          (["--data", str(bad)], "is not a readable .npz archive"),
                          (["--grid", "sample=1,sample=2"], "argument --grid: axis 'sample' is given twice"),
                          (["--batch-size", "1"], "--batch-size: 1 samples cannot be split over the sample=2 ranks")):
        t0 = time.monotonic()
        r = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "refconv.cli", "train",
                            "--no-progress", *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
        assert r.returncode == 2 and time.monotonic() - t0 < 20
        # printed once (by rank 0), on a line of its own; argparse's usage once too
        errors = [line for line in r.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].startswith("refconv train: error:") and message in errors[0], r.stderr
        assert r.stderr.count("usage:") <= 1 and "Traceback" not in r.stderr
