"""``refconv sweep`` and ``refconv plot``: the scaling arithmetic on made-up lines, the
launch commands, and bad input.  The end-to-end run (real ranks, real PNGs) is the
docs page's own commands, in tests/docs_and_tutorials/test_cluster_docs.py."""

import argparse
import json
import subprocess
import sys

import pytest

from refconv.commands import plot, sweep
from refconv.bench.common import parse_shape

TIMEOUT = 120


def line(ranks, strategy, seconds, scaling="strong", comm=None, bench="layer"):
    """A results line with only the fields series() and breakdown() read."""
    config = {"ranks": ranks, "sweep": {"id": "x", "scaling": scaling, "strategy": strategy},
              "shape": {"name": "wide"}, "model": "digits-cnn"}
    return {"bench": bench, "config": config, "seconds": comm or {}, "seconds_total": seconds,
            "passes": {sweep.MAIN_PASS[bench]: {"median": seconds}}}


def test_strong_scaling_speedup_and_efficiency():
    table = sweep.series([line(1, "sample", 8.0), line(2, "sample", 5.0), line(4, "sample", 4.0)])
    rows = table[("strong", "layer", "wide", "sample")]
    assert [(r["ranks"], r["speedup"], r["efficiency"]) for r in rows] == [(1, 1.0, 1.0), (2, 1.6, 0.8),
                                                                         (4, 2.0, 0.5)]


def test_weak_scaling_efficiency_and_scaled_speedup():
    table = sweep.series([line(1, "stationary-x", 2.0, "weak"), line(4, "stationary-x", 2.5, "weak")])
    [one, four] = table[("weak", "layer", "wide", "stationary-x")]
    assert (one["efficiency"], four["efficiency"], four["speedup"]) == (1.0, 0.8, 3.2)


def test_series_keep_strategies_apart_and_the_latest_line_wins():
    table = sweep.series([line(1, "sample", 8.0), line(2, "sample", 9.0), line(2, "sample", 4.0),
                          line(2, "stationary-y", 6.0), {"bench": "kernels", "config": {"ranks": 1}}])
    assert set(table) == {("strong", "layer", "wide", "sample"), ("strong", "layer", "wide", "stationary-y")}
    assert table[("strong", "layer", "wide", "sample")][1]["speedup"] == 2.0
    [base] = table[("strong", "layer", "wide", "stationary-y")]  # its own base: 2 ranks, taken as ideal
    assert (base["speedup"], base["efficiency"]) == (2.0, 1.0)


def test_breakdown_splits_the_step_and_compute_is_the_rest():
    parts = plot.breakdown(line(2, "stationary-x", 10.0, comm={"allgather": 2.0, "reduce_scatter": 3.0,
                                                                "alltoallv": 1.0, "halo": 0.5}))
    assert parts == {"compute": 3.5, "allreduce": 0.0, "reduce-scatter": 3.0, "allgather": 2.0, "halo": 0.5,
                     "shuffle": 1.0, "other collectives": 0.0}


def _args(**kw):
    defaults = dict(ranks="1,2,4", strategies="sample,spatial,stationary-w", scaling="weak", bench="layer",
                    shape=parse_shape("wide"), model="digits-cnn", batch=8, dtype="float32", repeat=3, warmup=1,
                    backend="auto", out="r.jsonl", launcher="mpiexec", ranks_per_node=None)
    return argparse.Namespace(**{**defaults, **kw})


def test_plan_builds_each_point():
    points = sweep.plan(_args())
    assert [(P, s) for P, s, _ in points] == [(P, s) for P in (1, 2, 4) for s in ("sample", "spatial", "stationary-w")]
    _, _, four_w = points[-1]
    assert four_w[four_w.index("--grid") + 1] == "channel=4" and four_w[four_w.index("--batch") + 1] == "32"
    assert json.loads(four_w[four_w.index("--sweep") + 1])["scaling"] == "weak"
    _, _, one = points[0]
    assert one[one.index("--grid") + 1] == "sample=1"
    strong = sweep.plan(_args(scaling="strong"))
    assert {p[2][p[2].index("--batch") + 1] for p in strong} == {"8"}
    srun = sweep.launch_command("srun", 4, ["layer"], "--gpus-per-task=1")
    assert srun[:4] == ["srun", "-n", "4", "--gpus-per-task=1"] and srun[-2:] == ["refconv.bench", "layer"]
    # --ranks-per-node: srun -N ceil(P / N), so ranks fill one node before the next
    assert [sweep.launch_command("srun", P, ["layer"], "", 4)[:5] for P in (1, 4, 5, 8)] == [
        ["srun", "-N", str(nodes), "-n", str(P)] for P, nodes in ((1, 1), (4, 1), (5, 2), (8, 2))]


@pytest.mark.parametrize("bad, message", [
    (dict(strategies="sample,diagonal"), "--strategies: unknown ['diagonal']"),
    (dict(ranks="1,two"), "--ranks: expected rank counts like 1,2,4"),
    (dict(ranks_per_node=4), "--ranks-per-node: only with --launcher srun"),
    (dict(ranks_per_node=0, launcher="srun"), "--ranks-per-node: expected a positive int, got 0"),
])
def test_bad_sweep_arguments_fail_before_any_launch(bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.plan(_args(**bad))


def refconv(*args, cwd):
    return subprocess.run([sys.executable, "-m", "refconv.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd)


def test_plot_of_a_file_that_is_not_json_lines_is_one_line_and_status_2(tmp_path):
    (tmp_path / "r.jsonl").write_text("this is not JSON\n")
    result = refconv("plot", "r.jsonl", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "refconv plot: error: r.jsonl:1: not a JSON line (Expecting value); expected the output of refconv bench "
        "--out or refconv sweep"], result.stderr


def test_sweep_with_an_unknown_strategy_exits_2(tmp_path):
    result = refconv("sweep", "--strategies", "diagonal", cwd=tmp_path)
    assert result.returncode == 2 and "--strategies: unknown ['diagonal']" in result.stderr
    assert not (tmp_path / "results.jsonl").exists()  # nothing was launched
