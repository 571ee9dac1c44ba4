"""The planner on simulated ranks (refconv.simulated): a planned model file runs unchanged and
trains as the serial model does; the local shapes, calls and halo shares the planner prices
are the layers' own; the validation's layer and model parts measure every strategy.

The planner's output for a world size (for every shipped machine file, so the plans differ
and mix grids and algorithms) is trained by ``refconv.train`` on simulated ranks, and its
first steps replayed on one rank in the test's thread (tests/on_ranks/serial_replay.py says
why there): the losses must agree (float64, relative 1e-6).  Calibration's retries of a collective
whose time did not grow run here with a stand-in timer.  tests/mpiexec/launched/test_plan.py keeps what
needs MPI.COMM_WORLD or COMM_SELF: ``--check-serial`` itself, ``refconv calibrate`` and the
validation's command line.
"""

import math
import warnings

import numpy
import pytest

from refconv import Model, ProcessGrid, simulated
from refconv.grid import axes_of
from refconv.layers import BatchNorm3d, DistConv2d, DistConv3d, GlobalAvgPool3d, MaxPool3d
from refconv.model_spec import load_spec
from refconv.plan import fits, measure, validate
from refconv.pricing import choose_for_layer, graph, machine, perf, search
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.check import check_records
from refconv.testing.ranks import on_ranks
from refconv.train import train
from refconv.train_config import TrainConfig

from .serial_replay import serial_check

STEPS, BATCH = 3, 8
SPEC = {
    "in_channels": 1,
    "layers": [
        {"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "residual",
         "layers": [{"type": "conv", "out": 8, "kernel": 3, "padding": 1, "bias": False}, {"type": "batchnorm"}],
         "shortcut": [{"type": "conv", "out": 8, "kernel": 1, "bias": False}]},
        {"type": "relu"},
        {"type": "gap"}, {"type": "linear", "out": 10},
    ],
}


def _losses(comm, cfg):
    return train(cfg, comm=comm, log=lambda *a, **k: None)["losses"]


@on_ranks(2, 3, 4, 6, 8)
def test_planned_models_train_as_the_serial_model(ranks):
    grids = set()
    for name in machine.builtin_names():
        _, plan = search.plan_model(SPEC, (BATCH, 1, 16, 16), ranks, machine.load(name))
        grids |= {r.cost.grid for r in plan.rows}
        cfg = TrainConfig(model=search.to_spec(SPEC, plan), batch_size=BATCH, epochs=1, max_steps=STEPS,
                          dtype="float64", backend="numpy", progress=False)
        losses = simulated.run(_losses, ranks, args=(cfg,))
        assert all(run == losses[0] for run in losses) and len(losses[0]) == STEPS, f"{name}: {losses}"
        worst = serial_check(cfg, losses[0])
        assert worst <= 1e-6, f"{name}: the one-rank replay differs by {worst:.2e}"
    assert len(grids) > 1, f"every plan used one grid {grids}: the test checks no shuffle"


@on_ranks(1, 2, 3, 4)
def test_table_key_is_each_strategys_window_and_weight_block(comm):
    """On split grids (samples, rows, Stationary-X and -Y, even and uneven blocks; at 4 ranks also Stationary-W and
    sample 2 x X), rank 0's convolved window and weight
    block are the ConvShape the planner prices (tests/plan/test_plan.py checks one rank)."""
    N, C, F, H, K = 4, 4, 6, 8, 3
    planned = validate.conv_layer(N, C, F, H, K)
    for label, grid_shape, algorithm, p_f in validate.strategies(comm.size):
        grid = ProcessGrid(comm, **dict(zip(perf.AXES, grid_shape)))
        layer = DistConv2d(C, F, K, padding=1, grid=grid, algorithm=algorithm, filter_groups=p_f, backend="numpy",
                           input_shape=(N, C, H, H))
        layer.forward(numpy.zeros(layer.input_distribution.local_shape(grid.rank), numpy.float32))
        key = perf.local_conv_shape(planned, grid_shape, *perf.local_weight_shape(planned, grid_shape, algorithm, p_f))
        got = layer._algo.x_win.shape + layer.weight.shape
        grid.free()
        if comm.rank == 0:
            assert got == (key.n, key.C, *key.window, key.F, key.C, *key.kernel), (label, got, key)


