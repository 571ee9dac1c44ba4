"""The one-rank replay of a training run on simulated ranks, made in the test's thread.

``refconv train --check-serial K`` (:func:`refconv.train.check_serial`) replays the first K
steps on rank 0 on a twin of the model built on ``MPI.COMM_SELF``.  A simulated rank cannot
run that twin: its grids split COMM_SELF, and refconv.collectives refuses a real communicator
on a simulated rank.  The test's thread is this process's one MPI rank, where it can; so the
runs on simulated ranks train with ``check_serial`` off and the test replays here, with the
functions ``check_serial`` calls, and compares as it does.  tests/mpi/test_plan.py keeps
``check_serial`` itself under mpiexec.
"""

import numpy

from refconv.train import build_model, load_dataset, serial_losses


def serial_check(cfg, losses):
    """The largest relative difference between ``losses``, the first steps of a run of ``cfg``,
    and the same steps of the one-rank twin (``check_serial``'s figure)."""
    x, y, _, _, num_classes = load_dataset(cfg, numpy.dtype(cfg.dtype))
    twin = build_model(cfg, serial=True, in_channels=x.shape[1], num_classes=num_classes)
    serial = serial_losses(cfg, twin, len(losses), x, y)
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, serial))
