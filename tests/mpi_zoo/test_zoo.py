"""The MPI zoo in CI: the whole zoo against its baseline, the zoo's shape, and the runner's classifier
on planted programs (so the zoo cannot pass by classifying everything one way)."""

import collections
import json
import subprocess
import sys
import time
import warnings

import pytest

from refconv.checks import ArgumentError
from refconv.simulated import ResourceLeak, SimulatedError, Unsupported
from refconv.testing import mpirun

import zoo
from zoo_registry import CLASSES, PROGRAMS, VIAS, Program, WrongAnswer

HUNG_TIMEOUT = 2.0   # seconds for a program the baseline lists as hung: it is counted, not waited on for 10 s


def test_the_zoo_holds_its_baseline():
    """Fewer detected or named, or more false positives, crashes or hangs than baseline.json fails; the
    table is printed either way (``pytest -rP`` shows it on a pass)."""
    before = json.loads(zoo.BASELINE.read_text())
    verdicts = zoo.run_zoo(zoo.select(), slow=set(before["hung programs"]), slow_timeout=HUNG_TIMEOUT)
    report = f"{zoo.details(verdicts)}\n\n{zoo.table(verdicts)}\n(baseline: refconv/ as of commit {before['refconv commit']})"
    print(report)
    now = zoo.totals(verdicts)
    assert before["totals"]["programs"] == now["programs"], \
        f"the zoo has {now['programs']} programs, baseline.json {before['totals']['programs']}: rerun " \
        f"tests/mpi_zoo/zoo.py --write-baseline\n{report}"
    worse = zoo.regressions_by_class(verdicts, before)
    assert not worse, "the zoo got worse than baseline.json:\n" + "\n".join(worse) + "\n" + report


def test_the_docs_show_the_baseline():
    """docs/simulated-ranks.md's table is what ``zoo.py --markdown`` makes of baseline.json (STYLE.md, habit 13)."""
    page = (zoo.HERE.parent.parent / "docs" / "simulated-ranks.md").read_text()
    begin, end = page.index("<!-- mpi-zoo:begin"), page.index("<!-- mpi-zoo:end -->")
    shown = page[page.index("\n", begin) + 1:end].strip()
    assert shown == zoo.markdown(json.loads(zoo.BASELINE.read_text())), \
        "docs/simulated-ranks.md shows other figures than baseline.json: paste tests/mpi_zoo/zoo.py --markdown there"


@pytest.mark.extended
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_every_twin_is_correct_under_mpiexec(ranks):
    """The twins are correct MPI, not only what the simulated world accepts: each runs to its end under
    mpiexec (about 45 s for the four sizes on 2 cores, so in the extended set)."""
    command = [mpirun.find_mpiexec(), "-n", str(ranks), sys.executable, str(zoo.HERE / "twins_under_mpiexec.py")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=zoo.HERE)
    assert done.returncode == 0 and f"-n {ranks} " in done.stdout, done.stdout + done.stderr


def test_the_zoo_has_its_shape():
    """At least 100 incorrect programs, 8 a class; each at two world sizes or more; both raw calls and the
    wrappers in use; unique names."""
    per_class = collections.Counter(p.mbi_class for p in PROGRAMS)
    assert len(PROGRAMS) >= 100 and all(per_class[c] >= 8 for c in CLASSES), per_class
    assert all(len(p.ranks) >= 2 for p in PROGRAMS), [p.name for p in PROGRAMS if len(p.ranks) < 2]
    assert {p.via for p in PROGRAMS} == set(VIAS)
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)


@pytest.mark.parametrize("n, guilty", [(2, [0, 1]), (3, [0, 1, 2]), (4, [0, 2, 3]), (8, [0, 4, 7])])
def test_the_guilty_rank_is_first_middle_and_last(n, guilty):
    assert PROGRAMS[0].guilty_ranks(n) == guilty


# -- the classifier, on planted programs ----------------------------------------------------------------------
def planted(body, ranks=(2, 3), **options):
    return Program(f"planted.{body.__name__}", "Call Matching", body, {}, ranks, "raw", **options)


def raises(error):
    def body(comm, z):
        if z.mine(comm):
            raise error(z.guilty)
    body.__name__ = body.__qualname__ = f"raises_{error.__name__}"
    return body


def detected_naming(g):
    return SimulatedError(f"rank {g}: a planted error")


def detected_anonymously(g):
    return SimulatedError("a planted error that names no rank")


def refused_window(g):
    return Unsupported("simulated ranks: MPI.Win (one-sided communication) is not simulated")


def wrapper_refused_argument(g):
    return ArgumentError(f"allreduce on rank {g}: op must be one of ('sum', 'prod', 'max', 'min'), got 'mean'")


def crashed(g):
    return IndexError("list index out of range")


