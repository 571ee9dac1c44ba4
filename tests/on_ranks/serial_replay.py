"""The one-rank replay of a training run on simulated ranks, made in the test's thread.

``refconv train --check-serial K`` (:func:`refconv.train.serial_check.check_serial`) replays the first K
steps on rank 0 on a twin of the model built on a one-rank communicator (``collectives.comm_self()``,
a simulated rank's own one on simulated ranks).  These tests replay in the test's thread instead,
with the functions ``check_serial`` calls, and compare as it does: the twin then runs outside the
simulated world altogether, an oracle that shares nothing with it.  tests/mpiexec/launched/test_plan.py keeps
``check_serial`` itself under mpiexec.
"""

import numpy

from refconv.train import build_model, load_dataset
from refconv.train.serial_check import serial_losses


def serial_check(cfg, losses):
    """The largest relative difference between ``losses``, the first steps of a run of ``cfg``,
    and the same steps of the one-rank twin (``check_serial``'s figure)."""
    x, y, _, _, num_classes = load_dataset(cfg, numpy.dtype(cfg.dtype))
    twin = build_model(cfg, serial=True, in_channels=x.shape[1], num_classes=num_classes)
    serial = serial_losses(cfg, twin, len(losses), x, y)
    twin.close()
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, serial))
