"""python -m refconv.bench.call_record on one process: it runs and prints its ratio and its prediction
(the figures themselves come from mpiexec -n 2, docs/benchmarks.md)."""

import re

import pytest

from refconv.bench import call_record


@pytest.mark.extended      # builds and steps a model: issue 43's 60 s in make test go to test_hangs
def test_the_benchmark_prints_the_ratio_and_the_prediction(capsys):
    call_record.main(["--grid", "sample=1", "--rounds", "1", "--batch", "4", "--pause", "0"])
    out = capsys.readouterr().out
    assert re.search(r"step: record on / off = \d+\.\d{3}x", out), out
    assert re.search(r"one entry alone: \d+\.\d+ us, 0 entries a step -> predicted \+0\.00% of a step", out), out
