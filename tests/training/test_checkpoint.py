"""refconv.checkpoint on one rank: round trip, resume, every way a checkpoint can be bad,
and a save interrupted at each of its points."""

import errno
import json
import os

import numpy
import pytest
from mpi4py import MPI

from refconv import checkpoint, collectives, train
from refconv.checkpoint import CheckpointError
from refconv.grid import ProcessGrid
from refconv.optim import SGD
from refconv.testing.models import TwoConvs
from refconv.train import guards
from refconv.train_config import TrainConfig


class TinyModel(TwoConvs):
    """Two DistConv2d layers (refconv.testing.models.TwoConvs), 2 output channels by default."""

    def __init__(self, grid, *, out2=2, **kw):
        super().__init__(grid, out2=out2, **kw)


def fake_backward(model, scale):
    """Deterministic gradients (in place of a real backward)."""
    for i, (_, layer, pname) in enumerate(model.named_parameters()):
        p = layer.parameters()[pname]
        setattr(layer, f"{pname}_grad", numpy.full_like(p, scale * (i + 1)) + 0.01 * p)


def snapshot(model, opt=None):
    out = {q: layer.parameters()[p].copy() for q, layer, p in model.named_parameters()}
    if opt is not None:
        out.update({"momentum/" + q: b.copy() for q, b in opt.state().items()})
    return out


@pytest.fixture
def grid():
    return ProcessGrid(MPI.COMM_SELF)


@pytest.fixture
def saved(tmp_path, grid):
    model = TinyModel(grid)
    opt = SGD(model, lr=0.1, momentum=0.9)
    fake_backward(model, 1.0)
    opt.step()
    checkpoint.save(tmp_path / "ck", model, opt, step=1, extra={"epoch": 0, "seed": 5})
    return tmp_path / "ck", model, opt


SHARD = "shard-00000-of-00001-step-00000001-save-000001.npz"     # of the fixture `saved`


def test_files_and_manifest(saved):
    directory, model, _ = saved
    assert sorted(os.listdir(directory)) == ["manifest.json", SHARD]
    m = json.loads((directory / "manifest.json").read_text())
    assert m["format"] == "refconv-checkpoint" and m["version"] == 2 and m["save"] == 1
    assert m["world_size"] == 1 and m["step"] == 1 and m["extra"] == {"epoch": 0, "seed": 5}
    names = [(t["kind"], t["name"]) for t in m["tensors"]]
    assert names == [("param", "conv1.weight"), ("param", "conv1.bias"), ("param", "conv2.weight"),
                     ("param", "conv2.bias"), ("momentum", "conv1.weight"),
                     ("momentum", "conv1.bias"), ("momentum", "conv2.weight"),
                     ("momentum", "conv2.bias")]
    bias = m["tensors"][1]
    assert bias["global_shape"] == [6, 1, 1, 1] and bias["shape"] == [6]
    assert bias["pieces"] == [[[[0, 6]], [[0, 1]], [[0, 1]], [[0, 1]]]]
    with numpy.load(directory / SHARD) as z:
        assert z["param/conv1.bias"].shape == (6, 1, 1, 1)      # saved as its 4-D block


def test_round_trip_restores_params_momentum_step_extra(saved, grid):
    directory, model, opt = saved
    other = TinyModel(grid, seed=9)
    other_opt = SGD(other, lr=0.1, momentum=0.9)
    weight = other.layers["conv1"].weight
    step, extra = checkpoint.load(directory, other, other_opt)
    assert (step, extra) == (1, {"epoch": 0, "seed": 5})
    assert other.layers["conv1"].weight is weight                # loaded in place
    want, got = snapshot(model, opt), snapshot(other, other_opt)
    assert all(numpy.array_equal(want[k], got[k]) for k in want)


def test_resume_continues_exactly(tmp_path, grid):
    """4 steps straight == 2 steps, save, load into a fresh model, 2 steps."""
    straight = TinyModel(grid)
    opt = SGD(straight, lr=0.05, momentum=0.9, weight_decay=1e-3)
    for s in range(4):
        fake_backward(straight, s + 1.0)
        opt.step()
    first = TinyModel(grid)
    opt1 = SGD(first, lr=0.05, momentum=0.9, weight_decay=1e-3)
    for s in range(2):
        fake_backward(first, s + 1.0)
        opt1.step()
    checkpoint.save(tmp_path, first, opt1, step=2)
    resumed = TinyModel(grid, seed=3)
    opt2 = SGD(resumed, lr=0.05, momentum=0.9, weight_decay=1e-3)
    step, _ = checkpoint.load(tmp_path, resumed, opt2)
    for s in range(step, 4):
        fake_backward(resumed, s + 1.0)
        opt2.step()
    want, got = snapshot(straight, opt), snapshot(resumed, opt2)
    assert all(numpy.array_equal(want[k], got[k]) for k in want)


