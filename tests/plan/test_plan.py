"""The planner (refconv.plan): machine files, the shuffle model, and the dynamic programme
checked against a brute force over every assignment and a hand-worked optimum."""

import dataclasses
import itertools
import json
import math
import os
import shlex
import subprocess
import sys
import warnings

import numpy
import pytest
import yaml
from mpi4py import MPI

from refconv import ProcessGrid, cli, launch, recipe
from refconv.bench.timing import Span
from refconv.cost_model import Call
from refconv.distribution import Distribution
from refconv.layers import DistConv2d
from refconv.model_spec import PRESETS, load_spec
from refconv.plan import calibrate, fits, measure, report
from refconv.plan.fits import fit_line, fit_plane
from refconv.plan.validate import Row, picks, relative_to_sample
from refconv.pricing import choose_for_layer, graph, machine, perf, search, shuffle
from refconv.pricing.graph import Block, stages
from refconv.sharding import send_counts
from refconv.train.guards import GROWTH_FACTOR
from refconv.testing.mpirun import find_mpiexec

V100 = machine.load("v100-edr")


def machine_doc(**over):
    """A machine file as a dict: ring constants for every kind, rates for every kernel."""
    link = {"alpha": 2e-5, "beta": 1e-9}
    doc = {"name": "test", "ranks_per_node": 2,
           "collectives": {s: {k: dict(link) for k in machine.KINDS} for s in ("intra", "inter")},
           "compute": {op: ({c: {"t0": 1e-5, "rate": 1e10} for c in machine.CONV_CLASSES} if op.startswith("conv")
                            else {"t0": 1e-6, "rate": 1e9}) for op in machine.COMPUTE}}
    for key, value in over.items():
        doc[key] = value
    return doc


# -- machine files --------------------------------------------------------------------------------------
def test_builtin_machine_files_load_and_are_marked():
    for name in machine.builtin_names():
        m = machine.load(name)
        assert m.measured is False or isinstance(m.measured, str), name
    assert machine.load("v100-edr").measured is False and machine.load("v100-edr").ranks_per_node == 4


def test_ring_pricing_is_the_cost_models_alpha_beta():
    """alpha = 2e-5 s, beta = 1e-9 s/B, worked by hand: steps * alpha + ring factor * m * beta."""
    m = machine.from_dict(machine_doc())
    expected = {("allreduce", 4, 10_000): 6 * 2e-5 + 1.5 * 10_000e-9,            # 2 (q-1) steps, 2 (q-1)/q
                ("allgather", 3, 777): 2 * 2e-5 + 518e-9,                        # q-1 steps, (q-1)/q of 777 B
                ("reduce_scatter", 8, 1 << 20): 7 * 2e-5 + 917_504e-9}           # 7/8 of 1 MiB
    for (kind, q, nbytes), seconds in expected.items():
        assert m.comm_seconds(kind, q, nbytes) == pytest.approx(seconds, rel=1e-12)
        assert Call(kind, q, nbytes).seconds(2e-5, 1e-9) == pytest.approx(seconds, rel=1e-12)
    assert m.comm_seconds("halo", 4, 500, 2) == pytest.approx(2 * 2e-5 + 500e-9, rel=1e-12)  # per message, per byte
    assert m.comm_seconds("alltoallv", 4, 500, 3) == pytest.approx(3 * 2e-5 + 500e-9, rel=1e-12)
    assert m.comm_seconds("allreduce", 1, 10_000) == 0.0  # a one-rank communicator moves nothing


def test_the_overlap_a_machine_file_states_is_a_share():
    assert machine.from_dict(machine_doc()).overlap == 1.0  # unstated: all of each allreduce hidden
    assert machine.from_dict({**machine_doc(), "overlap": 0.25}).overlap == 0.25
    with pytest.raises(machine.MachineError, match="overlap: expected the share of an allreduce"):
        machine.from_dict({**machine_doc(), "overlap": 1.5})


def test_measured_table_reproduces_its_fit_and_scales_by_the_ring():
    doc = machine_doc()
    doc["collectives"]["intra"]["allgather"] = {"table": {2: [1e-5, 2e-10], 4: [3e-5, 3e-10]}}
    m = machine.from_dict(doc)
    assert m.comm_seconds("allgather", 4, 1000) == pytest.approx(3e-5 + 3e-10 * 1000)
    # q = 8 from q = 4: steps 7/3, factor (7/8)/(3/4)
    assert m.comm_seconds("allgather", 8, 1000) == pytest.approx(3e-5 * 7 / 3 + 3e-10 * (7 / 8) / (3 / 4) * 1000)


@pytest.mark.parametrize("text, needle", [
    ("name: x\n", "missing key 'ranks_per_node'"),
    ("name: [unclosed\n", "not valid YAML"),
    ("- 1\n- 2\n", "expected a mapping"),
])
def test_malformed_machine_files_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(machine.MachineError, match=needle.replace("[", r"\[")):
        machine.load(str(path))


def test_a_machine_file_is_parsed_once_until_it_changes(tmp_path):
    # Every 'auto' conv of a model loads the same file: one parse, one shared (frozen) Machine.
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps(machine_doc()))
    first = machine.load(str(path))
    assert machine.load(str(path)) is first
    doc = machine_doc()
    doc["name"] = "edited"
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1))  # a new modification time, even on a coarse clock
    assert machine.load(str(path)).name == "edited"


def test_bad_rate_is_named():
    doc = machine_doc()
    doc["compute"]["pool"] = {"t0": 0, "rate": -1}
    with pytest.raises(machine.MachineError, match=r"compute.pool.rate"):
        machine.from_dict(doc)


# -- grids and the shuffle -------------------------------------------------------------------------------
def test_grids_are_every_ordered_factorisation():
    for P in (1, 4, 12, 24):
        brute = [g for g in itertools.product(range(1, P + 1), repeat=4) if math.prod(g) == P]
        assert sorted(perf.grids(P)) == sorted(brute)