@on_ranks(2)
def test_validation_of_3d_layers_measures_and_prices_every_strategy(comm):
    """The per-layer part for a model of volumes (``--model cosmoflow``): each strategy of two tiny
    DistConv3d layers at 1 and 2 ranks (a depth split among them), on grids of five axes, measured
    and priced, and the report prints a row for each and the summary (no timing is compared)."""
    layers = {"tiny 3x3x3": (2, 2, 4, 6, 3), "tiny 1x1x1": (2, 4, 4, 4, 1)}
    rows = validate.layer_rows(comm, machine.load("dev-cpu"), 1, layers, dims=3)
    expected = [(name, P, label) for P in (1, 2) for name in layers for label, *_ in validate.strategies(P, 3)]
    lines = []
    validate.report_layers(lines.append, {"class fit": rows})
    table = [line.split()[:3] for line in lines if line.startswith("tiny")]
    assert_all_ranks(comm, [(r.layer, r.P, r.label) for r in rows] == expected
                     and {r.label for r in rows} == {"serial", "sample", "depth", "height", "X", "Y"}
                     and all(len(r.cost.grid) == 5 and r.cost.fwd > 0 and r.cost.bwd > 0 and r.predicted > 0
                             and len(r.measured.values) == 1 and r.measured.min > 0 for r in rows)
                     and all((r.cost.comm.get("halo", 0) > 0) == (r.label in ("depth", "height")) for r in rows
                             if r.layer == "tiny 3x3x3")
                     and table == [[r.layer.split()[0], r.layer.split()[1], str(r.P)] for r in rows]
                     and [(p.layer, p.P) for p in validate.picks(rows)] == [(name, 2) for name in layers]
                     and any(line.lstrip().startswith("pick rate, STRICT") for line in lines), f"{rows} {lines}")


