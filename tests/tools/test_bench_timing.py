"""refconv.bench.timing: rounds alternate, spans and ratios are per round, outputs are checked."""

import types

import numpy
import pytest
from threadpoolctl import threadpool_limits

from refconv import threads
from refconv.bench import apart, timing, torch_step
from refconv.reference import conv as ref_conv


def test_contenders_alternate_and_the_first_rotates():
    calls = []
    spans = timing.compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
                            "c": lambda: calls.append("c")}, rounds=3, warmup=1, pause=0)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")  # warm-up, then 3 rounds
    assert {k: len(s.values) for k, s in spans.items()} == {"a": 3, "b": 3, "c": 3}


def test_progress_is_told_after_each_round():
    events = []
    timing.compare({"a": lambda: events.append("a"), "b": lambda: events.append("b")}, rounds=3, warmup=0,
                   pause=0, progress=lambda done: events.append(done))
    assert events == ["a", "b", 1, "b", "a", 2, "a", "b", 3]


def test_calls_per_sample_and_sync():
    events = []
    spans = timing.compare({"a": lambda: events.append("a")}, rounds=2, warmup=0, pause=0, calls=3,
                           sync=lambda: events.append("sync"))
    assert events == ["sync", "a", "a", "a", "sync"] * 2
    assert len(spans["a"].values) == 2


def test_calls_and_settle_per_contender():
    events = []
    timing.compare({"a": lambda: events.append("a"), "b": lambda: events.append("b")}, rounds=1, warmup=0,
                   pause=0, calls={"a": 2, "b": 1}, settle={"a": 1, "b": 0}, sync=lambda: events.append("|"))
    assert events == ["a", "|", "a", "a", "|", "|", "b", "|"]  # a: one untimed call, then two timed


def test_span_and_ratio():
    s = timing.Span((0.003, 0.001, 0.002))
    assert (s.min, s.median, s.max) == (0.001, 0.002, 0.003)
    assert s.format() == "2.0 ms (1.0-3.0)"
    spans = {"ours": timing.Span((1.0, 2.0, 4.0)), "theirs": timing.Span((2.0, 2.0, 2.0))}
    r = timing.ratio(spans, "theirs", "ours")
    assert r.values == (2.0, 1.0, 0.5) and r.median == 1.0
    with pytest.raises(ValueError, match="one compare"):
        timing.ratio({"a": timing.Span((1.0,)), "b": timing.Span((1.0, 2.0))}, "a", "b")


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="rounds >= 1"):
        timing.compare({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="contenders"):
        timing.compare({})


def test_check_catches_a_wrong_answer():
    good = numpy.arange(6.0).reshape(2, 3)
    timing.check({"ref": good, "same": good + 1e-15, "pair": good}, "ref")
    timing.check({"ref": (good, good), "ours": (good, good.copy())}, "ref")
    with pytest.raises(AssertionError, match="wrong vs ref"):
        timing.check({"ref": good, "wrong": good * 1.01}, "ref")
    with pytest.raises(ValueError, match="reference"):
        timing.check({"a": good}, "b")


def test_torch_comparison_runs_and_checks_first(capsys):
    # Needs PyTorch (not a dependency): skipped, and reported as skipped, where it is missing.
    pytest.importorskip("torch")

    assert torch_step.main(["passes", "--quick", "--rounds", "1"]) == 0
    assert torch_step.main(["passes3d", "--quick", "--rounds", "1"]) == 0
    assert torch_step.main(["step", "--model", "digits-cnn", "--batch", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("geometric mean vs torch, backward-filter") == 2
    assert "quick3d    backward-filter" in out
    assert "digits-cnn batch 4: first loss refconv" in out


@pytest.mark.parametrize("shape", [(4, 6, 5, 3, 1, 1), (3, 2, 7, 3, 2, 0), (5, 4, 6, 1, 1, 0)])
def test_gemm_floor_contender_is_the_pass_product(shape):
    # `passes`' GEMM contender must do the pass's own arithmetic, or its floor means nothing:
    # its products, laid back out, are refconv's forward and backward-filter, and backward-data's
    # columns, which col2im turns into dx.  torch's contenders are built but never called, so a
    # stand-in for torch lets this run without it.
    torch = types.SimpleNamespace(from_numpy=lambda a: a)

    C, F, H, K, stride, padding = shape
    N = 2
    fns = torch_step.pass_contenders(C, F, H, K, stride, padding, N, torch)
    gemm, mine = fns["GEMM"], fns["refconv"]
    y, dx, dw = (mine[p]() for p in torch_step.PASSES)
    Ho = y.shape[2]
    y_gemm = gemm["forward"]().reshape(F, N, Ho, Ho).transpose(1, 0, 2, 3)
    numpy.testing.assert_allclose(y_gemm, y, rtol=1e-5, atol=1e-5)
    numpy.testing.assert_allclose(gemm["backward-filter"]().reshape(F, C, K, K), dw, rtol=1e-5, atol=1e-5)
    dcols = gemm["backward-data"]().reshape(C, K, K, N, Ho, Ho).transpose(3, 0, 1, 2, 4, 5)
    numpy.testing.assert_allclose(ref_conv.col2im(dcols, dx.shape, (stride,) * 2, (padding,) * 2, (1, 1)), dx,
                                  rtol=1e-5, atol=1e-5)


def test_the_frameworks_apart_are_timed_each_in_its_own_process(capsys):
    """``refconv.bench.apart``: every shape and pass of both frameworks and of the GEMM alone, each
    timed in a process of its own (the refconv and GEMM processes never import torch: the bench
    refuses otherwise)."""
    pytest.importorskip("torch")
    assert apart.main(["--quick", "--rounds", "1", "--repeat", "1", "--dims", "2"]) == 0
    out = capsys.readouterr().out
    assert "each framework alone in its own process (1 x 1 timings)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("quick")]
    assert sorted((r[0], r[1]) for r in rows) == sorted((s, p) for s in ("quick3x3", "quick1x1")
                                                        for p in torch_step.PASSES)
    assert all(len(r) == 13 and float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)  # 3 spans, 2 ratios
    assert out.count("geometric mean vs torch") == 3 and out.count("(the GEMM alone: ") == 3


def test_apart_refuses_an_unknown_shape_in_one_line():
    with pytest.raises(SystemExit, match=r"--shapes: unknown \['nope'\] for --dims 3"):
        apart.main(["--shapes", "nope"])


def test_contenders_pause_only_when_a_thread_pool_of_the_process_can_spin():
    """``compare``'s default pause: none with one thread a pool (``make test`` sets OMP_NUM_THREADS=1),
    ``PAUSE`` when BLAS may keep a second thread spinning after a call."""
    with threadpool_limits(1):
        assert set(threads.current().values()) == {1}
        assert timing.spin_pause() == 0.0
    with threadpool_limits(2):
        assert max(threads.current().values()) == 2
        assert timing.spin_pause() == timing.PAUSE