@pytest.mark.parametrize("shape, src, dst", [
    ((7, 9, 10, 11), (2, 2, 1, 1), (1, 1, 2, 2)),
    ((5, 6, 13, 8), (4, 1, 1, 1), (1, 2, 2, 1)),
    ((3, 12, 9, 9), (1, 3, 2, 1), (1, 2, 3, 1)),
    ((6, 4, 8, 8), (2, 1, 1, 3), (3, 2, 1, 1)),
])
def test_shuffle_matrix_prices_the_sharding_plan(shape, src, dst):
    """shuffle_matrix, which the planner prices shuffles with, on two machines with free packing:
    alpha 1 s per message (it counts rank 0's peers, there and back) and beta 1 s per byte (the
    larger of what rank 0 sends and receives, there and back), against refconv.sharding's plan."""
    a, b = Distribution.activations(src, shape), Distribution.activations(dst, shape)
    counts = send_counts(a, b, 0)
    sent, received = sum(counts[1:]) * 4, sum(send_counts(a, b, r)[0] for r in range(1, math.prod(src))) * 4
    peers = sum(1 for c in counts[1:] if c)
    for alpha, beta, expected in ((1.0, 0.0, 2 * peers), (0.0, 1.0, 2 * max(sent, received))):
        doc = machine_doc(ranks_per_node=64)
        doc["collectives"]["intra"]["alltoallv"] = {"alpha": alpha, "beta": beta}
        doc["compute"]["pack"] = {"t0": 0.0, "rate": 1e30}
        matrix = shuffle.shuffle_matrix(shape, [src, dst], machine.from_dict(doc))
        assert matrix[0, 1] == pytest.approx(expected, rel=1e-9) and matrix[0, 0] == matrix[1, 1] == 0


# -- the dynamic programme against brute force and by hand ---------------------------------------------
SMALL = {
    "in_channels": 2,
    "layers": [
        {"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "residual", "layers": [{"type": "conv", "out": 4, "kernel": 3, "padding": 1, "bias": False},
                                        {"type": "batchnorm"}]},
        {"type": "relu"},
        {"type": "maxpool", "kernel": 2},
        {"type": "gap"}, {"type": "linear", "out": 3},
    ],
}
PROJECTION = {
    "in_channels": 4,
    "layers": [
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1},
        {"type": "residual", "layers": [{"type": "conv", "out": 6, "kernel": 1}],
         "shortcut": [{"type": "conv", "out": 6, "kernel": 1}]},
        {"type": "gap"}, {"type": "linear", "out": 2},
    ],
}


# the input goes straight into a residual block: the plan chooses the grid it lies on
RESIDUAL_FIRST = {
    "in_channels": 2,
    "layers": [
        {"type": "residual", "layers": [{"type": "conv", "out": 2, "kernel": 3, "padding": 1}, {"type": "relu"}]},
        {"type": "gap"}, {"type": "linear", "out": 3},
    ],
}


def brute_force(planner):
    """The least evaluated step time over every assignment of every stage option (and of the
    input's grid, where the model opens with a block)."""
    all_stages = list(stages(planner.elements))
    options = [[c for opts in planner.options(s) for c in opts] for s in all_stages]
    inputs = planner.grids if isinstance(planner.elements[0], Block) else [None]
    best = math.inf
    for combo, grid in itertools.product(itertools.product(*options), inputs):
        plan = planner.evaluate({s.main.path: c for s, c in zip(all_stages, combo)}, grid)
        best = min(best, plan.seconds)
    return best, math.prod(len(o) for o in options) * len(inputs)


@pytest.mark.parametrize("spec, shape, P, doc", [
    (SMALL, (4, 2, 8, 8), 2, machine_doc()),
    (SMALL, (4, 2, 8, 8), 2, machine_doc(ranks_per_node=1)),
    (PROJECTION, (4, 4, 6, 6), 4, machine_doc()),
    (RESIDUAL_FIRST, (2, 2, 8, 8), 4, machine_doc()),
])
def test_planner_finds_the_brute_force_optimum(spec, shape, P, doc):
    m = machine.from_dict(doc)
    planner, plan = search.plan_model(spec, shape, P, m)
    best, count = brute_force(planner)
    assert count > 50  # a real search space, not a handful
    assert plan.seconds == pytest.approx(best, rel=1e-12)


def test_hand_worked_optimum_avoids_every_allreduce():
    """Only allreduce costs anything (1 s per call) and bandwidth layers are free: both convs and
    the head must go pure channel (no weight peers, no spatial peers, one sample group; the
    pool may go anywhere, all free), and the step is then the convolution and classifier
    FLOPs alone, worked out here by hand."""
    doc = machine_doc()
    free = {"alpha": 0.0, "beta": 0.0}
    for scope in ("intra", "inter"):
        doc["collectives"][scope] = {k: dict(free) for k in machine.KINDS}
        doc["collectives"][scope]["allreduce"] = {"alpha": 1.0, "beta": 0.0}
    doc["compute"] = {op: ({c: {"t0": 0.0, "rate": 1e9} for c in machine.CONV_CLASSES} if op.startswith("conv")
                           else {"t0": 0.0, "rate": 1e30}) for op in machine.COMPUTE}
    planner, plan = search.plan_model(SMALL, (4, 2, 8, 8), 2, machine.from_dict(doc))
    assert {r.cost.grid for r in plan.rows if r.kind in ("conv", "gap")} == {(1, 2, 1, 1)}
    assert plan.grad_seconds == 0 and plan.comm("allreduce") == 0
    # conv 2->4 and conv 4->4, 3x3 on 4 x 8 x 8 outputs: 2 flops per MAC, 3 passes, half each;
    # the classifier (4 samples x 3 x 4) replicated on both channel ranks.
    convs = 3 * 2 * 4 * 8 * 8 * 9 * (4 * 2 + 4 * 4) / 2
    linear = 3 * 2 * 4 * 3 * 4
    assert plan.seconds == pytest.approx((convs + linear) / 1e9)


def test_memory_limit_is_kept_or_refused():
    m = machine.from_dict(machine_doc())
    planner, fastest = search.plan_model(SMALL, (4, 2, 8, 8), 2, m)
    lean = min((planner.uniform(g) for g in perf.grids(2)), key=lambda p: p.memory)
    limit = (lean.memory + fastest.memory) / 2
    if lean.memory < fastest.memory:
        _, plan = search.plan_model(SMALL, (4, 2, 8, 8), 2, m, memory_limit=limit)
        assert plan.memory <= limit and plan.seconds >= fastest.seconds
    with pytest.raises(search.NoFeasiblePlan, match="--memory-per-rank"):
        search.plan_model(SMALL, (4, 2, 8, 8), 2, m, memory_limit=1000)


