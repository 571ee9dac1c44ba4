"""``python -m refconv.bench.torch_step``: ``profile``'s split of a step into layers and convolution
passes, and ``passes``' im2col contender (the tap rule's other side)."""

import subprocess
import sys
import time
import types
from unittest import mock

import numpy
from mpi4py import MPI

from refconv.bench import timing, torch_step
from refconv.bench.torch_step import _part_times, refconv_step_of
from refconv.reference import conv_taps


def test_part_times_name_every_layer_and_pass_and_sum_to_the_step():
    step, model, _, _ = refconv_step_of("digits-cnn", 4, MPI.COMM_SELF)
    parts, per_step = _part_times(model, step, rounds=1)
    layers = [f"layer {name} {type(layer).__name__} {way}" for name, layer in model.named_layers()
              for way in ("forward", "backward")]
    convs = [f"layer {name} DistConv2d {way}:  {p}" for name, layer in model.named_layers()
             if type(layer).__name__ == "DistConv2d"
             for way, p in [("forward", "forward"), ("backward", "backward-data"), ("backward", "backward-filter")]]
    assert sorted(parts) == sorted(layers + convs + ["rest (loss, optimizer, data)"])
    assert all(seconds >= 0 for seconds in parts.values())
    assert abs(sum(s for part, s in parts.items() if ":" not in part) - per_step) < 1e-9 * max(1.0, per_step)
    # the wrappers are gone afterwards: the layers' and the backend's own methods again
    assert all("forward" not in layer.__dict__ and "backward" not in layer.__dict__
               for _, layer in model.named_layers())
    backend = model.body.layers[0].backend
    assert not set(torch_step.CONV_PASSES) & set(vars(backend))


def test_passes_im2col_contender_is_refconvs_pass_with_the_tap_rule_off():
    """``passes``' im2col contender gives refconv's answers through im2col where the rule takes taps
    (so ``im2col / refconv`` is what the tap path gains), and leaves the rule as it found it."""
    torch = types.SimpleNamespace(from_numpy=lambda a: a)  # torch's contenders are built, never called
    fns = torch_step.pass_contenders(16, 16, 6, 3, 1, 1, 2, torch)  # C=F=16, 6x6, 3x3, padding 1: taps
    names = {"forward": "forward", "backward-data": "backward_data", "backward-filter": "backward_filter"}
    for p in torch_step.PASSES:
        with mock.patch.object(conv_taps, names[p], wraps=getattr(conv_taps, names[p])) as tap_pass:
            ours = fns["refconv"][p]()
            assert tap_pass.call_count == 1
            theirs = fns["im2col"][p]()
            assert tap_pass.call_count == 1  # im2col did not take the tap path
        numpy.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)
    assert conv_taps.takes_taps((2, 16, 6, 6), (16, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1, (6, 6))


def test_compare_on_the_cpu_clock_leaves_out_waiting():
    """``timing.compare(clock=time.process_time)`` (``step --cpu-time``): a sleep costs no CPU."""
    contenders = {"sleep": lambda: time.sleep(0.02)}
    time.sleep(0.3)  # process_time counts every thread: let OpenBLAS's threads stop spinning after earlier tests
    wall = timing.compare(contenders, rounds=2, warmup=0, pause=0)["sleep"]
    cpu = timing.compare(contenders, rounds=2, warmup=0, pause=0, clock=time.process_time)["sleep"]
    assert wall.min >= 0.02 and cpu.max < wall.min / 2, (wall, cpu)


def test_cpu_time_outside_a_one_rank_step_is_one_line_and_status_2():
    r = subprocess.run([sys.executable, "-m", "refconv.bench.torch_step", "memory", "--cpu-time"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines() == ["--cpu-time: only with step, passes, passes3d on one rank, not memory on 1: "
                                     "drop it, or run without mpiexec"], r.stderr
