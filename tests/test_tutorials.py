"""The course runs: every tutorials/NN_*.py notebook, headless, top to bottom.

A tutorial is a jupytext percent-format notebook and also a plain Python script:
each runs here in a subprocess, in a temporary folder, with matplotlib's Agg
backend.  A failing cell (an exception, or one of the asserts each tutorial ends
with) fails the test.  The multi-rank tutorials launch 4 MPI ranks themselves
(``tutorials/course.py``).  ``make tutorials`` runs the same.
"""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
TIMEOUT_S = 240
HEADER = "# ---\n# jupyter:\n#   jupytext:\n"


def _env():
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(name, "1")
    return env


def test_the_course_has_ten_tutorials():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{k:02d}" for k in range(1, 11)], [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_is_a_notebook_that_draws_and_checks(notebook):
    """jupytext header, markdown and code cells, a figure, and a last code cell that asserts."""
    text = notebook.read_text()
    assert text.startswith(HEADER) and "format_name: percent" in text, f"{notebook.name}: no jupytext header"
    cells = re.split(r"^# %%", text, flags=re.M)[1:]
    markdown = [c for c in cells if c.startswith(" [markdown]")]
    code = [c for c in cells if not c.startswith(" [markdown]")]
    assert markdown and code, f"{notebook.name}: expected markdown and code cells"
    assert re.search(r"plt\.subplots|course\.plot_bytes", text), f"{notebook.name} draws no figure"
    assert "assert " in code[-1] and "all checks passed" in code[-1], f"{notebook.name}: the last cell checks nothing"


@pytest.mark.mpi
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_runs_headless(notebook, tmp_path):
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(notebook)], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{notebook.name} did not finish in {TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{notebook.name} exited with {proc.returncode}:\n{output}"
    number = int(notebook.name[:2])
    assert f"tutorial {number}: all checks passed" in proc.stdout, output
    print(f"{notebook.name}: {time.perf_counter() - start:.1f} s")


@pytest.mark.mpi
def test_course_launcher_reports_a_failing_rank(tmp_path, monkeypatch):
    """course.run_on_ranks: a script that fails on one rank raises, with that rank's error in the message."""
    monkeypatch.syspath_prepend(str(TUTORIALS))
    import course

    script = "from mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n    raise ValueError('rank one fails')\n"
    with pytest.raises(RuntimeError, match="rank one fails"):
        course.run_on_ranks(script, ranks=2, timeout=60, show=False)
    job = course.run_on_ranks("import json, sys\njson.dump([1, 2], open(sys.argv[1] + '/result.json', 'w'))\n",
                              ranks=1, timeout=60, show=False)
    assert job.json() == [1, 2]
