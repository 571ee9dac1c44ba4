"""``refconv bench rank_step``: a tiny model at 4 ranks; each rank's categories are >= 0 and add up to
its total, the wrappers are gone afterwards, and the printed rows add up to the printed total."""

import types

from refconv import cli, collectives
from refconv.bench import rank_step, thread_cpu
from refconv.shapes.array import ShapeArray
from refconv.shapes.backend import ShapesBackend


def test_each_ranks_categories_are_not_negative_and_add_up_to_its_total():
    before = (ShapeArray.__add__, ShapesBackend.__dict__.get("relu_forward"), collectives.allreduce)
    _, spec, shape, machine = rank_step.planned("digits-cnn", 4, 8, 16)
    results, extra = rank_step.measure(spec, 4, shape, machine)
    assert (ShapeArray.__add__, ShapesBackend.__dict__.get("relu_forward"), collectives.allreduce) == before
    assert "bookkeeping" not in ShapesBackend.__dict__ and extra["wall_run"] > 0
    assert len(results) == 4
    for r in results:
        seconds = r["seconds"]
        assert set(seconds) <= {"backend", "collectives", "simulator", "pricing", "bookkeeping"}, seconds
        assert all(v >= 0 for v in seconds.values()) and r["total"] > 0
        assert abs(sum(seconds.values()) - r["total"]) < 1e-9, r
        assert all(seconds.get(c, 0) > 0 for c in ("backend", "collectives", "simulator")), seconds
        assert r["calls"] > 0
    # building and binding, per rank apart from the steps
    assert len(extra["build"]) == len(extra["bind"]) == 4 and all(t > 0 for t in extra["build"] + extra["bind"])


def test_a_call_inside_its_own_category_is_not_counted_again_and_the_outer_one_resumes():
    def inner():
        return sum(range(1000))

    def outer(depth):
        return wrapped.inner() + (wrapped.outer(depth - 1) if depth else 0)

    wrapped = types.SimpleNamespace(inner=inner, outer=outer)
    with thread_cpu.wrapped({"b": [(wrapped, ["inner"])], "a": [(wrapped, ["outer"])]}):
        thread_cpu.start()
        wrapped.outer(2)
        figures = thread_cpu.stop()
    assert wrapped.inner is inner and wrapped.outer is outer
    assert figures["calls"] == 4          # outer once (its recursion stays in "a"), inner three times
    assert set(figures["seconds"]) == {"a", "b", "bookkeeping"}
    assert abs(sum(figures["seconds"].values()) - figures["total"]) < 1e-9


def test_the_printed_rows_add_up_to_the_printed_total(capsys):
    assert cli.main(["bench", "rank_step", "--model", "digits-cnn", "--ranks", "4", "--batch", "8",
                     "--image-size", "16"]) == 0
    out = capsys.readouterr().out
    rows = {line[:26].strip(): line[26:].split() for line in out.splitlines()[2:] if line[:26].strip()}
    means = [float(rows[c][0]) for c in rank_step.CATEGORIES]
    assert all(m >= 0 for m in means) and float(rows["of which pricing"][0]) <= float(rows["simulator"][0])
    assert abs(sum(means) - float(rows["total"][0])) <= 0.005 * len(means) + 1e-9, out   # each rounded to 0.01 ms
    assert rows["must budget"][0] == "468.75" and rows["goal budget"][0] == "117.19"
    binding, = [line for line in out.splitlines() if line.startswith("building and binding the model")]
    assert binding.endswith(" s CPU") and "all 4 ranks: " in binding, binding


def test_profile_prints_the_functions_of_most_self_time(capsys):
    assert cli.main(["bench", "rank_step", "--model", "digits-cnn", "--ranks", "4", "--batch", "8",
                     "--image-size", "16", "--profile", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "the 3 functions of most self time" in lines[1] and len(lines) == 7, lines
    assert lines[-1].startswith("building and binding the model"), lines
    lines = lines[:-1]
    selfs = [float(line.split()[0]) for line in lines[3:]]
    assert selfs == sorted(selfs, reverse=True) and selfs[-1] >= 0


def test_a_bottom_category_keeps_what_it_calls_but_not_another_bottom_one():
    def leaf():
        return 1

    def under():
        return wrapped.leaf() + wrapped.priced()

    wrapped = types.SimpleNamespace(leaf=leaf, under=under, priced=leaf)
    with thread_cpu.wrapped({"backend": [(wrapped, ["leaf"])], "simulator": [(wrapped, ["under"])],
                             "pricing": [(wrapped, ["priced"])]}):
        thread_cpu.start(bottom=("simulator", "pricing"))
        wrapped.under()
        figures = thread_cpu.stop()
    assert figures["calls"] == 2 and "backend" not in figures["seconds"]     # under, then priced: leaf stays
    assert set(figures["seconds"]) == {"simulator", "pricing", "bookkeeping"}


def test_bind_only_builds_and_binds_and_runs_no_step(capsys):
    assert cli.main(["bench", "rank_step", "--model", "digits-cnn", "--ranks", "4", "--batch", "8",
                     "--image-size", "16", "--bind-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].startswith("the run (building and binding, threads)"), lines
    assert lines[2].startswith("building and binding the model") and "all 4 ranks: " in lines[2], lines
