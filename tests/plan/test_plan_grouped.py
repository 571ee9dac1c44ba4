"""The planner with grouped and depthwise convolutions on a channel split: the options it
prices are the classes that run the layer (docs/grouped.md), the optimum is the brute
force's, and the model file it writes asks for names that resolve to what it priced."""

import pytest
from test_plan import brute_force, free_compute_machine, machine_doc

from refconv import algorithms
from refconv.pricing import choose_for_layer, machine, search
from refconv.pricing.graph import stages

GROUPED = {
    "in_channels": 4,
    "layers": [
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1},
        {"type": "conv", "out": 8, "kernel": 3, "padding": 1, "groups": 2},  # a group spans 2 ranks at channel=4
        {"type": "conv", "out": 8, "kernel": 1, "groups": 8},  # depthwise: whole groups on every rank
        {"type": "gap"}, {"type": "linear", "out": 3},
    ],
}
SHAPE = (4, 4, 8, 8)


def _options(planner, stage, grid):
    return {(c.algorithm, c.filter_groups) for c in planner.options(stage)[planner.grids.index(grid)]}


def test_grouped_convs_are_priced_on_channel_splits_by_the_classes_that_run_them():
    planner, _ = search.plan_model(GROUPED, SHAPE, 4, machine.from_dict(machine_doc()))
    dense, spanning, depthwise = [s for s in stages(planner.elements) if s.main.kind == "conv"]
    assert _options(planner, spanning, (1, 4, 1, 1)) == {("grouped-x", None), ("grouped-y", None)}
    assert _options(planner, spanning, (1, 2, 1, 2)) == {("grouped", None)}  # 2 groups on 2 ranks: one each
    assert _options(planner, depthwise, (1, 4, 1, 1)) == {("grouped", None)}
    assert ("stationary-w", 2) in _options(planner, dense, (1, 4, 1, 1))


def test_w_within_groups_is_a_candidate_where_a_group_has_four_ranks():
    # groups=2 on channel=8: q = 4 ranks per group, W with p_f = 2 among them
    assert algorithms.candidates(8, 2, (16, 16)) == [("grouped-x", None), ("grouped-y", None), ("stationary-w", 2)]
    with pytest.raises(ValueError, match="groups: a grouped convolution on a channel split needs"):
        algorithms.candidates(4, 3, (12, 12))
    planner, _ = search.plan_model({"in_channels": 3, "layers": [{"type": "conv", "out": 6, "kernel": 1, "groups": 3},
                                                                 {"type": "gap"}, {"type": "linear", "out": 2}]},
                                   (2, 3, 4, 4), 2,
                                   machine.from_dict(machine_doc()))
    (conv,) = [s for s in stages(planner.elements) if s.main.kind == "conv"]
    assert _options(planner, conv, (1, 2, 1, 1)) == set()  # 3 groups on 2 ranks: not run, so not priced


def test_planner_finds_the_brute_force_optimum_with_grouped_layers():
    planner, plan = search.plan_model(GROUPED, SHAPE, 4, machine.from_dict(machine_doc()))
    best, count = brute_force(planner)
    assert count > 50
    assert plan.seconds == pytest.approx(best, rel=1e-12)


def test_only_allreduce_costs_so_every_grouped_conv_goes_channel_and_the_file_asks_for_it():
    """Only allreduce costs (1 s per call): every conv and the classifier avoid weight peers, so
    each takes a pure channel grid, the grouped convs through the classes that run them; the
    written model file names algorithms that resolve to exactly those classes."""
    doc = machine_doc()
    for scope in ("intra", "inter"):
        doc["collectives"][scope] = {k: {"alpha": 0.0, "beta": 0.0} for k in machine.KINDS}
        doc["collectives"][scope]["allreduce"] = {"alpha": 1.0, "beta": 0.0}
    planner, plan = search.plan_model(GROUPED, SHAPE, 4, machine.from_dict(doc))
    assert plan.comm("allreduce") == 0
    out = search.to_spec(GROUPED, plan)
    ran = []
    for stage in stages(planner.elements):
        if stage.main.kind != "conv":
            continue
        cost, node = plan.choices[stage.main.path], out["layers"][stage.main.path[-1]]
        assert cost.grid == (1, 4, 1, 1)
        C, groups = stage.main.in_shape[1], stage.main.spec.get("groups", 1)
        cls, p_f = algorithms.resolve(node["algorithm"], 4, node.get("filter_groups"), groups, (C, node["out"]))
        assert (cls.name, p_f) == (cost.algorithm, cost.filter_groups)
        ran.append(cls.name)
    assert ran[1] in ("grouped-x", "grouped-y") and ran[2] == "grouped"


def test_auto_on_a_grouped_layer_prices_it_with_the_machine_among_the_classes_that_run_it():
    m = machine.from_dict(machine_doc())
    algorithm, p_f, table = choose_for_layer((4, 8, 8, 8), 8, (3, 3), grid_shape=(1, 4, 1, 1), padding=(1, 1),
                                             groups=2, machine=m)
    assert set(table) == {("grouped-x", None), ("grouped-y", None)}
    calls = algorithms.layer_records("stationary-x", (4, 8, 8, 8), 8, (3, 3), padding=(1, 1), groups=2,
                                     grid_shape=(1, 4, 1, 1))
    comm_only = sum(m.comm_seconds(c.kind, c.comm_size, c.bytes, c.messages) for c in calls)
    assert table[("grouped-x", None)] > comm_only  # the local convolution is priced too


def test_auto_on_a_grouped_layer_picks_by_hand_computed_prices():
    """x (4, 8, 8, 8) -> y (4, 16, 8, 8), groups=2 on channel=4: each group spans 2 ranks.  With
    kernels free, grouped-x moves y and dy (4*8*64*4 B) over 2 ranks, grouped-y x and dx (4*4*64*4 B):
    1 step of 2e-5 s and half the bytes at 1e-9 s/B each, twice."""
    algorithm, p_f, table = choose_for_layer((4, 8, 8, 8), 16, (3, 3), grid_shape=(1, 4, 1, 1), padding=(1, 1),
                                             groups=2, machine=free_compute_machine())
    assert table == pytest.approx({("grouped-x", None): 2 * (2e-5 + 4 * 8 * 64 * 4 / 2 * 1e-9),
                                   ("grouped-y", None): 2 * (2e-5 + 4 * 4 * 64 * 4 / 2 * 1e-9)}, rel=1e-9)
    assert (algorithm, p_f) == ("grouped-y", None)
