"""Distributed training reproduces serial training step by step (float64, 20 steps).

The same model spec runs on simulated ranks (refconv.simulated) with one parallel strategy,
and on one rank (``serial=True``: every grid 1x1x1x1 on COMM_SELF) in the test's thread, the
process's one MPI rank: a simulated rank cannot use COMM_SELF.  The losses of every step must
agree to a relative 1e-6.  tests/training/test_model.py checks the one-rank model itself against a loop
written directly with refconv.reference.  tests/mpiexec/launched/test_training.py keeps ``train`` under
mpiexec (the last batches of every remainder, against a one-rank run) and the abort hook.
"""

import functools
import glob
import os

import numpy
from mpi4py import MPI

from refconv import datasets, simulated
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks
from refconv.train import evaluate, step, train
from refconv.train_config import TrainConfig

STEPS, BATCH = 20, 8

# Small but complete: a first conv without channel split, BN, ReLU, max pooling, a
# residual block with a projection, average pooling, GAP and the linear head.
SPEC = {
    "in_channels": 1,
    "layers": [
        {"type": "conv", "out": 4, "kernel": 3, "padding": 1, "grid": "no-channel"},
        {"type": "batchnorm"}, {"type": "relu"},
        {"type": "conv", "out": 6, "kernel": 3, "padding": 1},
        {"type": "batchnorm"}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "residual",
         "layers": [{"type": "conv", "out": 8, "kernel": 3, "padding": 1, "bias": False},
                    {"type": "batchnorm"}],
         "shortcut": [{"type": "conv", "out": 8, "kernel": 1, "bias": False}]},
        {"type": "relu"},
        {"type": "avgpool", "kernel": 3, "stride": 1, "padding": 1},
        {"type": "gap"},
        {"type": "linear", "out": 10},
    ],
}


def _losses(model):
    x, y, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    opt = SGD(model, 0.1, momentum=0.9, weight_decay=1e-3)
    out = []
    for i, (x_b, y_b) in enumerate(datasets.batches(x, y, BATCH, seed=1, drop_last=True)):
        if i == STEPS:
            break
        out.append(step(model, opt, x_b, y_b))
    return numpy.array(out)


@functools.cache
def _serial_losses():
    """The one-rank twin's losses, trained once, in the test's thread."""
    return _losses(Model.from_spec(SPEC, serial=True, backend="numpy", dtype=numpy.float64, seed=5))


def _distributed_losses(comm, defaults, spec):
    with Model.from_spec(spec, comm=comm, backend="numpy", dtype=numpy.float64, seed=5, defaults=defaults) as model:
        return _losses(model)


def _check(ranks, defaults, spec=SPEC):
    serial = _serial_losses()
    for rank, dist in enumerate(simulated.run(_distributed_losses, ranks, args=(defaults, spec))):
        rel = numpy.abs(dist - serial) / numpy.abs(serial)
        assert rel.max() < 1e-6, (f"{defaults}, rank {rank}: largest relative difference {rel.max():.2e} at step "
                                  f"{rel.argmax() + 1}\ndistributed {dist}\nserial {serial}")
    assert serial[-5:].mean() < serial[:5].mean(), f"the loss did not go down: {serial}"


# sample x channel grids per world size: 2 splits channels only, 8 a channel split of 4 (uneven: 6 channels)
CHANNEL_GRIDS = {2: {"channel": 2}, 4: {"sample": 2, "channel": 2}, 8: {"sample": 2, "channel": 4}}


@on_ranks(*CHANNEL_GRIDS)
def test_stationary_x_matches_serial(ranks):
    _check(ranks, {"grid": CHANNEL_GRIDS[ranks], "algorithm": "stationary-x"})


@on_ranks(*CHANNEL_GRIDS)
def test_stationary_y_matches_serial(ranks):
    _check(ranks, {"grid": CHANNEL_GRIDS[ranks], "algorithm": "stationary-y"})


@on_ranks(4, 8)
def test_stationary_w_matches_serial(ranks):
    _check(ranks, {"grid": CHANNEL_GRIDS[ranks], "algorithm": "stationary-w", "filter_groups": 2})