def wrapped_on_python_310(g):
    """What run raises for a rank's IndexError where exceptions have no notes: a SimulatedError from it."""
    error = SimulatedError(f"IndexError: list index out of range\non 2 simulated ranks:\n  rank {g}: raised IndexError")
    error.__cause__ = IndexError("list index out of range")
    return error


def wrong_answer(g):
    return WrongAnswer(f"rank {g}: got 0.0, sent 1.0")


def returns(comm, z):
    return comm.rank


def leaks(comm, z):
    if z.mine(comm):
        warnings.warn(f"rank {z.guilty}: communicator 'world/split 0' created at planted.py:1", ResourceLeak)


def computes_forever(comm, z):
    while z.mine(comm):
        time.sleep(0.01)


def warns_otherwise(comm, z):
    warnings.warn("a warning of another kind", UserWarning)


def errs_in_the_twin(comm, z):
    if not z.wrong and comm.rank == z.guilty:
        raise SimulatedError(f"rank {z.guilty}: a correct program rejected")


def misses_at_three(comm, z):
    if z.mine(comm) and comm.size == 2:
        raise SimulatedError(f"rank {z.guilty}: caught at 2 ranks only")


@pytest.mark.parametrize("body, options, outcome, named, twin", [
    (raises(detected_naming), {}, "detected", True, "passed"),
    (raises(detected_anonymously), {}, "detected", False, "passed"),
    (raises(detected_naming), {"blame": False}, "detected", False, "passed"),
    (raises(refused_window), {"feature": "RMA"}, "refused", False, "passed"),
    (raises(refused_window), {}, "missed", False, "passed"),                   # a refusal not allowed is a miss
    (raises(refused_window), {"feature": "persistent"}, "missed", False, "passed"),   # of another feature, too
    (raises(wrapper_refused_argument), {}, "detected", True, "passed"),   # refconv's own argument check
    (raises(crashed), {}, "crashed", False, "passed"),
    (raises(lambda g: ValueError(f"rank {g}: a ValueError of no checker")), {}, "crashed", False, "passed"),
    (raises(wrapped_on_python_310), {}, "crashed", False, "passed"),
    (raises(wrong_answer), {}, "missed", False, "passed"),
    (returns, {}, "missed", False, "passed"),
    (leaks, {}, "detected", True, "passed"),
    (computes_forever, {}, "hung", False, "passed"),
    (warns_otherwise, {}, "missed", False, "false positive"),
    (errs_in_the_twin, {}, "missed", False, "false positive"),
    (misses_at_three, {}, "missed", False, "passed"),                          # a program is detected in every run
], ids=lambda v: getattr(v, "__qualname__", None) if callable(v) else None)
def test_the_classifier_on_a_planted_program(body, options, outcome, named, twin):
    ranks = (2,) if body is computes_forever else (2, 3)     # a hang costs its timeout: two runs of it
    verdict = zoo.judge(planted(body, ranks, **options), timeout=0.5)
    assert (verdict.outcome, verdict.named, verdict.twin) == (outcome, named, twin), \
        [(r.outcome, r.named, r.message) for r in verdict.runs + verdict.twin_runs]


def test_a_twin_refused_for_its_feature_is_not_a_false_positive():
    def refuses_always(comm, z):
        raise refused_window(z.guilty)
    verdict = zoo.judge(planted(refuses_always, feature="RMA"), timeout=0.5)
    assert (verdict.outcome, verdict.twin) == ("refused", "refused")
    totals = zoo.totals([verdict])
    assert (totals["recall"], totals["specificity"]) == (None, None)   # nothing left to score


def test_the_baseline_check_sees_each_regression():
    before = {"detected": 5, "named": 4, "false positives": 1, "crashed": 2, "hung": 0}
    assert zoo.regressions(dict(before), before) == []
    worse = dict(before, detected=4, named=3, **{"false positives": 2}, crashed=3, hung=1)
    assert len(zoo.regressions(worse, before)) == 5


def test_a_loss_in_one_class_is_not_hidden_by_a_gain_in_another():
    verdicts = [zoo.judge(planted(raises(detected_naming)), timeout=0.5)]   # one Call Matching program, detected
    baseline = zoo.baseline_of(verdicts)
    assert zoo.regressions_by_class(verdicts, baseline) == []
    baseline["per class"]["Call Matching"]["detected"] += 1        # as if it had caught one more there ...
    baseline["per class"]["Message Race"]["detected"] -= 1         # ... and one fewer elsewhere: same total
    assert zoo.regressions_by_class(verdicts, baseline) == ["Call Matching: detected 1 < baseline 2"]


def test_programs_known_to_hang_run_last_with_their_own_timeout():
    hangs, quick = planted(computes_forever, (2,)), planted(returns, (2,))
    verdicts = zoo.run_zoo([hangs, quick], timeout=60, slow={hangs.name}, slow_timeout=0.3)
    assert [(v.program.name, v.outcome) for v in verdicts] == [(quick.name, "missed"), (hangs.name, "hung")]
