"""Distributed training reproduces serial training step by step (float64, 20 steps).

The same model spec runs on 4 ranks with one parallel strategy and on one rank
(``serial=True``: every grid 1x1x1x1 on COMM_SELF); the losses of every step must
agree to a relative 1e-6.  tests/test_model.py checks the one-rank model itself
against a loop written directly with refconv.reference.
"""

import numpy
from mpi4py import MPI

from refconv import data
from refconv.model import Model
from refconv.optim import SGD
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.mpirun import mpi_test
from refconv.train import step

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
    x, y, _, _ = data.load_digits(upsample=1, dtype=numpy.float64)
    opt = SGD(model, 0.1, momentum=0.9, weight_decay=1e-3)
    out = []
    for i, (x_b, y_b) in enumerate(data.batches(x, y, BATCH, seed=1, drop_last=True)):
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