@on_ranks(3, 4, 6)
def test_sample_and_spatial_match_serial(ranks):
    rows = 2 if ranks % 2 == 0 else 1
    _check(ranks, {"grid": {"sample": ranks // rows, "height": rows}})
    _check(ranks, {"grid": {"height": ranks // rows, "width": rows}})


@on_ranks(4)
def test_mixed_grids_per_layer_match_serial(ranks):
    """Layers on three different grids: Redistribute forward and backward inside training."""
    spec = dict(SPEC, layers=list(SPEC["layers"]))
    spec["layers"][3] = dict(spec["layers"][3], grid={"height": 2, "width": 2})
    spec["layers"][-1] = dict(spec["layers"][-1], grid={"sample": 4})
    _check(ranks, {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-y"}, spec)


# -- batches of any size (issue 11): a last batch smaller than the sample split ----------------------
def _evaluated(comm, x, predicted):
    for defaults in ({"grid": {"sample": 4}}, {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-y"}):
        model = Model.from_spec(SPEC, comm=comm, backend="numpy", dtype=numpy.float64, seed=5, defaults=defaults)
        for n in range(8, 12):
            right = evaluate(model, x[:n], predicted[:n], 4)
            wrong = evaluate(model, x[:n], (predicted[:n] + 1) % 10, 4)
            assert_all_ranks(comm, (right, wrong) == (1.0, 0.0), f"{defaults}, {n} samples: {right}, {wrong}")
        model.close()


@on_ranks(4)
def test_evaluation_of_any_test_set_size_matches_one_rank(ranks):
    """Test sets of 8..11 samples at batch 4 leave a last batch of 4, 1, 2 and 3 samples (ranks
    of sample=4 left empty).  The labels are the one-rank model's own predictions, so the
    accuracy must be exactly 1, and exactly 0 with every label shifted: a padded sample counted
    or a real one lost would show."""
    x, _, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    serial = Model.from_spec(SPEC, serial=True, backend="numpy", dtype=numpy.float64, seed=5).eval()
    serial.bind((11,) + x.shape[1:])
    predicted = serial.forward(x[:11]).reshape(11, -1).argmax(axis=1)
    simulated.run(_evaluated, ranks, args=(x, predicted))


def _trained(comm, cfg):
    result = train(TrainConfig(**cfg, grid={"sample": comm.size}), comm=comm, log=lambda *a: None)
    return result["losses"], result["accuracy"]


@on_ranks(4)
def test_training_runs_of_every_remainder_match_one_rank(ranks, tmp_path):
    """``train`` on sample=4 at batch 4 with training sets of every size mod 4 and test sets of
    2, 3, 4 and 5 samples: the same losses (float64) and accuracy as the run on one rank (in the
    test's thread, on MPI.COMM_SELF)."""
    x, y, _, _ = datasets.load_digits(upsample=1)
    for n in (16, 17, 18, 19, 20, 24, 28):          # train 14..23 samples, test 2..5 (see datasets.split)
        path = os.path.join(tmp_path, f"d{n}.npz")
        numpy.savez(path, x=x[:n], y=y[:n])
        cfg = dict(model=SPEC, data=path, batch_size=4, epochs=2, dtype="float64", backend="numpy", progress=False,
                   seed=3)
        one = train(TrainConfig(**cfg), comm=MPI.COMM_SELF, log=lambda *a: None)
        for losses, accuracy in simulated.run(_trained, ranks, args=(cfg,)):
            rel = numpy.abs(numpy.subtract(losses, one["losses"])) / numpy.abs(one["losses"])
            assert len(losses) == len(one["losses"]) and rel.max() < 1e-6 and accuracy == one["accuracy"], \
                f"{n} samples: {losses} vs {one['losses']}, accuracy {accuracy} vs {one['accuracy']}"


@on_ranks(1, 2, timeout=300)
def test_a_resume_at_the_epoch_boundary_or_in_epoch_2_is_the_uninterrupted_run_bit_for_bit(comm, tmp_path):
    """Issue 35 (a resume of a 2-epoch run differed): 3 epochs of 8 steps, float32, the default
    cosine schedule and momentum, reading 2 batches ahead, stopped at the boundary of epochs 1
    and 2 (step 8) or inside epoch 2 (step 11) and resumed from that checkpoint: the resumed
    losses are the uninterrupted run's and so are the final parameters and momentum, bit for bit."""
    grid = {"channel": comm.size} if comm.size > 1 else None
    base = dict(synthetic=True, image_size=8, synthetic_samples=128, batch_size=16, epochs=3, checkpoint_every=4,
                prefetch=2, grid=grid, backend="numpy", progress=False)
    quiet = {"comm": comm, "log": lambda *a, **k: None}

    def final(directory):  # this rank's shard of the checkpoint at the last step: {tensor: bytes}
        (path,) = glob.glob(os.path.join(directory, f"shard-{comm.rank:05d}-of-*-step-00000024-*.npz"))
        return {k: v.tobytes() for k, v in datasets.load_arrays(path).items()}

    straight = train(TrainConfig(**base, checkpoint_dir=str(tmp_path / "straight")), **quiet)["losses"]
    for stop in (8, 11):
        directory = str(tmp_path / f"stopped-{stop}")
        first = train(TrainConfig(**base, checkpoint_dir=directory, max_steps=stop), **quiet)["losses"]
        rest = train(TrainConfig(**base, checkpoint_dir=directory, resume=True), **quiet)["losses"]
        assert_all_ranks(comm, len(straight) == 24 and len(first) == stop and first + rest == straight,
                         f"stopped at {stop}: {first + rest} against {straight}")
        assert_all_ranks(comm, final(directory) == final(str(tmp_path / "straight")),
                         f"stopped at {stop}: the final tensors differ")