@on_ranks(2)
def test_a_models_machine_reaches_its_auto_convs(comm):
    """``defaults.machine`` (``refconv train --machine``) is what the model's 'auto' convs on a
    channel split price with: their estimates are that machine's, and differ between machines."""
    spec = {"name": "one-conv", "in_channels": 4, "layers": [
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1, "grid": {"channel": 2}},
        {"type": "gap"}, {"type": "linear", "out": 2}]}
    shape = (2, 4, 6, 6)
    estimates = {}
    for name in ("v100-edr", "dev-cpu"):
        model = Model.from_spec(spec, comm=comm, backend="numpy",
                                defaults={"algorithm": "auto", "machine": name})
        model.bind(shape)
        [conv] = [layer for _, layer in model.named_layers() if isinstance(layer, DistConv2d)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a named machine: no fallback warning
            _, _, expected = choose_for_layer(shape, 8, (3, 3), grid_shape=(1, 2, 1, 1), padding=(1, 1),
                                              machine=name)
        estimates[name] = conv.cost_estimates
        model.close()
        assert_all_ranks(comm, conv.cost_estimates == expected, f"{name}: {conv.cost_estimates} != {expected}")
    assert_all_ranks(comm, estimates["v100-edr"] != estimates["dev-cpu"], f"{estimates}")


VOLUME = (2, 4, 8, 6, 6)  # (N, C, D, H, W)
VOLUME_CONVS = ({"out": 6, "kernel": 3, "padding": 1},
                {"out": 4, "kernel": [3, 1, 3], "stride": [2, 1, 1], "padding": [1, 0, 1], "bias": False},
                {"out": 4, "kernel": 3, "dilation": [2, 1, 1], "padding": "same"})
VOLUME_LAYERS = (("maxpool", {"kernel": 2}, lambda grid: MaxPool3d(2, grid=grid, backend="numpy")),
                 ("batchnorm", {}, lambda grid: BatchNorm3d(VOLUME[1], grid=grid, backend="numpy")),
                 ("gap", {}, lambda grid: GlobalAvgPool3d(grid=grid, backend="numpy")))


@on_ranks(2, 4)
def test_the_planner_prices_the_calls_3d_layers_make(comm):
    """On every grid of five axes (sample x channel x depth x height x width) that the planner keeps
    for these layers, and every algorithm it prices there: the calls it prices for a 3-D conv
    (halo faces, edges and corners; the X/Y/W collectives; the segmented allreduce), max pooling,
    batch norm and global average pooling are rank 0's ``records()`` of DistConv3d, MaxPool3d,
    BatchNorm3d and GlobalAvgPool3d, which every rank's measured calls then match.  The shares of
    rank 0's forward and backward-data that the model prices behind the halo calls
    (``perf.halo_shares``) are those of the layer's own Halo."""
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(VOLUME).astype(numpy.float32)
    priced, wrong = 0, []
    for grid_shape in perf.grids(comm.size, 5):
        grid = ProcessGrid(comm, **dict(zip(axes_of(5), grid_shape)))
        layers = []
        for spec in VOLUME_CONVS:
            planned = graph.Layer.of({"type": "conv", **spec}, VOLUME)
            if not perf.feasible(planned, grid_shape):
                continue
            choices = perf.candidates(grid_shape[1]) if grid_shape[1] > 1 else [("stationary-x", None)]
            for algorithm, p_f in choices:
                layer = DistConv3d(VOLUME[1], spec["out"], spec["kernel"], stride=spec.get("stride", 1),
                                   padding=spec.get("padding", 0), dilation=spec.get("dilation", 1),
                                   bias=spec.get("bias", True), grid=grid, algorithm=algorithm, filter_groups=p_f,
                                   backend="numpy", input_shape=VOLUME)
                layers.append((layer, perf.conv_calls(planned, grid_shape, algorithm, p_f)))
                if comm.rank == 0 and math.prod(grid_shape[2:]) > 1:  # what the model hides behind the halo
                    halo, geom = layer._algo.halo, perf.conv_geometry(planned)
                    kept = 0 if halo.kept_box is None else math.prod(halo.kept_box.shape)
                    shares = ((0.0, 0.0) if halo.interior is None else
                              (math.prod(halo.interior.shape) / math.prod(halo.out_shape),
                               kept / math.prod(halo.window_shape)))
                    priced_shares = perf.halo_shares(grid_shape[2:], geom.in_shape[2:], geom.out_shape[2:],
                                                     geom.kernel, geom.stride, geom.padding, geom.dilation,
                                                     geom.padding_mode)
                    if shares != priced_shares:
                        wrong.append(f"{grid_shape} {spec}: the layer's halo shares {shares}, priced {priced_shares}")
        for kind, spec, make in VOLUME_LAYERS:
            planned = graph.Layer.of({"type": kind, **spec}, VOLUME)
            if perf.feasible(planned, grid_shape):
                layers.append((make(grid).bind(VOLUME), perf.layer_calls(planned, grid_shape)))
        for layer, calls in layers:
            assert_all_ranks(comm, comm.rank != 0 or calls == layer.records(),
                             f"{grid_shape} {layer!r}: the planner prices {calls}, rank 0 records {layer.records()}")
            x_loc = layer.input_distribution.extract(x, grid.rank)
            y_loc = layer.forward(x_loc)
            check_records(comm, lambda: (layer.forward(x_loc), layer.backward(numpy.ones_like(y_loc))),
                          layer.records(), f"{grid_shape} {layer!r}")
            priced += comm.rank == 0 and bool(calls)
        grid.free()
    assert_all_ranks(comm, comm.rank != 0 or (priced >= {2: 15, 4: 40}[comm.size] and not wrong),
                     f"{priced} layers with calls; {wrong}")


@on_ranks(2)
def test_validation_times_the_plan_of_a_model_of_volumes(comm):
    """``python -m refconv.plan.validate --model cosmoflow``'s model part: the plan of 8x8x8 volumes
    on grids of five axes, and its training step timed against sample parallelism's."""
    predicted, measured = validate.model_rows(comm, machine.load("dev-cpu"), 1, spec=load_spec("cosmoflow"))
    plan, sample = predicted["planned"]
    assert_all_ranks(comm, all(len(r.cost.grid) == 5 for r in plan.rows) and sample is not None
                     and plan.seconds <= sample.seconds and "sample" in measured
                     and all(span.min > 0 for span in measured.values()), f"{predicted} {measured}")


QUICK_SIZES = (2**10, 2**14, 2**18)  # refconv calibrate --quick's first sweep of buffer sizes


@pytest.mark.parametrize("grows", [False, True], ids=["never grows", "grows when measured again"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_calibrate_measures_a_collective_again_and_never_prices_it_free(ranks, grows, monkeypatch):
    """measure.measure_collectives on simulated ranks with a stand-in timer: a time that never
    grows with the buffer leaves every (kind, q) unmeasured and named, with the sizes tried
    (refconv calibrate then writes no file); one that grows from the second sweep on (4x the
    buffers) is fitted there, no beta at the floor of a free rate."""

    def time_ranks(comm, contenders, repeats, *args, **kwargs):
        larger = any(m not in QUICK_SIZES for _, _, m in contenders)
        return {(kind, q, m): [1e-4 + 1e-9 * m if grows and larger else 1e-3] * repeats
                for kind, q, m in contenders}

    monkeypatch.setattr(measure, "time_ranks", time_ranks)
    results = simulated.run(lambda comm: measure.measure_collectives(comm, True), ranks)
    assert all(r == results[0] for r in results), "the ranks decided apart"
    tables, notes, failed = results[0]
    qs = [2, 4][:ranks // 2]
    if not grows:
        assert tables == {kind: {} for kind in machine.KINDS} and notes == []
        assert failed == [(f"{kind} q={q}", "buffers of 16 KiB to 4 MiB") for q in qs for kind in machine.KINDS]
        return
    assert failed == [] and all(list(tables[kind]) == qs and all(beta > fits.SLOPE_FLOOR
                                                                  for _, beta in tables[kind].values())
                                for kind in machine.KINDS), tables
    assert len(notes) == len(qs) * len(machine.KINDS) and all("measured again 1 time" in n for n in notes), notes
