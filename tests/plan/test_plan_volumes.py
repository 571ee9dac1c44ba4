"""The planner on a model of volumes (``dims: 3``): grids of five axes, a 3-D conv's compute by
hand, the brute-force optimum, the conv table's 3-D keys, and the commands.  The calls it prices
are checked against the 3-D layers' ``records()`` and the measurement in tests/on_ranks/test_plan.py."""

import itertools
import math

import numpy
import pytest
from mpi4py import MPI
from test_plan import RESIDUAL_FIRST, SMALL, brute_force, machine_doc

from refconv import ProcessGrid, cost_model
from refconv.backend import get_backend
from refconv.layers import DistConv3d
from refconv.model_spec import PRESETS, load_spec
from refconv.plan import calibrate, measure
from refconv.pricing import choose_for_layer, graph, machine, perf, search
from refconv.testing.commands import run_command

# test_plan's SMALL model (conv, batch norm, a residual block, pooling, the head) on volumes
VOLUMES = dict(SMALL, name="volumes", dims=3, loss="mse")


def test_grids_of_volumes_are_every_ordered_factorisation_into_five_axes():
    for P in (1, 4, 12):
        brute = [g for g in itertools.product(range(1, P + 1), repeat=5) if math.prod(g) == P]
        assert sorted(perf.grids(P, 5)) == sorted(brute)
    assert len(perf.grids(64, 5)) == 210 and len(perf.grids(64)) == 84  # C(6 + 4, 4) and C(6 + 3, 3)


@pytest.mark.parametrize("spec, shape", [(VOLUMES, (4, 2, 8, 8, 8)),
                                         (dict(RESIDUAL_FIRST, dims=3, loss="mse"), (1, 2, 8, 8, 8))])
def test_planner_finds_the_brute_force_optimum_of_a_model_of_volumes(spec, shape):
    planner, plan = search.plan_model(spec, shape, 2, machine.from_dict(machine_doc()))
    assert all(len(r.cost.grid) == 5 for r in plan.rows)
    best, count = brute_force(planner)
    assert count > 50
    assert plan.seconds == pytest.approx(best, rel=1e-12)


def test_a_3d_conv_is_priced_as_its_gemm_by_hand():
    """Only the convolutions cost (1e10 FLOP/s, no t0) and no call does: a 3x3x3 conv of 4 -> 8
    channels on (2, 4, 8, 8, 8), padding 1, split 2 ways along depth, is on rank 0 the GEMM
    F x (C Kd Kh Kw) x (n d' h' w') = 8 x (4 * 27) x (2 * 4 * 8 * 8) three times (forward,
    backward-data, backward-filter), at 2 FLOPs per multiply-add."""
    doc = machine_doc()
    for scope in ("intra", "inter"):
        doc["collectives"][scope] = {k: {"alpha": 0.0, "beta": 0.0} for k in machine.KINDS}
    doc["compute"] = {op: ({c: {"t0": 0.0, "rate": 1e10} for c in machine.CONV_CLASSES} if op.startswith("conv")
                           else {"t0": 0.0, "rate": 1e30}) for op in machine.COMPUTE}
    layer = graph.Layer.of({"type": "conv", "out": 8, "kernel": 3, "padding": 1}, (2, 4, 8, 8, 8))
    cost = perf.layer_cost(layer, (1, 1, 2, 1, 1), machine.from_dict(doc), "stationary-x")
    gemm = 2 * 8 * (4 * 27) * (2 * 4 * 8 * 8)
    assert cost.fwd == pytest.approx(gemm / 1e10) and cost.bwd == pytest.approx(2 * gemm / 1e10)
    assert set(cost.comm) == {"halo"} and cost.comm["halo"] < 1e-20 and cost.grad == 0.0  # priced, here free