def test_save_again_replaces_and_numpy_extra(saved):
    directory, model, opt = saved
    checkpoint.save(directory, model, opt, step=numpy.int64(7),
                    extra={"rng": numpy.random.default_rng(1).bit_generator.state,
                           "pos": numpy.int32(3), "arr": numpy.arange(2)})
    step, extra = checkpoint.load(directory, model, opt)
    assert step == 7 and extra["pos"] == 3 and extra["arr"] == [0, 1]
    rng = numpy.random.default_rng()
    rng.bit_generator.state = extra["rng"]
    assert rng.random() == numpy.random.default_rng(1).random()
    assert not [f for f in os.listdir(directory) if ".tmp" in f]


def test_load_without_optimizer_and_cast(saved, grid):
    directory, model, _ = saved
    other = TinyModel(grid, seed=4)
    checkpoint.load(directory, other)
    assert numpy.array_equal(other.layers["conv2"].bias, model.layers["conv2"].bias)


def _assert_unchanged_after(model, fn, match):
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=match):
        fn()
    after = snapshot(model)
    assert all(numpy.array_equal(before[k], after[k]) for k in before)   # no partial load


def test_flipped_byte_is_a_checksum_error(saved, grid):
    directory, _, _ = saved
    shard = directory / SHARD
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    shard.write_bytes(bytes(blob))
    other = TinyModel(grid, seed=2)
    _assert_unchanged_after(other, lambda: checkpoint.load(directory, other), "corrupt shard")


def test_missing_manifest_is_incomplete(saved, grid):
    directory, model, _ = saved
    (directory / "manifest.json").unlink()
    _assert_unchanged_after(model, lambda: checkpoint.load(directory, model), "incomplete")


def test_missing_shard(saved, grid):
    directory, model, _ = saved
    (directory / SHARD).unlink()
    _assert_unchanged_after(model, lambda: checkpoint.load(directory, model), "missing shard")


@pytest.mark.parametrize("tamper,match", [
    (lambda text: text[:-20], "not valid JSON"),
    (lambda text: text.replace('"version": 2', '"version": 99'), "version 99"),
    (lambda text: text.replace('"save": 1', '"save": 0'), "save must be"),
    (lambda text: text.replace('-save-000001', '-save-000002'), "malformed"),
    (lambda text: text.replace('"world_size": 1', '"world_size": 2'), "2 shards|1 shards"),
    (lambda text: text.replace("shard-00000-of-00001", "../etc/passwd"), "malformed"),
    (lambda text: text.replace('"global_shape": [6, 4, 3, 3]', '"global_shape": [6, 4, 3]'),
     "global_shape"),
    (lambda text: text.replace('"step": 1', '"step": -1'), "step"),
    (lambda text: "[]", "format"),
])
def test_tampered_manifest(saved, tamper, match):
    directory, model, _ = saved
    path = directory / "manifest.json"
    path.write_text(tamper(path.read_text()))
    _assert_unchanged_after(model, lambda: checkpoint.load(directory, model), match)


def test_model_mismatch(saved, grid):
    directory, _, _ = saved
    wider = TinyModel(grid, out2=3)
    _assert_unchanged_after(wider, lambda: checkpoint.load(directory, wider),
                            r"conv2.weight: checkpoint global shape \(2, 6, 1, 1\) != the model's")
    bare = TinyModel(grid)
    checkpoint.save(directory, bare, step=0)                       # no optimizer
    _assert_unchanged_after(bare, lambda: checkpoint.load(directory, bare, SGD(bare, lr=0.1)),
                            "no tensor momentum/conv1.weight")

    class Half(TinyModel):
        def named_parameters(self):
            return [e for e in super().named_parameters() if e[0].startswith("conv1")]

    half = Half(grid)
    _assert_unchanged_after(half, lambda: checkpoint.load(directory, half), "model lacks")


def test_bad_save_arguments(tmp_path, grid):
    model = TinyModel(grid)
    with pytest.raises(CheckpointError, match="step"):
        checkpoint.save(tmp_path, model, step=-1)
    with pytest.raises(CheckpointError, match="JSON"):
        checkpoint.save(tmp_path, model, step=0, extra={"f": object()})
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot save"):
        checkpoint.save(tmp_path / "file", model, step=0)
    assert not (tmp_path / "manifest.json").exists()


