"""A 3-D CNN on volume grids (``sample x channel x depth x height x width``).

The layers against the serial reference: BatchNorm3d, MaxPool3d, AvgPool3d, and
GlobalAvgPool3d into Linear into MeanSquaredError; each one's communication against its
``records()``.  Drawn grids of 1 to 8 ranks (every factorization over the five axes) and
drawn volumes that split over them, unevenly too; at 8 ranks the grids CosmoFlow runs on
(2x2x2 spatial, 2 samples x 2 channels x 2 depth).

The cosmoflow preset under ``train``: depth at 2 ranks, channel x depth at 4, channel x depth x
height at 8; its losses agree with the one-rank replay, a run checkpointed
mid-way and resumed continues bit for bit, and a step makes the calls the model's
``records()`` list (what tests/on_ranks/test_records.py checks of the 2-D presets).  A model that
opens with a residual block trains the same ways at 4 ranks, and as ``refconv plan`` plans it.

On simulated ranks (refconv.simulated): Hypothesis draws in the test's thread, every rank runs
the example, and the checks are collective.  The one-rank replays are made in the test's
thread (tests/on_ranks/serial_replay.py says why).
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from refconv import datasets, simulated
from refconv import reference as ref
from refconv.grid import ProcessGrid, axes_of
from refconv.layers import AvgPool3d, BatchNorm3d, GlobalAvgPool3d, Linear, MaxPool3d, MeanSquaredError
from refconv.optim import SGD
from refconv.pricing import machine, search
from refconv.sharding import allgather
from refconv.testing.asserts import assert_all_ranks, collective_assert_close
from refconv.testing.check import check_batch_norm, check_records
from refconv.testing.ranks import on_ranks
from refconv.testing.strategies import grid_shapes
from refconv.train import build_model, step, train
from refconv.train_config import TrainConfig
from refconv.train_config import OptionError

from .serial_replay import serial_check

GRIDS_OF_8 = ((1, 1, 2, 2, 2), (2, 2, 2, 1, 1))  # (P_N, P_c, P_D, P_H, P_W); training runs channel x depth x height


def _grid(comm, shape):
    return ProcessGrid(comm, **dict(zip(axes_of(5), shape)))


def _gathered(local, dist, grid):
    return allgather(numpy.ascontiguousarray(local), dist, grid)


@st.composite
def volumes(draw, shape, need=(1, 1, 1)):
    """``(N, C, D, H, W)`` that splits over the grid ``shape``, each spatial size at least ``need``."""
    P_N, P_c, *spatial = shape
    sizes = [draw(st.integers(max(P, n), max(P, n) + 2)) for P, n in zip(spatial, need)]
    return (draw(st.integers(P_N, P_N + 1)), draw(st.integers(P_c, P_c + 2)), *sizes)


@st.composite
def pool_cases(draw, shape):
    """``(kernel, stride, padding, x_shape)``: the output has a block on every spatial rank."""
    k, s = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    p = draw(st.integers(0, k // 2))
    need = [max(1, (P - 1) * s + k - 2 * p) for P in shape[2:]]  # D >= (P_D - 1) s + k - 2p, likewise H, W
    return k, s, p, draw(volumes(shape, need))


def check_batchnorm(comm, grid, x_shape):
    rng = numpy.random.default_rng(list(x_shape))
    x, dy = rng.standard_normal(x_shape) * 3 + 1, rng.standard_normal(x_shape)
    gamma, beta = rng.standard_normal(x_shape[1]), rng.standard_normal(x_shape[1])
    layer = BatchNorm3d(x_shape[1], grid=grid, backend="numpy", dtype=numpy.float64).bind(x_shape)
    check_batch_norm(comm, layer, x, dy, gamma, beta)


def check_pool(comm, grid, cls, k, s, p, x_shape):
    rng = numpy.random.default_rng(list(x_shape) + [k, s, p])
    x = rng.standard_normal(x_shape)
    layer = cls(k, s, p, grid=grid, backend="numpy", dtype=numpy.float64).bind(x_shape)
    x_loc = layer.input_distribution.extract(x, grid.rank)
    y_loc = layer.forward(x_loc)
    if cls is MaxPool3d:
        y, argmax = ref.max_pool3d_forward(x, k, s, p)
        dy = rng.standard_normal(y.shape)
        dx = ref.max_pool3d_backward(dy, argmax, x_shape, k, s, p)
    else:
        y = ref.avg_pool3d_forward(x, k, s, p)
        dy = rng.standard_normal(y.shape)
        dx = ref.avg_pool3d_backward(dy, x_shape, k, s, p)
    dy_loc = layer.output_distribution.extract(dy, grid.rank)
    dx_loc = layer.backward(dy_loc)
    collective_assert_close(comm, _gathered(y_loc, layer.output_distribution, grid), y, name=f"{cls.__name__} y")
    collective_assert_close(comm, _gathered(dx_loc, layer.input_distribution, grid), dx, name=f"{cls.__name__} dx")
    check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), layer.records(), repr(layer))


def check_regression_head(comm, grid, x_shape, K=4):
    """GlobalAvgPool3d -> Linear -> MeanSquaredError, forward and backward, against the reference."""
    N, C = x_shape[:2]
    rng = numpy.random.default_rng(list(x_shape) + [K])
    x, targets = rng.standard_normal(x_shape), rng.standard_normal((N, K))
    gap = GlobalAvgPool3d(grid=grid, backend="numpy", dtype=numpy.float64).bind(x_shape)
    lin = Linear(C, K, grid=grid, backend="numpy", dtype=numpy.float64, seed=3).bind(gap.output_shape)
    head = MeanSquaredError(grid=grid, backend="numpy")
    (n0, n1), = lin.output_distribution.pieces(grid.rank, 0)
    x_loc = gap.input_distribution.extract(x, grid.rank)

    def step():
        pred = lin.forward(gap.forward(x_loc))
        return pred, head.forward(pred, targets[n0:n1], N), gap.backward(lin.backward(head.backward()))

    pred, loss, dx_loc = step()
    f = ref.global_avg_pool3d_forward(x)
    z = ref.linear_forward(f, lin.weight, lin.bias)
    loss_ref, diff = ref.mse_forward(z, targets)
    df, dw, db = ref.linear_backward(ref.mse_backward(diff), f, lin.weight)
    dx = ref.global_avg_pool3d_backward(df, x_shape)
    collective_assert_close(comm, numpy.array(loss), numpy.array(loss_ref), reduction_length=N * K, name="loss")
    collective_assert_close(comm, pred, z[n0:n1], reduction_length=C, name="pred")
    collective_assert_close(comm, lin.weight_grad, dw, reduction_length=N, name="dW")
    collective_assert_close(comm, _gathered(dx_loc, gap.input_distribution, grid), dx, reduction_length=K, name="dx")
    itemsize = numpy.dtype(numpy.float64).itemsize
    check_records(comm, step, gap.records() + lin.records() + head.records(itemsize), "gap3d, linear, mse",
                  ordered=False)


def _volume_layers(comm, shape, bn_shape, pool, head_shape):
    grid = _grid(comm, shape)
    check_batchnorm(comm, grid, bn_shape)
    check_pool(comm, grid, *pool)
    check_regression_head(comm, grid, head_shape)
    grid.free()


@on_ranks(1, 2, 3, 4, 5, 6, 7, 8)
@settings(max_examples=25)
@given(st.data())
def test_volume_layers_match_reference(ranks, data):
    shape = data.draw(grid_shapes(ranks, axes=axes_of(5)))
    bn_shape = data.draw(volumes(shape))
    k, s, p, x_shape = data.draw(pool_cases(shape))
    pool = (data.draw(st.sampled_from((MaxPool3d, AvgPool3d))), k, s, p, x_shape)
    simulated.run(_volume_layers, ranks, args=(shape, bn_shape, pool, data.draw(volumes(shape))))


@on_ranks(8)
def test_volume_layers_on_grids_of_8(comm):
    for shape in GRIDS_OF_8:
        grid = _grid(comm, shape)
        x_shape = (shape[0] + 1, 2 * shape[1] + 1) + tuple(2 * P + 1 for P in shape[2:])  # uneven blocks
        check_batchnorm(comm, grid, x_shape)
        check_pool(comm, grid, MaxPool3d, 2, 2, 0, x_shape[:2] + (4, 4, 4))
        check_pool(comm, grid, AvgPool3d, 3, 1, 1, x_shape)
        check_regression_head(comm, grid, x_shape)
        grid.free()


# -- the cosmoflow preset, trained ---------------------------------------------------------------------
TRAIN_GRIDS = {2: {"depth": 2}, 4: {"channel": 2, "depth": 2}, 8: {"channel": 2, "depth": 2, "height": 2}}


def quiet(*args):
    pass


def _cosmoflow(comm, cfg, folder):
    """The whole run, then the same run checkpointed after 3 steps and resumed; returns the whole
    run's losses, for the one-rank replay."""
    whole = train(TrainConfig(**cfg), comm=comm, log=quiet)  # 2 steps per epoch, 4 in all
    first = train(TrainConfig(**cfg, max_steps=3, checkpoint_dir=folder, checkpoint_every=3), comm=comm, log=quiet)
    rest = train(TrainConfig(**cfg, checkpoint_dir=folder, resume=True), comm=comm, log=quiet)
    assert_all_ranks(comm, first["losses"] == whole["losses"][:3] and rest["losses"] == whole["losses"][3:],
                     f"{cfg['grid']}: resumed {first['losses']} + {rest['losses']} != {whole['losses']}")
    assert_all_ranks(comm, rest["mse"] == whole["mse"], f"test mse {rest['mse']} != {whole['mse']}")
    x, y = datasets.synthetic_volumes(4, 4, 8, dtype=numpy.float64)
    x = numpy.asarray(x)
    with build_model(TrainConfig(**cfg), comm=comm) as model:   # train closed its own: a step needs a new one
        model.bind(x.shape)
        optimizer = SGD(model, 0.01)
        check_records(comm, lambda: step(model, optimizer, x, y), model.records(), f"cosmoflow on {cfg['grid']}",
                      ordered=False)
    return whole["losses"]


