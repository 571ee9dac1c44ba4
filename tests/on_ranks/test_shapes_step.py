"""A training step on shapes-only arrays (refconv.shapes) makes the same calls, with the same bytes, as a
step with NumPy values, and on a priced run its logical clock ends at exactly the same time; a value is
never drawn (no global weights) and the loss is None.  Mixing shapes-only and NumPy buffers in one call,
and reusing a send buffer before its request completes, are refused as with values."""

import json

import numpy
import pytest

from on_ranks.test_records import MIXED   # a grid per layer, every algorithm: the records test's model
from refconv import collectives, datasets, simulated
from refconv.collectives import local
from refconv.model import Model
from refconv.optim import SGD
from refconv.shapes import Mixed, NoValues
from refconv.shapes.namespace import xp
from refconv.simulated.world import BufferReused
from refconv.train import evaluate, format_summary, step, train
from refconv.train_config import TrainConfig

# 2-D (resnet50 small and a grid per layer) and 3-D (conv, batchnorm, pooling, a residual block, MSE)
VOLUME = {"name": "volume", "dims": 3, "loss": "mse", "in_channels": 2, "layers": [
    {"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "maxpool", "kernel": 2},
    {"type": "residual", "layers": [{"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "relu"}]},
    {"type": "gap"}, {"type": "linear", "out": datasets.VOLUME_TARGETS}]}
CASES = [("resnet50", {"channel": 4}, dict(num_classes=10, in_channels=1)),
         ("digits-cnn", {"sample": 2, "height": 2}, {}),
         (MIXED, None, {}),
         (VOLUME, {"channel": 2, "depth": 2}, {}),
         (VOLUME, {"sample": 2, "height": 2}, {})]


def _two_steps(comm, backend, name, grid, kwargs, overlap):
    model = Model.from_spec(name, comm=comm, backend=backend, seed=0, defaults={"grid": grid} if grid else None,
                            **kwargs)
    if overlap:
        model.set_overlap(True)
        model.set_buckets(1 << 14)
    rng = numpy.random.default_rng(0)
    volume = isinstance(name, dict) and name.get("dims") == 3
    x = rng.standard_normal((4, 2, 8, 8, 8) if volume else (8, 1, 16, 16)).astype(numpy.float32)
    y = rng.standard_normal((4, datasets.VOLUME_TARGETS)).astype(numpy.float32) if volume else rng.integers(0, 10, 8)
    optimizer = SGD(model.bind(x.shape), 0.1, momentum=0.9)
    first = step(model, optimizer, x, y)
    stats = local.current().stats
    stats.reset()
    second = step(model, optimizer, x, y)
    drawn = [layer._global_init is not None for _, layer in model.named_layers() if hasattr(layer, "_global_init")]
    model.close()
    return first, second, list(stats.records), drawn


@pytest.mark.parametrize("name, grid, kwargs, overlap", [CASES[0] + (True,)] + [c + (o,) for c in CASES[1:3]
                                                                              for o in (False, True)])
def test_a_shapes_step_makes_the_calls_and_bytes_of_a_numpy_step(name, grid, kwargs, overlap):
    values = simulated.run(_two_steps, 4, args=("numpy", name, grid, kwargs, overlap))
    shapes = simulated.run(_two_steps, 4, args=("shapes", name, grid, kwargs, overlap))
    for rank, (v, s) in enumerate(zip(values, shapes)):
        assert isinstance(v[1], float) and s[0] is None and s[1] is None
        assert len(v[2]) > 0 and s[2] == v[2], f"rank {rank}: the records differ"
        assert all(v[3]) and s[3] and not any(s[3]), "values draw every conv's weights, shapes none"


@pytest.mark.parametrize("name, grid, kwargs", CASES[3:])
def test_a_shapes_step_of_volumes_makes_the_calls_and_bytes_of_a_numpy_step(name, grid, kwargs):
    values = simulated.run(_two_steps, 4, args=("numpy", name, grid, kwargs, False))
    shapes = simulated.run(_two_steps, 4, args=("shapes", name, grid, kwargs, False))
    for v, s in zip(values, shapes):
        assert s[1] is None and len(v[2]) > 0 and s[2] == v[2]


@pytest.mark.parametrize("name, grid, kwargs", [CASES[2], CASES[3]])
def test_a_priced_shapes_step_ends_at_the_time_of_a_priced_numpy_step(name, grid, kwargs):
    values = simulated.run(_two_steps, 4, args=("numpy", name, grid, kwargs, True), machine="v100-edr")
    shapes = simulated.run(_two_steps, 4, args=("shapes", name, grid, kwargs, True), machine="v100-edr")
    for (v, v_clock), (s, s_clock) in zip(values, shapes):
        assert s[2] == v[2]
        assert v_clock.now() > 0 and s_clock.now() == v_clock.now()


def _mixed(comm):
    x = xp.zeros((6,), numpy.float32) if comm.rank == 0 else numpy.zeros(6, numpy.float32)
    collectives.allreduce(comm, x)


def test_a_shapes_buffer_and_a_numpy_buffer_in_one_call_are_refused():
    with pytest.raises(Mixed, match="Allreduce"):
        simulated.run(_mixed, 2)


def _reused(comm, part):
    x = xp.zeros((8,), numpy.float32)
    send = x[:4]
    request = collectives.iallreduce_(comm, send)
    if part == "same":
        send += 1                       # the buffer in flight: refused, though no byte could be compared
    else:
        x[4:] = 1                       # another part of the same root: fine
    request.wait()
    return x.root.version


def test_writing_a_send_buffer_in_flight_is_refused_and_another_part_of_its_array_is_not():
    with pytest.raises(BufferReused, match="changed"):
        simulated.run(_reused, 2, args=("same",))
    assert simulated.run(_reused, 2, args=("other",)) == [2, 2]   # the write, and the allreduce's


def _shapes_training(comm, cfg, metrics):
    said = []
    result = train(TrainConfig(**cfg, metrics_out=metrics if comm.rank == 0 else None), comm=comm, log=said.append)
    with pytest.raises(NoValues, match=r"evaluate \(scoring a test set\) needs the values .*the model's outputs"):
        evaluate(result["model"], numpy.zeros((8, 1, 16, 16), numpy.float32), numpy.zeros(8, numpy.int64), 8)
    return result, said, format_summary(result)


def test_a_shapes_only_training_run_says_it_has_no_loss_and_no_test_score(tmp_path):
    path = tmp_path / "d.npz"
    x, y, _, _ = datasets.load_digits(upsample=1)
    numpy.savez(path, x=x[:24], y=y[:24])
    cfg = dict(model="digits-cnn", data=str(path), batch_size=4, epochs=1, max_steps=2, backend="shapes",
               progress=False, seed=0, grid={"sample": 2})
    metrics = tmp_path / "metrics.jsonl"
    for rank, (result, said, summary) in enumerate(simulated.run(_shapes_training, 2, args=(cfg, str(metrics)))):
        assert result["losses"] == [None, None] and result["epochs"] == [{"epoch": 1, "loss": None, "accuracy": None}]
        assert rank > 0 or any("no loss and no test accuracy (shapes-only run)" in line for line in said), said
        assert "no test accuracy (shapes-only run)" in summary
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["loss"] for line in lines if "step" in line] == [None, None]