def test_version_1_still_loads(saved, grid):
    """Version 1 named shards by rank and step alone, and had no save number."""
    directory, model, opt = saved
    old = "shard-00000-of-00001-step-00000001.npz"
    (directory / SHARD).rename(directory / old)
    m = json.loads((directory / "manifest.json").read_text())
    m.update(version=1, shards=[dict(m["shards"][0], file=old)])
    del m["save"]
    (directory / "manifest.json").write_text(json.dumps(m))
    other = TinyModel(grid, seed=9)
    other_opt = SGD(other, lr=0.1, momentum=0.9)
    assert checkpoint.load(directory, other, other_opt)[0] == 1
    want, got = snapshot(model, opt), snapshot(other, other_opt)
    assert all(numpy.array_equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("same_step", [True, False], ids=["same-step", "next-step"])
@pytest.mark.parametrize("point", checkpoint.FAULT_POINTS)
def test_interrupted_save_loses_nothing(saved, grid, point, same_step):
    """A save stopped at ``point`` leaves the committed checkpoint or the new one, whole;
    the next save removes what the stopped one left.  (An exception at the point stands
    in for a kill here: nothing after it runs.  tests/mpiexec/test_faults.py kills real ranks.)"""
    directory, model, opt = saved
    before = snapshot(model, opt)
    fake_backward(model, 2.0)
    opt.step()
    after = snapshot(model, opt)
    step = 1 if same_step else 2
    collectives.set_fault(f"0:{point}:raise")
    try:
        with pytest.raises((collectives.FaultInjected, CheckpointError), match=f"injected at {point} "):
            checkpoint.save(directory, model, opt, step=step)
    finally:
        collectives.set_fault(None)
    committed = checkpoint.FAULT_POINTS.index(point) >= checkpoint.FAULT_POINTS.index("checkpoint.commit")
    other = TinyModel(grid, seed=9)
    other_opt = SGD(other, lr=0.1, momentum=0.9)
    loaded_step, _ = checkpoint.load(directory, other, other_opt)
    want, got = (after if committed else before), snapshot(other, other_opt)
    assert loaded_step == (step if committed else 1)
    assert all(numpy.array_equal(want[k], got[k]) for k in want)

    checkpoint.save(directory, model, opt, step=3)          # cleans up after the stopped save
    m = json.loads((directory / "manifest.json").read_text())
    assert m["step"] == 3 and sorted(os.listdir(directory)) == ["manifest.json", m["shards"][0]["file"]]


@pytest.mark.parametrize("kind", ["param", "momentum"])
def test_a_nonfinite_tensor_is_refused_and_training_names_it(saved, kind):
    """A NaN or inf in a parameter or its momentum: save refuses before writing anything,
    and refconv train's guard (refconv.train.guards.check_finite) names the step and the tensor."""
    directory, model, opt = saved
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    q, layer, p = list(model.named_parameters())[1]
    tensor = opt.state()[q] if kind == "momentum" else layer.parameters()[p]
    tensor.flat[-1] = numpy.inf
    assert checkpoint.nonfinite(model, opt) == f"{kind}/{q} (1 of {tensor.size} values on rank 0)"
    with pytest.raises(CheckpointError, match=f"{kind}/{q} .* are not finite"):
        checkpoint.save(directory, model, opt, step=2)
    assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before
    cfg = TrainConfig(checkpoint_dir=str(directory))
    with pytest.raises(train.Diverged, match=rf"after step 7, {kind}/{q} \(1 of .*the checkpoint of step 1 in "):
        guards.check_finite(cfg, MPI.COMM_SELF, model, opt, 7, 1)
    with pytest.raises(train.Diverged, match="the loss of step 8 is nan"):
        guards.check_loss(cfg, float("nan"), 8, 1)
    guards.check_loss(cfg, 2.5, 8, 1)


def test_a_failed_write_leaves_no_temporary_file(saved, monkeypatch):
    """A full disk (ENOSPC at fsync) fails the save on every rank and removes its temporary
    file, so the previous checkpoint stays whole and the next save in place is not tripped."""
    directory, model, opt = saved
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        checkpoint.save(directory, model, opt, step=2)
    assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before
    monkeypatch.undo()
    checkpoint.save(directory, model, opt, step=2)
    assert checkpoint.load(directory, model, opt)[0] == 2


def test_a_locked_checkpoint_folder_is_refused(tmp_path):
    """checkpoint.lock: a second holder is refused with one line until the first lets go."""
    held = checkpoint.lock(tmp_path / "ck")
    try:
        with pytest.raises(CheckpointError, match="is in use by another run"):
            checkpoint.lock(tmp_path / "ck")
    finally:
        os.close(held)
    os.close(checkpoint.lock(tmp_path / "ck"))
    assert os.listdir(tmp_path / "ck") == []                        # no lock file left behind