@on_ranks(*TRAIN_GRIDS)
def test_cosmoflow_trains_checks_serial_and_resumes_exactly(ranks, tmp_path):
    cfg = dict(model="cosmoflow", synthetic=True, synthetic_samples=8, image_size=8, batch_size=4, epochs=2,
               lr=0.01, dtype="float64", backend="numpy", progress=False, seed=3, grid=TRAIN_GRIDS[ranks])
    losses = simulated.run(_cosmoflow, ranks, args=(cfg, str(tmp_path)))
    worst = serial_check(TrainConfig(**cfg), losses[0][:2])
    assert worst <= 1e-6, f"{cfg['grid']}: the one-rank replay of 2 steps differs by {worst:.2e}"


# -- a residual block as the first layer ------------------------------------------------------------------
def residual_first(shortcut=None):
    """A model of volumes that opens with a residual block (docs/volumes.md): the loader reads each
    rank's block on the block's input grid, and the body's first conv and the shortcut start there."""
    block = {"type": "residual", "layers": [{"type": "conv", "out": 4 if shortcut else 2, "kernel": 3, "padding": 1},
                                            {"type": "relu"}]}
    if shortcut:
        block["shortcut"] = shortcut
    return {"name": "residual-first", "dims": 3, "loss": "mse", "in_channels": 2,
            "layers": [block, {"type": "gap"}, {"type": "linear", "out": datasets.VOLUME_TARGETS}]}


