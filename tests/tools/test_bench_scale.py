"""``python -m refconv.bench.scale``: both tables and their ratios in one run, and one line for bad input."""

import pytest

from refconv.bench import scale


def test_scale_prints_the_simulator_and_binding_tables_with_ratios(capsys):
    assert scale.main(["--ranks", "16,64", "--allreduces", "2", "--sample", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["16", "64", "64"]                    # simulator 16, 64; binding 64
    assert all(float(x) >= 0 for r in rows[:2] for x in r[1:3]) and float(rows[2][1]) > 0
    # the ratio lines; a ratio itself is left out where a side measured 0 CPU (2 allreduces against none,
    # on a loaded machine), as the next test checks
    assert "  free     ratios" in out and "  stepped  ratios" in out and "  binding  ratios" in out


def test_the_ratios_are_of_neighbouring_sizes_and_a_zero_is_left_out(monkeypatch, capsys):
    monkeypatch.setattr(scale, "simulator_cost", lambda k, n, stepped, repeats: (2.0 if stepped else 1.0) * k * 1e-6)
    monkeypatch.setattr(scale, "binding_cost", lambda k, sample, repeats: 0.0 if k == 64 else 1e-3)
    scale.run([16, 64, 256], 2, 2, out=print)
    out = capsys.readouterr().out
    assert "  free     ratios 64/16: 4.00  256/64: 4.00" in out and "  stepped  ratios 64/16: 4.00  256/64: 4.00" in out
    assert "  binding  ratios \n" in out          # 64 measured 0: no ratio, not a division by zero


@pytest.mark.parametrize("ranks", ["12", "16,x", "2048"])
def test_bad_ranks_are_refused_with_status_2(ranks, capsys):
    with pytest.raises(SystemExit) as exit_:
        scale.main(["--ranks", ranks])
    assert exit_.value.code == 2 and "--ranks" in capsys.readouterr().err
