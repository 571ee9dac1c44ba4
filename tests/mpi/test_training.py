"""Distributed training reproduces serial training step by step (float64, 20 steps).

The same model spec runs on 4 ranks with one parallel strategy and on one rank
(``serial=True``: every grid 1x1x1x1 on COMM_SELF); the losses of every step must
agree to a relative 1e-6.  tests/test_model.py checks the one-rank model itself
against a loop written directly with refconv.reference.
"""

import os
import shutil
import sys
import tempfile

import numpy
from mpi4py import MPI

from refconv import datasets, failure
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import TrainConfig, evaluate, step, train

comm = MPI.COMM_WORLD
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


def _serial_losses():
    """Rank 0 trains the one-rank twin; every rank gets its losses."""
    losses = _losses(Model.from_spec(SPEC, serial=True, backend="numpy", dtype=numpy.float64, seed=5)) \
        if comm.rank == 0 else None
    return comm.bcast(losses, root=0)


SERIAL = {}


def _check(defaults, spec=SPEC):
    if "losses" not in SERIAL:
        SERIAL["losses"] = _serial_losses()
    model = Model.from_spec(spec, comm=comm, backend="numpy", dtype=numpy.float64, seed=5, defaults=defaults)
    dist = _losses(model)
    serial = SERIAL["losses"]
    rel = numpy.abs(dist - serial) / numpy.abs(serial)
    assert_all_ranks(comm, rel.max() < 1e-6,
                     f"{defaults}: largest relative difference {rel.max():.2e} at step {rel.argmax() + 1}\n"
                     f"distributed {dist}\nserial {serial}")
    assert_all_ranks(comm, serial[-5:].mean() < serial[:5].mean(), f"the loss did not go down: {serial}")


@mpi_test(sizes=(4,), timeout=240)
def test_stationary_x_matches_serial():
    _check({"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-x"})


@mpi_test(sizes=(4,), timeout=240)
def test_stationary_y_matches_serial():
    _check({"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-y"})


@mpi_test(sizes=(4,), timeout=240)
def test_stationary_w_matches_serial():
    _check({"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-w", "filter_groups": 2})


@mpi_test(sizes=(4,), timeout=240)
def test_sample_and_spatial_match_serial():
    _check({"grid": {"sample": 2, "height": 2}})
    _check({"grid": {"height": 2, "width": 2}})


@mpi_test(sizes=(4,), timeout=240)
def test_mixed_grids_per_layer_match_serial():
    """Layers on three different grids: Redistribute forward and backward inside training."""
    spec = dict(SPEC, layers=list(SPEC["layers"]))
    spec["layers"][3] = dict(spec["layers"][3], grid={"height": 2, "width": 2})
    spec["layers"][-1] = dict(spec["layers"][-1], grid={"sample": 4})
    _check({"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-y"}, spec)


# -- batches of any size (issue 11): a last batch smaller than the sample split ----------------------
@mpi_test(sizes=(4,), timeout=240)
def test_evaluation_of_any_test_set_size_matches_one_rank():
    """Test sets of 8..11 samples at batch 4 leave a last batch of 4, 1, 2 and 3 samples (ranks
    of sample=4 left empty).  The labels are the one-rank model's own predictions, so the
    accuracy must be exactly 1, and exactly 0 with every label shifted: a padded sample counted
    or a real one lost would show."""
    x, _, _, _ = datasets.load_digits(upsample=1, dtype=numpy.float64)
    serial = Model.from_spec(SPEC, serial=True, backend="numpy", dtype=numpy.float64, seed=5).eval()
    serial.bind((11,) + x.shape[1:])
    predicted = serial.forward(x[:11]).reshape(11, -1).argmax(axis=1)
    for defaults in ({"grid": {"sample": 4}}, {"grid": {"sample": 2, "channel": 2}, "algorithm": "stationary-y"}):
        model = Model.from_spec(SPEC, comm=comm, backend="numpy", dtype=numpy.float64, seed=5, defaults=defaults)
        for n in range(8, 12):
            right = evaluate(model, x[:n], predicted[:n], 4)
            wrong = evaluate(model, x[:n], (predicted[:n] + 1) % 10, 4)
            assert_all_ranks(comm, (right, wrong) == (1.0, 0.0), f"{defaults}, {n} samples: {right}, {wrong}")


@mpi_test(sizes=(4,), timeout=240)
def test_training_runs_of_every_remainder_match_one_rank():
    """``train`` on sample=4 at batch 4 with training sets of every size mod 4 and test sets of
    2, 3, 4 and 5 samples: the same losses (float64) and accuracy as the run on one rank."""
    x, y, _, _ = datasets.load_digits(upsample=1)
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    for n in (16, 17, 18, 19, 20, 24, 28):          # train 14..23 samples, test 2..5 (see datasets.split)
        path = os.path.join(folder, f"d{n}.npz")
        if comm.rank == 0:
            numpy.savez(path, x=x[:n], y=y[:n])
        comm.Barrier()
        cfg = dict(model=SPEC, data=path, batch_size=4, epochs=2, dtype="float64", backend="numpy", progress=False,
                   seed=3)
        dist = train(TrainConfig(**cfg, grid={"sample": 4}), log=lambda *a: None)
        one = train(TrainConfig(**cfg), comm=MPI.COMM_SELF, log=lambda *a: None) if comm.rank == 0 else None
        one = comm.bcast(None if one is None else (one["losses"], one["accuracy"]), root=0)
        rel = numpy.abs(numpy.subtract(dist["losses"], one[0])) / numpy.abs(one[0])
        assert_all_ranks(comm, len(dist["losses"]) == len(one[0]) and rel.max() < 1e-6 and
                         dist["accuracy"] == one[1], f"{n} samples: {dist['losses']} vs {one[0]}, "
                                                     f"accuracy {dist['accuracy']} vs {one[1]}")
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)


@mpi_test(sizes=(2,), timeout=60)
def test_import_refconv_installs_the_abort_hook_under_several_ranks():
    assert_all_ranks(comm, failure.installed() and sys.excepthook is failure._report_and_abort,
                     "import refconv under 2 ranks left sys.excepthook alone")