PROJECTION = [{"type": "conv", "out": 4, "kernel": 1}, {"type": "batchnorm"}]


def _residual_runs(comm, cfgs, folder):
    """Each of ``cfgs`` trained (the identity, the projection, the planned model); the projection
    run again, checkpointed after 3 steps and resumed; and a batch that cannot fill the input's
    grid refused.  Returns each run's losses, for the one-rank replays."""
    wholes = [train(TrainConfig(**cfg), comm=comm, log=quiet)["losses"] for cfg in cfgs]
    cfg = cfgs[1]
    first = train(TrainConfig(**cfg, max_steps=3, checkpoint_dir=folder, checkpoint_every=3), comm=comm, log=quiet)
    rest = train(TrainConfig(**cfg, checkpoint_dir=folder, resume=True), comm=comm, log=quiet)
    assert_all_ranks(comm, first["losses"] + rest["losses"] == wholes[1],
                     f"{cfg['grid']}: resumed {first['losses']} + {rest['losses']} != {wholes[1]}")
    # the input's grid splits samples, its body's conv does not: the batch must fill the input's grid
    spec = dict(residual_first(), defaults={"grid": {"sample": comm.size}})
    spec["layers"][0]["layers"][0]["grid"] = spec["layers"][-1]["grid"] = {"depth": comm.size}
    with pytest.raises(OptionError, match=f"2 samples cannot be split over the sample={comm.size} ranks of "
                                          f"the grid the input lies on"):
        train(TrainConfig(**dict(cfgs[2], model=spec, batch_size=2, max_steps=1, image_size=8)), comm=comm, log=quiet)
    return wholes


@on_ranks(4)
def test_a_residual_block_first_trains_as_the_serial_model_and_resumes_exactly(ranks, tmp_path):
    """Identity shortcut on a spatial split (depth x height), projection shortcut on a channel split
    (channel x width), and the projection model as planned for a batch of 1 (``refconv plan``'s
    file, which puts the block's input on the planned grid, one of no sample split): the losses
    agree with the one-rank replay, and the projection run, checkpointed after 3 steps and
    resumed, continues bit for bit."""
    cfgs = [dict(model=spec, synthetic=True, synthetic_samples=8, image_size=6, batch_size=4, epochs=2, lr=0.05,
                 dtype="float64", backend="numpy", progress=False, seed=1, grid=grid)
            for spec, grid in ((residual_first(), {"depth": 2, "height": 2}),
                               (residual_first(PROJECTION), {"channel": 2, "width": 2}))]
    # planned for a batch of 1 (no sample split): the written file puts the input on the planned grid
    _, plan = search.plan_model(cfgs[1]["model"], (1, 2, 6, 6, 6), ranks, machine.load("dev-cpu"))
    cfgs.append(dict(cfgs[1], model=search.to_spec(cfgs[1]["model"], plan), batch_size=1, epochs=1, max_steps=2,
                     grid=None))
    losses = simulated.run(_residual_runs, ranks, args=(cfgs, str(tmp_path)))[0]
    for cfg, run, steps in zip(cfgs, losses, (4, 4, 2)):
        worst = serial_check(TrainConfig(**cfg), run[:steps])
        assert len(run) == steps and worst <= 1e-6, \
            f"{cfg['grid'] or plan.input_grid}: {len(run)} steps, the one-rank replay differs by {worst:.2e}"