def test_written_spec_carries_every_stage_grid_and_algorithm():
    planner, plan = search.plan_model(SMALL, (4, 2, 8, 8), 2, V100)
    out = search.to_spec(SMALL, plan)
    assert SMALL["layers"][0].get("grid") is None  # the input spec is left alone
    for stage in stages(planner.elements):
        node = out
        for p in stage.main.path:
            node = node[p]
        cost = plan.choices[stage.main.path]
        assert tuple(node["grid"].get(a, 1) for a in perf.AXES) == cost.grid
        if stage.main.kind == "conv" and cost.grid[1] > 1:
            assert node["algorithm"] == cost.algorithm


def test_written_spec_of_a_model_opening_with_a_block_puts_its_input_on_the_planned_grid():
    """A leading block's input lies on defaults.grid (the builder's rule), so the written spec sets it
    to the grid the plan chose for the input: here not pure samples, which a batch of 2 cannot fill."""
    planner, plan = search.plan_model(RESIDUAL_FIRST, (2, 2, 8, 8), 4, V100)
    out = search.to_spec(RESIDUAL_FIRST, plan)
    assert out["defaults"] == {"grid": search.grid_dict(plan.input_grid)} and plan.input_grid[0] <= 2
    assert search.to_spec(SMALL, search.plan_model(SMALL, (4, 2, 8, 8), 2, V100)[1])["defaults"] == \
        {"grid": {"sample": 2}}  # a model opening with a stage: its input lies on that stage's own grid


def test_the_table_shows_a_leading_blocks_input_grid_where_it_is_not_the_first_rows():
    """``refconv plan`` prints an ``input`` row with the grid a leading block's input lies on (the
    written plan's defaults.grid) when that is not the first row's grid, and no such row otherwise."""
    planner, plan = search.plan_model(RESIDUAL_FIRST, (2, 2, 8, 8), 4, V100)
    first = plan.rows[0].cost.grid
    other = next(g for g in planner.grids if g != first)
    moved = planner.evaluate(plan.choices, other)
    assert moved.input_grid == other
    lines = report.table(moved).splitlines()
    assert lines[1].split() == ["input", search.strategy_label(other)]
    assert any(line.startswith("input ") for line in report.table(plan).splitlines()) == (plan.input_grid != first)


def test_resnet50_plans_at_64_ranks_quickly_and_beats_sample_parallelism():

    planner, plan = search.plan_model(load_spec("resnet50"), (256, 3, 224, 224), 64, V100)
    sample = planner.uniform((64, 1, 1, 1), "stationary-x")
    assert plan.seconds <= sample.seconds
    assert len(plan.rows) == 53 + 2 + 16  # 53 convs, the stem pool and gap, 16 residual sums


# -- algorithm: auto ----------------------------------------------------------------------------------------
def free_compute_machine():
    """machine_doc's links (alpha 2e-5 s, beta 1e-9 s/B) with every kernel free: a layer's price is its calls'."""
    doc = machine_doc()
    doc["compute"] = {op: ({c: {"t0": 0.0, "rate": 1e30} for c in machine.CONV_CLASSES} if op.startswith("conv")
                           else {"t0": 0.0, "rate": 1e30}) for op in machine.COMPUTE}
    return machine.from_dict(doc)


def test_choose_for_layer_warns_without_a_machine_and_prices_each_algorithm_by_hand():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, table = choose_for_layer((8, 64, 14, 14), 64, (3, 3), grid_shape=(1, 4, 1, 1), padding=(1, 1))
    assert any("built-in" in str(w.message) for w in caught)
    assert set(table) == {("stationary-x", None), ("stationary-y", None), ("stationary-w", 2)}
    # x (8, 64, 14, 14) -> y (8, 128, 14, 14) on channel=4 (weight peers: 1 rank, so no allreduce is priced).
    # X: reduce-scatter y and allgather dy, m = 8*128*196*4 B over 4 ranks: 3 steps, 3/4 of m each.
    # Y: allgather x and reduce-scatter dx, m = 8*64*196*4 B.  W (p_f = p_c' = 2): x and dx over p_f with
    # C_b = 32 channels, y and dy over p_c' with F_a = 64 filters; 1 step and 1/2 of m each.
    algorithm, p_f, table = choose_for_layer((8, 64, 14, 14), 128, (3, 3), grid_shape=(1, 4, 1, 1), padding=(1, 1),
                                             machine=free_compute_machine())
    def call(steps, moved):
        return steps * 2e-5 + moved * 1e-9
    assert table == pytest.approx({("stationary-x", None): 2 * call(3, 0.75 * 8 * 128 * 196 * 4),
                                   ("stationary-y", None): 2 * call(3, 0.75 * 8 * 64 * 196 * 4),
                                   ("stationary-w", 2): 2 * call(1, 0.5 * 8 * 32 * 196 * 4)
                                   + 2 * call(1, 0.5 * 8 * 64 * 196 * 4)}, rel=1e-9)
    assert (algorithm, p_f) == ("stationary-w", 2)   # 0.682 ms against Y's 0.722 and X's 1.324
    with pytest.raises(ValueError, match="grid_shape"):
        choose_for_layer((2, 4, 4, 4), 4, (3, 3), grid_shape=(4, 1, 1, 1), machine=V100)