def test_a_machines_kxkxk_class_prices_the_3d_kernels_and_only_them():
    """The optional ``kxkxk`` class (refconv calibrate fits it on 3x3x3 volumes) prices a 3x3x3
    conv's three passes; a 1x1x1 kernel stays ``1x1``'s and a 2-D 3x3 ``kxk``'s, and a file
    without the class (the datasheet ones) prices the 3x3x3 passes by ``kxk``.  Rates by hand:
    1x1 at 1e10, kxk at 2e10, kxkxk at 5e9 FLOP/s, no t0, nothing else costs."""
    doc = machine_doc()
    for scope in ("intra", "inter"):
        doc["collectives"][scope] = {k: {"alpha": 0.0, "beta": 0.0} for k in machine.KINDS}
    doc["compute"] = {op: ({"1x1": {"t0": 0.0, "rate": 1e10}, "kxk": {"t0": 0.0, "rate": 2e10}}
                           if op.startswith("conv") else {"t0": 0.0, "rate": 1e30}) for op in machine.COMPUTE}
    plain = machine.from_dict(doc)
    for op in machine.CONV_OPS:
        doc["compute"][op][machine.VOLUME_CLASS] = {"t0": 0.0, "rate": 5e9}
    volumes = machine.from_dict(doc)

    def passes(m, kernel, shape):
        cost = perf.layer_cost(graph.Layer.of({"type": "conv", "out": 8, "kernel": kernel, "padding": kernel // 2},
                                              shape), (1,) * len(shape), m, "stationary-x")
        return cost.fwd + cost.bwd

    gemm = 2 * 8 * 4 * 1024  # 2 F C (n d h w) FLOPs per tap of one pass: 1024 = 2 x 8^3 voxels = 1 x 32^2 pixels
    assert passes(volumes, 3, (2, 4, 8, 8, 8)) == pytest.approx(3 * 27 * gemm / 5e9)
    assert passes(plain, 3, (2, 4, 8, 8, 8)) == pytest.approx(3 * 27 * gemm / 2e10)
    assert passes(volumes, 1, (2, 4, 8, 8, 8)) == pytest.approx(3 * gemm / 1e10)
    assert passes(volumes, 3, (1, 4, 32, 32)) == passes(plain, 3, (1, 4, 32, 32)) == pytest.approx(
        3 * 9 * gemm / 2e10)
    doc["compute"]["conv_fwd"]["kxkxkxk"] = {"t0": 0.0, "rate": 1e9}
    with pytest.raises(machine.MachineError, match=r"compute.conv_fwd: expected classes \('1x1', 'kxk'\) "
                                                   r"\(and optionally 'kxkxk'\)"):
        machine.from_dict(doc)


def test_global_average_pooling_is_planned_on_no_more_spatial_ranks_than_its_input_has_rows():
    """cosmoflow's gap on 8^3 input volumes sees 2 x 2 x 2: a grid splitting width 4 ways would leave
    ranks an empty block, and the shuffle onto it refuses to bind (a plan priced from a conv table
    chose one at 4 ranks: ``python -m refconv.plan.validate --model cosmoflow --table``)."""
    gap = graph.Layer.of({"type": "gap"}, (4, 64, 2, 2, 2))
    assert [g for g in perf.grids(4, 5) if perf.feasible(gap, g)] == [
        g for g in perf.grids(4, 5) if max(g[2:]) <= 2]
    assert not perf.feasible(gap, (1, 1, 1, 1, 4)) and perf.feasible(gap, (1, 1, 2, 1, 2))


def test_a_tall_volume_is_split_along_depth_with_channel_algorithms_per_layer():
    """cosmoflow on one 128 x 16 x 16 volume over 8 ranks of the V100 machine: the first conv
    splits depth (its 16 x 16 planes are too small to split more) with channels, and the plan
    picks a channel algorithm per conv (Y, then W with p_f = 4)."""
    _, plan = search.plan_model(load_spec("cosmoflow"), (1, 4, 128, 16, 16), 8, machine.load("v100-edr"))
    convs = [r.cost for r in plan.rows if r.kind == "conv"]
    assert convs[0].grid[2] > 1 and convs[0].comm["halo"] > 0
    assert [(c.algorithm, c.filter_groups) for c in convs] == [("stationary-y", None), ("stationary-w", 4),
                                                               ("stationary-w", 4)]
    written = search.to_spec(load_spec("cosmoflow"), plan)
    assert written["dims"] == 3 and written["layers"][0]["grid"] == search.grid_dict(convs[0].grid)
    assert "depth" in written["layers"][0]["grid"]


def test_table_key_of_a_3d_conv_is_the_window_distconv3d_convolves():
    shape, spec = (2, 3, 6, 5, 7), {"out": 4, "kernel": [3, 1, 3], "stride": [1, 2, 1], "padding": [1, 0, 2],
                                    "dilation": [2, 1, 1]}
    layer = DistConv3d(3, 4, spec["kernel"], stride=spec["stride"], padding=spec["padding"],
                       dilation=spec["dilation"], grid=ProcessGrid(MPI.COMM_SELF), backend="numpy",
                       input_shape=shape)
    layer.forward(numpy.zeros(shape, numpy.float32))
    planned = graph.Layer.of({"type": "conv", **spec}, shape)
    grid = (1,) * 5
    key = perf.local_conv_shape(planned, grid, *perf.local_weight_shape(planned, grid, None, None))
    assert (key.n, key.C, *key.window) == layer._algo.x_win.shape
    assert (key.F, key.C // key.groups, *key.kernel) == layer.weight.shape
    assert len(key.as_list()) == 16 and machine.ConvShape.of_list(key.as_list()) == key


def test_calibrate_times_the_3d_shapes_of_a_model_of_volumes_and_the_planner_prices_them():
    """The local shapes `refconv calibrate --model` would time for a model of volumes are 3-D
    (16 ints), the table times them with the conv3d passes, and the planner prices each
    tabled shape from the table."""
    shapes = calibrate.model_shapes(VOLUMES, (2, 2, 4, 4, 4), 2, machine.load("v100-edr"))
    assert shapes and all(s.dims == 3 for s in shapes)
    entries = measure.measure_conv_table(MPI.COMM_SELF, get_backend("numpy"), shapes[:2], 1)
    assert [len(e["shape"]) for e in entries] == [16, 16]
    doc = machine_doc()
    doc["compute"]["conv_table"] = [{"shape": e["shape"], "conv_fwd": 7.0, "conv_bwd_data": 1.0,
                                     "conv_bwd_filter": 1.0} for e in entries]
    tabled = machine.from_dict(doc)
    layer = graph.Layer.of({"type": "conv", "out": 4, "kernel": 3, "padding": 1}, (2, 2, 4, 4, 4))
    priced = [perf.layer_cost(layer, g, tabled, "stationary-x").fwd for g in perf.grids(2, 5)]
    assert sum(7.0 <= t < 7.01 for t in priced) >= 1  # rank 0's window of some grid was tabled


def test_the_command_plans_cosmoflow(capsys):
    status, out, err = run_command(capsys, "plan", "--model", "cosmoflow", "--ranks", "8", "--batch", "2",
                                   "--image-size", "32", "--machine", "v100-edr")
    assert status == 0, err
    assert "input (2, 4, 32, 32, 32), 8 ranks" in out and "predicted step:" in out
    strategies = [line.split()[2:4] for line in out.splitlines() if " conv " in line]
    assert len(strategies) == 3 and any(s[1] in ("x", "y") or s[1].startswith("w(") for s in strategies), out


def test_the_planner_takes_cosmoflow_at_the_papers_scale_and_refuses_a_search_estimated_too_long():
    """A plain chain of volumes costs O(grids) per stage: cosmoflow at 256-1024 ranks (495-1001 grids of five
    axes) is searched (issue 39); a deep residual model on as many grids, O(grids^3) per block, is refused."""
    spec = PRESETS["cosmoflow"]()
    for ranks in (256, 512, 1024):
        search.check_ranks(ranks, 5)
        planner = search.Planner(spec, (ranks, 4, 128, 128, 128), ranks, machine.load("v100-edr"))
        assert search.work_estimate(planner.elements, len(planner.grids)) < search.SEARCH_BUDGET_S
    conv = {"type": "conv", "out": 8, "kernel": 3, "padding": 1}
    deep = {"dims": 3, "in_channels": 8, "layers": [{"type": "residual", "layers": [conv] * 3}] * 40
            + [{"type": "gap"}, {"type": "linear", "out": 2}]}
    with pytest.raises(search.TooLarge, match=r"--ranks: 1024 ranks factor into 1001 grids \(sample x channel x "
                                               r"depth x height x width\), a search estimated at \d+ s, more than "
                                               r"the 300 s the planner allows; choose a rank count with fewer factors"):
        search.Planner(deep, (1024, 8, 64, 64, 64), 1024, machine.load("v100-edr"))


def test_cost_model_prices_a_3d_layer_and_refuses_depth_on_images(capsys):
    assert cost_model.main(["--shape", "4", "16", "8", "8", "8", "--F", "16", "--grid", "channel=4,depth=2"]) == 0
    out = capsys.readouterr().out
    chosen, p_f, table = choose_for_layer((4, 16, 8, 8, 8), 16, (3, 3, 3), grid_shape=(1, 4, 2, 1, 1), padding=1,
                                          machine="v100-edr")
    assert "on grid (1, 4, 2, 1, 1)" in out and len(out.splitlines()) == 1 + len(table)
    chosen_line, = [line for line in out.splitlines() if line.endswith("<- chosen")]
    assert chosen_line.split()[0] == chosen and (p_f is None or f"p_f={p_f}" in chosen_line), out
    with pytest.raises(SystemExit) as exit_:
        cost_model.main(["--grid", "depth=2"])
    assert exit_.value.code == 2 and "depth needs --shape N C D H W" in capsys.readouterr().err
