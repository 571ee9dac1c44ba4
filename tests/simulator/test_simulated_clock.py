"""The logical clock of a priced simulated run (refconv.simulated.clock), against hand-worked
prices and against the planner's prediction for the same grid and machine file."""

import numpy
import pytest

from refconv import collectives, simulated
from refconv.pricing import machine as machine_mod
from refconv.commands.simulate_steps import run_steps
from refconv.pricing.search import Planner, to_spec
from refconv.simulated import clock as clock_mod
from refconv.train import load_model_spec

MACHINE = machine_mod.load("v100-edr")


def allreduce_seconds(nbytes, ranks):
    return MACHINE.call_seconds("allreduce", ranks, nbytes)


def test_a_blocking_call_starts_when_its_last_rank_posts_it():
    def body(comm):
        clock_mod.current().charge("compute", 1e-3 * comm.rank)   # rank r arrives r ms late
        collectives.allreduce(comm, numpy.ones(1000))
        return clock_mod.current().t
    times = [t for t, _ in simulated.run(body, 3, machine=MACHINE)]
    assert times == pytest.approx([2e-3 + allreduce_seconds(8000, 3)] * 3, rel=1e-12)


def test_a_nonblocking_call_hides_behind_the_compute_after_it():
    cost = allreduce_seconds(80_000, 2)

    def body(comm, compute):
        request = collectives.iallreduce_(comm, numpy.ones(10_000), overlap="compute")
        clock_mod.current().charge("compute", compute)
        request.wait()
        return clock_mod.current().t

    for compute, hidden in ((cost / 2, cost / 2), (2 * cost, cost)):
        results = simulated.run(body, 2, args=(compute,), machine=MACHINE)
        for t, clock in results:
            assert t == pytest.approx(max(compute, cost), rel=1e-12)
            calls = clock_mod.report([clock])[0]["calls"]["allreduce"]
            assert calls["hidden"] == pytest.approx(hidden, rel=1e-9)
            assert calls["waited"] == pytest.approx(cost - hidden, rel=1e-9, abs=1e-15)


def test_calls_on_one_rank_queue_on_its_link():
    cost = allreduce_seconds(8000, 2)

    def body(comm):
        first = collectives.iallreduce_(comm, numpy.ones(1000))
        second = collectives.iallreduce_(comm, numpy.ones(1000))
        second.wait()
        first.wait()
        return clock_mod.current().t
    assert [t for t, _ in simulated.run(body, 2, machine=MACHINE)] == pytest.approx([2 * cost] * 2, rel=1e-12)


def clocked(batch, grid, overlap):
    """digits-cnn on ``grid`` for every layer, 4 ranks of v100-edr, 16x16 (``refconv simulate``'s steps):
    ``(plan, ranks)``, the planner's Plan and each rank's two steps (the first binds the model)."""
    spec, shape = load_model_spec("digits-cnn"), (batch, 1, 16, 16)
    plan = Planner(spec, shape, 4, MACHINE).uniform(grid)
    return plan, run_steps(to_spec(spec, plan), 4, shape, MACHINE, 2, overlap=overlap)


def test_a_priced_run_gives_the_same_times_every_run():
    def step():
        return [[(s["seconds"], s["kinds"]) for s in r["steps"]] for r in clocked(16, (2, 2, 1, 1), True)[1]]
    assert step() == step()


def test_the_clock_agrees_with_refconv_plan_within_20_percent():
    """The issue's bar, on one grid: digits-cnn, batch 64 on sample=2 x channel=2 of v100-edr.  The
    step blocking and overlapped, and what overlap hides, each within 20% of the planner's."""
    plan, blocking = clocked(64, (2, 2, 1, 1), False)
    _, overlap = clocked(64, (2, 2, 1, 1), True)
    clock = {name: max(r["steps"][1]["seconds"] for r in ranks) for name, ranks in
             (("blocking", blocking), ("overlap", overlap))}
    clock["hidden"] = clock["blocking"] - clock["overlap"]
    planned = {"blocking": plan.seconds, "overlap": plan.overlapped_seconds}
    planned["hidden"] = planned["blocking"] - planned["overlap"]
    for name in ("blocking", "overlap", "hidden"):
        assert clock[name] == pytest.approx(planned[name], rel=0.2), (name, clock, planned)
    assert sum(r["steps"][1]["kinds"]["allreduce"]["hidden"] for r in overlap) > 0


def test_the_clock_is_only_for_a_priced_run():
    with pytest.raises(RuntimeError, match="not on a rank of a priced run"):
        simulated.run(lambda comm: clock_mod.current(), 1)