# -- the command line ------------------------------------------------------------------------------------
def _refconv(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "refconv.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("args, needle", [
    (("--machine", "no-such-file.yaml"), "--machine: file 'no-such-file.yaml' does not exist"),
    (("--machine", "v100-edr", "--image-size", "1"), "cannot bind"),
    (("--machine", "v100-edr", "--memory-per-rank", "0.000001"), "--memory-per-rank: no plan"),
])
def test_plan_bad_input_is_one_line_and_status_2(args, needle):
    r = _refconv("plan", "--model", "digits-cnn", "--ranks", "4", "--batch", "8", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and needle in r.stderr
    assert len([l for l in r.stderr.splitlines() if "error" in l]) == 1


def test_plan_model_file_that_does_not_parse_is_named_as_refconv_train_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: [unclosed\n")
    r = _refconv("plan", "--model", str(bad), "--ranks", "2", "--batch", "8", "--machine", "v100-edr")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"refconv plan: error: --model: '{bad}' is not a valid YAML model" in r.stderr


def test_plan_writes_a_model_file(tmp_path):
    out = tmp_path / "plan.yaml"
    r = _refconv("plan", "--model", "digits-cnn", "--ranks", "2", "--batch", "8", "--image-size", "16",
                 "--machine", "v100-edr", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "pure sample parallelism" in r.stdout and "best single strategy" in r.stdout

    spec = yaml.safe_load(out.read_text())
    assert spec["layers"][0]["grid"] and spec["defaults"] == {"grid": {"sample": 2}}


# ResNet-50's 2x and 4x wide presets get resnet50's plan at these sizes (the same layers on the same grids, as
# the test after this one checks; the same recipe and data), with 4x and 16x the weights: their 3 steps (41.5 of
# the three's 48.6 CPU seconds, measured) run in `make test-extended`, and resnet50 runs that plan's command here.
WIDE = ("resnet50-wide2", "resnet50-wide4")


@pytest.mark.mpi
@pytest.mark.parametrize("preset", [pytest.param(p, marks=pytest.mark.extended) if p in WIDE else p
                                    for p in sorted(PRESETS)])
def test_the_command_plan_prints_trains_every_preset(tmp_path, preset):
    """The line ``refconv plan --out`` ends with is run as printed, on 2 ranks, for every preset
    (cosmoflow's volumes too: 16^3, on a grid of five axes):
    it must bring the data the plan was made for (resnet50 on the 1-channel digits failed), and
    train with the preset's recipe (refconv.recipe), which the file carries: the learning rate of
    its first step is the preset's at batch 4 (0.1 x 4 / 256 for the ImageNet presets, which the
    file trained at 0.1 before, its loss going 7.29, 23.3, 21.3, 51.6; 0.01 for cosmoflow), and no
    loss of the three steps exceeds the guard's 4 x the first (refconv.train.guards.check_growth).
    Appended only: three steps on 8 images, and the metrics file."""
    out = tmp_path / "plan.yaml"
    r = _refconv("plan", "--model", preset, "--ranks", "2", "--batch", "4", "--image-size", "16",
                 "--machine", "v100-edr", "--out", str(out))
    assert r.returncode == 0, r.stderr
    printed = shlex.split(r.stdout.splitlines()[-1].partition("run it with")[2])
    assert printed[:4] == ["mpiexec", "-n", "2", "refconv"] and "--model" in printed, r.stdout
    command = [find_mpiexec(), *printed[1:3], sys.executable, "-m", "refconv.cli", *printed[4:]]
    command += ["--max-steps", "3", "--no-progress", "--metrics-out", str(tmp_path / "m.jsonl")]
    if "--synthetic" in printed:
        command += ["--synthetic-samples", "8"]
    t = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert t.returncode == 0, t.stderr[-2000:]
    name = yaml.safe_load(out.read_text())["name"]
    assert f"model {name}:" in t.stdout and "trained 3 steps" in t.stdout, t.stdout
    lr = recipe.learning_rate(recipe.PRESET_RECIPES[preset], 4)
    steps = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s]
    losses = [s["loss"] for s in steps]
    assert len(steps) == 3 and steps[0]["lr"] == pytest.approx(lr, rel=1e-12), steps[0]
    assert max(losses) < GROWTH_FACTOR * losses[0] and "the loss grew" not in t.stderr, (losses, t.stderr)


def test_the_wide_presets_get_resnet50s_plan_at_the_sizes_trained_above(tmp_path, capsys):
    """Why training the WIDE presets above is left to ``make test-extended``: at --ranks 2 --batch 4
    --image-size 16 their plans give every layer the grid resnet50's plan gives it, so the command resnet50's
    case runs is the same plan."""
    def grids(layers):
        for layer in layers:
            yield layer.get("grid")
            yield from grids(layer.get("layers", []))

    plans = {}
    for preset in ("resnet50", *WIDE):
        out = tmp_path / f"{preset}.yaml"
        assert cli.main(["plan", "--model", preset, "--ranks", "2", "--batch", "4", "--image-size", "16",
                         "--machine", "v100-edr", "--out", str(out)]) == 0, capsys.readouterr()
        spec = yaml.safe_load(out.read_text())
        plans[preset] = (spec["defaults"], list(grids(spec["layers"])))
    assert any(plans["resnet50"][1]), plans["resnet50"]        # some layer has a grid of its own
    assert all(plans[preset] == plans["resnet50"] for preset in WIDE), plans


@pytest.mark.parametrize("ranks, needle", [
    (1_000_000, "--ranks: 1000000 is more than the 65536 ranks the planner searches; plan for at most 65536"),
    (13824, "--ranks: 13824 ranks factor into 4400 grids (sample x channel x height x width), a search estimated "
            "at 10169 s, more than the 300 s the planner allows; choose a rank count with fewer factors (e.g. 8192: "
            "560 grids)"),
])
def test_plan_refuses_a_rank_count_it_cannot_search_in_minutes(ranks, needle):
    r = _refconv("plan", "--model", "resnet50", "--ranks", str(ranks), "--batch", "8")
    assert r.returncode == 2 and r.stderr == f"refconv plan: error: {needle}\n", r.stderr


def test_the_planner_reports_its_progress():
    said = []
    spec = load_spec("resnet50", num_classes=10)
    planner = search.Planner(spec, (8, 3, 32, 32), 4, V100, progress=said.append, every_s=0.0)
    planner.plan()
    planner.best_uniform()
    n = sum(1 for _ in stages(planner.elements))
    assert said[0] == f"refconv plan: 4 ranks, 10 grids: search 1, stage 1/{n} (0 s)"
    assert any(f"search 1, stage {n}/{n} (" in line for line in said)
    assert said[-1].startswith("refconv plan: 4 ranks, 10 grids: the best single strategy, grid 10/10 (")
    assert search.Planner(spec, (8, 3, 32, 32), 4, V100)._say is None  # silent unless asked


def test_calibrate_names_every_rate_it_could_not_measure():
    assert fits.fit_line([1, 2, 4], [3.0, 2.0, 1.0]) == (2.0, fits.SLOPE_FLOOR)  # time fell as size grew
    doc = machine_doc()
    doc["collectives"]["intra"]["halo"] = {"table": {2: [1e-5, fits.SLOPE_FLOOR], 4: [1e-5, 1e-9]}}
    doc["compute"]["conv_fwd"]["1x1"]["rate"] = 1 / fits.SLOPE_FLOOR
    doc["compute"]["pool"]["rate"] = float(f"{1 / fits.SLOPE_FLOOR:.4g}")  # as the file rounds it
    assert calibrate.unmeasured(doc) == ["halo q=2", "conv_fwd 1x1", "pool"]
    assert calibrate.unmeasured(machine_doc()) == []


def test_until_grown_measures_again_only_what_did_not_grow_and_returns_what_never_did():
    """A flat item is measured again at grow(sizes), up to RETRIES times; one that grows is kept
    from the try where it grew; one that never grows comes back apart, with its last try."""
    asked = []

    def measure(pending):
        asked.append(dict(pending))
        flat = len(asked) < 2  # "later" grows from the second try on; "never" never does
        return {item: ([4 * n for n in sizes], [1e-3] * len(sizes) if item == "never" or flat
                       else [1e-4 + 4e-9 * n for n in sizes]) for item, sizes in pending.items()}

    done, failed = fits.until_grown(measure, {"now": [1, 2], "later": [1, 2], "never": [1, 2]},
                                         lambda item, sizes: [4 * n for n in sizes],
                                         lambda item, xy: fits.grown_line(*xy) if item != "now" else (0.0, 1.0))
    assert asked == [{"now": [1, 2], "later": [1, 2], "never": [1, 2]}, {"later": [4, 8], "never": [4, 8]},
                     {"never": [16, 32]}]
    assert done["now"][2] == 0 and done["later"][2] == 1 and done["later"][0][1] == pytest.approx(1e-9)
    assert failed == {"never": ([64, 128], [1e-3, 1e-3])}


def _flat_timer(comm, contenders, repeats, *args, **kwargs):
    """A stand-in for measure.time_ranks: every contender takes 1 ms, whatever its size."""
    return {name: [1e-3] * repeats for name in contenders}


def test_calibrate_with_a_timer_that_does_not_grow_names_each_item_and_writes_no_rate(monkeypatch):
    """The time of nothing grows with its size: no rate can be measured, so calibrate raises the
    clear error (status 4 through the command line) naming every item and how to measure it, and
    returns no machine file that would price them free (issue 35)."""
    monkeypatch.setattr(measure, "time_ranks", _flat_timer)
    with pytest.raises(calibrate.Unmeasured) as caught:
        calibrate.calibrate(MPI.COMM_SELF, "numpy", quick=True)
    message = str(caught.value)
    assert caught.value.status == 4
    items = [f"{op} {cls}" for op in machine.CONV_OPS for cls in ("1x1", "kxk", "kxkxk")]
    items += ["batchnorm", "pool", "elementwise", "pack", "layer"]
    assert all(f"{item} (" in message for item in items), message
    assert "no machine file was written" in message and "without --quick" in message
    assert "refconv plan --machine NAME, one of dev-cpu" in message
    assert "1e+15" not in message and "free" not in message


def test_calibrate_measures_again_at_larger_sizes_and_the_file_prices_nothing_free(monkeypatch):
    """Fake measurements whose time is flat on each item's first sweep and grows with its work
    after: every item is measured again, the file's every rate comes from the larger sweep (none
    at 1e15), and its notes say so."""
    tries = {}

    def timed(what, works):
        tries[what] = tries.get(what, 0) + 1
        return [1e-3 if tries[what] == 1 else 1e-4 + 1e-10 * w for w in works]

    def conv_table(comm, backend, windows, repeats, say=None):
        works = [s.n * s.C * s.F * math.prod(s.window) * math.prod(s.kernel) for s in windows]
        return [{"shape": s.as_list(), **{op: t for op in machine.CONV_OPS}} for s, t in zip(windows, timed("conv", works))]

    def bandwidth(comm, backend, rng, op, sizes, repeats):
        xs = [N * C * H * H * 4 for N, C, H in sizes]
        return xs, timed(op, xs)

    def layer(comm, backend, shapes, repeats):
        xs = [(N * C + N * F) * H * H * 4 for N, C, F, H, K in shapes]
        return xs, timed("layer", xs)

    monkeypatch.setattr(measure, "measure_conv_table", conv_table)
    monkeypatch.setattr(measure, "measure_bandwidth", bandwidth)
    monkeypatch.setattr(measure, "measure_layer_overhead", layer)
    doc = calibrate.calibrate(MPI.COMM_SELF, "numpy", quick=True)
    machine.from_dict(doc)
    assert calibrate.unmeasured(doc) == []
    rates = [fit["rate"] for op in machine.CONV_OPS for fit in doc["compute"][op].values()]
    rates += [doc["compute"][op]["rate"] for op in ("batchnorm", "pool", "elementwise", "pack", "layer")]
    assert all(0 < r < 1 / fits.SLOPE_FLOOR for r in rates), doc["compute"]
    assert list(doc["compute"]) == list(machine.COMPUTE) and list(doc["compute"]["conv_fwd"]) == ["1x1", "kxk", "kxkxk"]
    again = [n for n in doc["notes"] if "measured again 1 time" in n]
    assert len(again) == 9 + 5 and tries == {op: 2 for op in ("conv", "batchnorm", "pool", "elementwise", "pack",
                                                               "layer")}, doc["notes"]


def test_larger_sweeps_grow_the_work():
    """Each retry's sizes: 16x a convolution's FLOPs (4x the channels in and out), 16x layer's bytes
    (4x the rows and columns), 4x a bandwidth-bound operation's bytes (twice the rows and columns)."""
    flops = lambda shapes: sum(2 * N * F * C * (H * K) ** 2 for N, C, F, H, K in shapes)  # noqa: E731
    shapes = measure.conv_shapes(True)
    assert flops(measure._larger_convs(("conv_fwd", "kxk"), shapes)) == 16 * flops(shapes)
    assert [s[-2] for s in measure._larger_images(measure.layer_shapes(True))] == [64, 192]
    assert measure._wider([(2, 8, 16)]) == [(2, 8, 32)]
    assert [s[-1] for s in measure.layer_shapes(False)] == [1] * 4   # 1x1: the bytes grow, the FLOPs little


def test_overlapped_step_by_hand():
    """Forward 1 + 1; backward of the last layer (1) then its allreduce (1) beside the first
    layer's backward (1); the first layer's allreduce (5) starts when both are done."""
    a = perf.StageCost((1, 1, 1, 1), fwd=1.0, bwd=1.0, grad=5.0)
    b = perf.StageCost((1, 1, 1, 1), fwd=1.0, bwd=1.0, grad=1.0)
    assert perf.overlapped_step([a, b]) == pytest.approx(2 + 2 + 5)
    assert a.seconds + b.seconds == pytest.approx(10)
    # a machine that hides none of an allreduce steps as the blocking sum; one that hides half
    # pays 0.5 + 2.5 on its own time: compute 2 + (1 + 0.5) + (1 + 2.5), then the hidden 2.5
    assert perf.overlapped_step([a, b], hidden=0.0) == pytest.approx(10)
    assert perf.overlapped_step([a, b], hidden=0.5) == pytest.approx(9.5)


def test_a_blocking_call_in_backward_waits_for_the_allreduces_on_the_link_by_hand():
    """Forward 1 + 1 (half of a's 2-s batch-norm allreduce) + 1; backward of b (1), whose allreduce (5)
    takes the link until 4 + 5 = 9; a's backward (1) ends at 5, but its allreduce (1) needs the link:
    it starts at 9, and the rank waits for it (the logical clock's one link a rank)."""
    a = perf.StageCost((1, 1, 1, 1), fwd=1.0, bwd=1.0, comm={"allreduce": 2.0})
    b = perf.StageCost((1, 1, 1, 1), fwd=1.0, bwd=1.0, grad=5.0)
    assert perf.overlapped_step([a, b]) == pytest.approx(10.0)
    assert perf.overlapped_step([a, b], hidden=0.0) == pytest.approx(a.seconds + b.seconds)   # the blocking sum, 11


def _halo_hidden(shape, grid, algorithm, halos, share=1.0):
    layer = _conv_layer({"out": 4, "kernel": 3, "padding": 1}, shape)
    return perf.halo_hidden(perf.conv_geometry(layer), grid, algorithm, (6.0, 14.0, 5.0), halos, share)


def test_halo_overlap_hides_the_halo_behind_the_interior_by_hand():
    """A 3x3 conv, padding 1, of 12 x 12 images on 2 height ranks: rank 0's outputs are rows 0-5,
    of which 0-4 read no halo row (5/6 of its forward behind the exchange); its window is
    8 x 14 (rows -1..6, columns -1..12), of which it keeps its own 6 x 12 cells (9/14 of
    backward-data behind the return, with all of backward-filter but for Stationary-Y).
    Passes 6 s forward, 14 s backward-data, 5 s backward-filter: each halo call hides
    min(the compute behind it, the machine's share of the call)."""
    sample, y = (1, 1, 2, 1), (1, 2, 2, 1)
    assert _halo_hidden((1, 4, 12, 12), sample, "stationary-x", (100.0, 100.0)) == pytest.approx((5.0, 9.0 + 5.0))
    assert _halo_hidden((1, 4, 12, 12), sample, "stationary-x", (0.5, 0.25)) == pytest.approx((0.5, 0.25))
    assert _halo_hidden((1, 4, 12, 12), sample, "stationary-x", (4.0, 4.0), share=0.5) == pytest.approx((2.0, 2.0))
    assert _halo_hidden((1, 4, 12, 12), y, "stationary-y", (100.0, 100.0)) == pytest.approx((5.0, 9.0))
    assert _halo_hidden((1, 4, 12, 12), y, "stationary-x", (100.0, 100.0)) == pytest.approx((5.0, 14.0))
    # 2 output rows a rank, 1 reading the halo: too small to split (the layer falls back), so only
    # backward-filter runs behind the return, and nothing for Stationary-Y
    assert _halo_hidden((1, 4, 4, 12), sample, "stationary-x", (100.0, 100.0)) == (0.0, 5.0)
    assert _halo_hidden((1, 4, 4, 12), y, "stationary-y", (100.0, 100.0)) == (0.0, 0.0)


def test_overlapped_step_hides_the_halo_calls_by_hand():
    """Forward 2 + halo exchange 1 (as comm, half of 2 s), of which 0.5 hidden; backward 3 +
    return 1 of which 1 hidden, then the allreduce (4) alone on its stream: 2.5 + 3 + 4."""
    a = perf.StageCost((1, 1, 2, 1), fwd=2.0, bwd=3.0, comm={"halo": 2.0}, grad=4.0, hidden_fwd=0.5, hidden_bwd=1.0)
    assert a.seconds == pytest.approx(11.0)
    assert perf.overlapped_step([a]) == pytest.approx(2.5 + 3.0 + 4.0)
    assert perf.overlapped_step([a], hidden=0.0) == pytest.approx(11.0 - 1.5)  # halo shares priced in hidden_*


def test_the_plan_prints_the_halo_hidden_behind_compute():
    """digits-cnn with one sample on 4 ranks splits space: the overlapped step hides part of
    the convolutions' halo calls, and the blocking step (the objective) is unchanged by it."""
    planner, plan = search.plan_model(load_spec("digits-cnn"), (1, 1, 64, 64), 4, V100)
    hidden = plan.halo_hidden_seconds
    assert 0 < hidden <= plan.comm("halo")
    no_halo = perf.overlapped_step([dataclasses.replace(r.cost, hidden_fwd=0.0, hidden_bwd=0.0) for r in plan.rows],
                                   plan.hidden)
    assert plan.overlapped_seconds == pytest.approx(no_halo - hidden)
    assert f"of the halo calls' {plan.comm('halo') * 1e3:.3f} ms, {hidden * 1e3:.3f} ms hidden" in report.summary(
        plan, None, None)


def test_calibration_fits_recover_known_costs():
    flops = numpy.array([1e6, 4e6, 2e7, 8e7, 3e8])
    columns = numpy.array([4e5, 1e5, 6e6, 2e6, 4e7])
    t = 5e-5 + flops / 4e10 + columns / 2e9
    assert numpy.allclose(fit_plane(flops, columns, t), (5e-5, 1 / 4e10, 1 / 2e9), rtol=1e-6)
    assert numpy.allclose(fit_line(flops, 2e-5 + flops / 1e10), (2e-5, 1e-10), rtol=1e-6)
    doc = machine_doc()
    doc["compute"]["conv_fwd"]["kxk"]["bw"] = 2e9
    m = machine.from_dict(doc)
    assert m.conv_seconds("conv_fwd", 9, 1e8, 4e6) == pytest.approx(1e-5 + 1e8 / 1e10 + 4e6 / 2e9)


def test_validation_pick_rates_strict_and_within_noise():
    """The strict pick is the measured fastest by median; within noise, the pick's min..max
    overlaps the fastest's.  Worked by hand on three constructed (layer, P) cases."""
    def row(layer, label, predicted, *measured):
        return Row(layer, 2, label, perf.StageCost((2, 1, 1, 1), fwd=predicted), Span(measured))

    rows = [row("hit", "sample", 1.0, 1.0, 1.1, 1.2), row("hit", "X", 2.0, 2.0, 2.1, 2.2),
            row("tie", "sample", 1.0, 1.05, 1.2, 1.3), row("tie", "X", 2.0, 0.9, 1.1, 1.2),  # pick 1.2 vs 1.1
            row("miss", "sample", 1.0, 1.5, 1.6, 1.7), row("miss", "X", 2.0, 1.0, 1.1, 1.2),
            row("alone", "sample", 1.0, 1.0)]  # one strategy: not a choice
    got = {p.layer: (p.chosen.label, p.fastest.label, p.strict, p.within_noise) for p in picks(rows)}
    assert got == {"hit": ("sample", "sample", True, True), "tie": ("sample", "X", False, True),
                   "miss": ("sample", "X", False, False)}
    assert rows[5].error == pytest.approx((2.0 - 1.1) / 1.1)
    assert relative_to_sample(rows) == pytest.approx([(2 / 1) / (2.1 / 1.1), (2 / 1) / (1.1 / 1.2),
                                                      (2 / 1) / (1.1 / 1.6)])


# -- the per-local-shape conv table ----------------------------------------------------------------------
TABLED = machine.ConvShape(2, 4, 8, (10, 10), (3, 3))  # n, C, F, (H_win, W_win), (Kh, Kw); stride, dilation 1, groups 1


def tabled_doc(*entries):
    doc = machine_doc()
    doc["compute"]["conv_table"] = list(entries) or [
        {"shape": TABLED.as_list(), "conv_fwd": 1.0, "conv_bwd_data": 2.0, "conv_bwd_filter": 4.0}]
    return doc


@pytest.mark.parametrize("table, needle", [
    ({"shape": [1] * 12}, r"compute.conv_table: expected a list"),
    ([{"shape": [1] * 12, "conv_fwd": 1.0}], r"conv_table\[0\]: expected the keys shape, conv_fwd"),
    ([{"shape": [1] * 11, "conv_fwd": 1, "conv_bwd_data": 1, "conv_bwd_filter": 1}],
     r"conv_table\[0\].shape: expected 12 positive ints"),
    ([{"shape": [1, 0] + [1] * 10, "conv_fwd": 1, "conv_bwd_data": 1, "conv_bwd_filter": 1}],
     r"conv_table\[0\].shape: expected 12 positive ints"),
    ([{"shape": [1, 3, 4] + [1] * 8 + [2], "conv_fwd": 1, "conv_bwd_data": 1, "conv_bwd_filter": 1}],
     r"groups=2 must divide C=3"),
    ([{"shape": [1] * 12, "conv_fwd": 1, "conv_bwd_data": 0, "conv_bwd_filter": 1}],
     r"conv_table\[0\].conv_bwd_data: must be > 0"),
    ([{"shape": [1] * 12, "conv_fwd": "fast", "conv_bwd_data": 1, "conv_bwd_filter": 1}],
     r"conv_table\[0\].conv_fwd: expected a non-negative number"),
    ([{"shape": [1] * 12, "conv_fwd": 1, "conv_bwd_data": 1, "conv_bwd_filter": 1}] * 2,
     r"conv_table\[1\].shape: \[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1\] is listed twice"),
])
def test_malformed_conv_table_is_named(table, needle):
    doc = machine_doc()
    doc["compute"]["conv_table"] = table
    with pytest.raises(machine.MachineError, match=needle):
        machine.from_dict(doc)


def test_conv_table_prices_its_shapes_and_the_fit_the_rest():
    fit, tabled = machine.from_dict(machine_doc()), machine.from_dict(tabled_doc())
    assert tabled.conv_seconds("conv_bwd_filter", 9, 1e8, 1e6, TABLED) == 4.0
    assert tabled.conv_seconds("conv_fwd", 9, 1e8, 1e6, dataclasses.replace(TABLED, n=3)) == pytest.approx(
        1e-5 + 1e8 / 1e10)  # another shape: the kxk class fit
    assert tabled.conv_seconds("conv_fwd", 9, 1e8) == fit.conv_seconds("conv_fwd", 9, 1e8)  # no shape given
    # Through the planner's pricing: the 3x3 conv, padding 1, of (4, 4, 8, 8) on 2 samples is the tabled
    # shape (2 samples, a 10x10 window); on 2 channels (Stationary-X: 2 input channels) it is not.
    spec = {"type": "conv", "out": 8, "kernel": 3, "padding": 1}
    layer = _conv_layer(spec, (4, 4, 8, 8))
    on_samples = [perf.layer_cost(layer, (2, 1, 1, 1), m, "stationary-x") for m in (fit, tabled)]
    fitted = 1e-5 + (2 * 2 * 8 * 8 * 8 * 4 * 9) / 1e10  # t0 + FLOPs / rate, each pass alike in machine_doc
    assert on_samples[1].fwd - on_samples[0].fwd == pytest.approx(1.0 - fitted)
    assert on_samples[1].bwd - on_samples[0].bwd == pytest.approx(2.0 + 4.0 - 2 * fitted)
    on_channels = [perf.layer_cost(layer, (1, 2, 1, 1), m, "stationary-x") for m in (fit, tabled)]
    assert on_channels[0] == on_channels[1]


def _conv_layer(spec, shape):
    return graph.Layer.of({"type": "conv", **spec}, shape, ("layers", 0))


@pytest.mark.parametrize("spec", [{"out": 8, "kernel": 3, "padding": 1}, {"out": 8, "kernel": 3, "stride": 2},
                                  {"out": 4, "kernel": 5, "padding": 4, "dilation": 2}, {"out": 4, "kernel": 1}])
def test_table_key_is_the_window_the_algorithm_convolves(spec):
    """On one rank, the window a DistConv2d convolves (padding included) and its weight are the
    ConvShape the planner keys; tests/on_ranks/test_plan.py checks split grids."""
    shape = (2, 4, 9, 9)
    layer = DistConv2d(4, spec["out"], spec["kernel"], padding=spec.get("padding", 0), stride=spec.get("stride", 1),
                       dilation=spec.get("dilation", 1), grid=ProcessGrid(MPI.COMM_SELF), backend="numpy",
                       input_shape=shape)
    layer.forward(numpy.zeros(shape, numpy.float32))
    planned = _conv_layer(spec, shape)
    key = perf.local_conv_shape(planned, (1, 1, 1, 1), *perf.local_weight_shape(planned, (1, 1, 1, 1), None, None))
    assert (key.n, key.C, *key.window) == layer._algo.x_win.shape
    assert (key.F, key.C // key.groups, *key.kernel) == layer.weight.shape


def test_plan_runs_with_a_tabled_machine_file(tmp_path):
    """Every conv shape the planner prices for digits-cnn on 2 ranks tabled at 1 s a pass (the
    fit gives well under 10 ms): every conv stage of the plan is priced from the table (plus
    its followers and overhead, milliseconds), and `refconv plan` runs with the file."""

    spec, shape = load_spec("digits-cnn"), (8, 1, 16, 16)
    shapes = calibrate.model_shapes(spec, shape, 2, machine.load("dev-cpu"))
    doc = tabled_doc(*({"shape": s.as_list(), "conv_fwd": 1.0, "conv_bwd_data": 1.0, "conv_bwd_filter": 1.0}
                       for s in shapes))
    _, plan = search.plan_model(spec, shape, 2, machine.from_dict(doc))
    convs = [r.cost for r in plan.rows if r.kind == "conv"]
    assert len(convs) == 3 and all(1.0 < c.fwd < 1.01 and 2.0 < c.bwd < 2.01 for c in convs)
    path = tmp_path / "tabled.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = _refconv("plan", "--model", "digits-cnn", "--ranks", "2", "--batch", "8", "--image-size", "16",
                 "--machine", str(path))
    assert r.returncode == 0, r.stderr
    assert "pure sample parallelism" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (("--batch", "8"), "--batch: given without --model"),
    (("--model", "digits-cnn"), "--batch, --image-size, --max-shapes: expected positive ints"),
    (("--model", "digits-cnn", "--batch", "8", "--max-shapes", "2"), "--max-shapes: the model has"),
    (("--model", "no-such.yaml", "--batch", "8"), "--model: file 'no-such.yaml' does not exist"),
])
def test_calibrate_model_bad_input_is_one_line_and_status_2(tmp_path, args, needle):
    r = _refconv("calibrate", "--out", str(tmp_path / "m.yaml"), "--quick", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and needle in r.stderr
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.mpi
@pytest.mark.parametrize("launched", ["by itself", "under mpiexec"])
def test_calibrate_writes_a_machine_file_with_and_without_mpiexec(tmp_path, launched):
    """As the hints say it (``refconv calibrate --out machine.yaml``, one process: it starts
    mpiexec itself) and as docs/planning.md says it (under mpiexec): the same measured file,
    with collectives timed between 2 ranks, that refconv plan then uses."""
    out = tmp_path / "m.yaml"
    args = ["-m", "refconv.cli", "calibrate", "--out", str(out), "--quick"]
    if launched == "by itself":
        command = [sys.executable, *args, "--ranks", "2"]
    else:
        command = [find_mpiexec(), "-n", "2", sys.executable, *args]
    for _ in range(2):   # calibrate refuses, by design, when a busy machine (xdist's other worker) flattens a sweep
        r = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if "again on a quieter machine" not in r.stderr:
            break                  # its own advice: run it again; a second refusal fails the test below
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout and "Abort" not in r.stderr
    assert not r.stderr.strip(), r.stderr  # no warning: every rate measured (retried at larger sizes if need be)
    m = machine.load(str(out))
    assert isinstance(m.measured, str) and m.ranks_per_node == 2
    doc = yaml.safe_load(out.read_text())
    assert all(list(doc["collectives"]["intra"][kind]["table"]) == [2] for kind in machine.KINDS)
    assert 0 <= doc["overlap"] <= 1 and m.overlap == doc["overlap"]  # the share of an allreduce it hides
    p = _refconv("plan", "--model", "digits-cnn", "--ranks", "2", "--batch", "8", "--image-size", "16",
                 "--machine", str(out))
    assert p.returncode == 0 and "machine this-machine (measured" in p.stdout, p.stderr
    assert f"{m.overlap:.0%} of it hidden: the machine file's overlap" in p.stdout


def test_calibrate_from_one_process_starts_four_ranks_by_default(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(launch, "relaunch", lambda ranks, argv: started.append((ranks, argv)) or 0)
    argv = ["calibrate", "--out", str(tmp_path / "m.yaml"), "--quick"]
    assert cli.main(argv) == 0 and started == [(4, argv)]
    assert "starting mpiexec -n 4" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (("--ranks", "1"), "--ranks: expected an int >= 2"),
    (("--ranks", "2", "--model", "digits-cnn", "--batch", "8", "--max-shapes", "2"), "on 2 ranks, more than 2"),
])
def test_calibrate_checks_its_input_before_starting_ranks(tmp_path, args, needle):
    r = _refconv("calibrate", "--out", str(tmp_path / "m.yaml"), "--quick", *args)
    assert r.returncode == 2 and "starting mpiexec" not in r.stdout, r.stdout
    assert needle in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
