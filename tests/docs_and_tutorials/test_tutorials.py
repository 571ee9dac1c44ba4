"""The course runs: every tutorials/NN_*.py notebook, headless, top to bottom.

A tutorial is a jupytext percent-format notebook and also a plain Python script:
each runs here in a subprocess, in a temporary folder, with matplotlib's Agg
backend.  A failing cell (an exception, or one of the asserts each tutorial ends
with) fails the test.  A multi-rank cell is a function of ``comm`` run on
simulated ranks (``refconv.simulated.run``), never a script in a string; one
cell of each such tutorial runs the same function under mpiexec
(``course.under_mpiexec``).  ``make tutorials`` runs the same.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys
import time
import types

import matplotlib
import matplotlib.figure
import numpy
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
    # run as a script, a tutorial saves its figures (course.show) and says where, under the folder it ran in
    saved = re.findall(r"^figure saved: (.+\.png)$", proc.stdout, flags=re.M)
    assert saved, f"{notebook.name} saved no figure:\n{output}"
    for path in saved:
        assert (tmp_path / path).is_file() and (tmp_path / path).stat().st_size > 0, f"{notebook.name}: no {path}"
        assert pathlib.Path(path).name.startswith(notebook.stem + "-"), path
    if number == 3:   # the job file under its heading, apart from the other output
        heading = proc.stdout.index("--- job.py, the file course.under_mpiexec writes for sample_parallel")
        assert heading < proc.stdout.index("def sample_parallel") < proc.stdout.index("--- end of job.py ---")
    print(f"{notebook.name}: {time.perf_counter() - start:.1f} s")


def triple_quoted_strings(source):
    """Line numbers of the triple-quoted string literals in ``source``, docstrings left out: the form
    a script for another process takes (a ``SCRIPT`` string that a helper launched)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in docstrings
                   and re.match(r"[rbfuRBFU]{0,2}('''|\"\"\")", ast.get_source_segment(source, node) or "")})


def test_a_script_in_a_string_is_found():
    """The check below would see the form the tutorials had before refconv.simulated."""
    old = 'x = 1\nSCRIPT = f"""\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"""\njob = course.run_on_ranks(SCRIPT)\n'
    assert triple_quoted_strings(old) == [2]
    assert triple_quoted_strings("S = r'''import refconv'''\n") == [1]
    docstring = 'def f(comm):\n    """A docstring\n    on two lines."""\n    return ("one"\n            f"line {comm}")\n'
    assert triple_quoted_strings(docstring) == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_multi_rank_code_in_strings(notebook):
    """Multi-rank code is ordinary cells (functions of comm), which a learner can read, edit and step through."""
    text = notebook.read_text()
    assert triple_quoted_strings(text) == [], f"{notebook.name}: a triple-quoted string (a script?) at these lines"
    assert "run_on_ranks" not in text and "MPI.COMM_WORLD" not in text, notebook.name


UNDER_MPIEXEC = {3, 4, 5, 8, 9, 10}  # the tutorials that show a function of theirs under mpiexec too


def test_multi_rank_tutorials_run_on_simulated_ranks_and_once_under_mpiexec():
    """As tutorials/README.md says: which tutorials show a function under mpiexec, one cell each."""
    calls = {int(nb.name[:2]): nb.read_text() for nb in NOTEBOOKS}
    simulated = {n for n, text in calls.items() if re.search(r"simulated\.run\(|layer_job\.run\(", text)}
    assert simulated == {3, 4, 5, 6, 7, 8, 9, 10}
    assert {n: text.count("course.under_mpiexec(") for n, text in calls.items() if n in UNDER_MPIEXEC or
            "course.under_mpiexec(" in text} == {n: 1 for n in UNDER_MPIEXEC}
    readme = " ".join((TUTORIALS / "README.md").read_text().split())
    listed = ", ".join(map(str, sorted(UNDER_MPIEXEC)[:-1])) + f" and {max(UNDER_MPIEXEC)}"
    assert readme.count(f"Tutorials {listed} also run") == 1 and f"tutorials {listed} runs the same function" in readme


@pytest.fixture
def course(monkeypatch):
    monkeypatch.syspath_prepend(str(TUTORIALS))
    import course
    return course


def fails_on_rank_one(comm):
    if comm.rank == 1:
        raise ValueError("rank one fails")
    return comm.rank


@pytest.mark.mpi
def test_under_mpiexec_reports_a_failing_rank(course):
    with pytest.raises(RuntimeError, match="rank one fails"):
        course.under_mpiexec(fails_on_rank_one, ranks=2, timeout=60, show=False)


NOTEBOOK = """
import numpy
import course
from refconv import collectives, simulated

SCALE = 10.0


class Doubler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


def scaled(comm):
    return comm.rank * SCALE


def sums_with_helpers(comm, base, times=1):
    mine = numpy.full(2, Doubler(base).apply(scaled(comm)))
    return {"rank": comm.rank, "total": float(collectives.allreduce(comm, mine)[0]) * times}


expected = simulated.run(sums_with_helpers, 3, args=(2.0,), kwargs={"times": 3})
assert [r["rank"] for r in expected] == [0, 1, 2] and expected[0]["total"] == (0 + 1 + 2) * 10.0 * 2.0 * 3
real = course.under_mpiexec(sums_with_helpers, ranks=3, args=(2.0,), kwargs={"times": 3}, show=False)
assert real == expected, (real, expected)
print("the same results under mpiexec")
"""


@pytest.mark.mpi
def test_under_mpiexec_returns_what_simulated_ranks_return(tmp_path):
    """A notebook's function under mpiexec: the job rebuilds the notebook's helper function and class
    from their source, a module and a constant, and every rank returns what its simulated twin did."""
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    env = dict(_env(), PYTHONPATH=os.pathsep.join(filter(None, [str(TUTORIALS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0 and "the same results under mpiexec" in proc.stdout, proc.stdout + proc.stderr


TABLE = numpy.arange(3.0)


def uses_an_array(comm):
    return TABLE[comm.rank]


def test_under_mpiexec_refuses_a_global_it_cannot_rebuild(course):
    with pytest.raises(TypeError, match="global 'TABLE', a ndarray .* pass it in args"):
        course.job_source(uses_an_array)


def test_show_saves_a_script_figure_where_refconv_figures_says(course, tmp_path, monkeypatch, capsys):
    matplotlib.use("Agg")
    monkeypatch.setenv("REFCONV_FIGURES", str(tmp_path / "out"))
    monkeypatch.setattr(sys, "argv", ["05_stationary_x.py"])
    monkeypatch.delitem(sys.modules, "__main__")          # a script's name comes from argv then
    fig = matplotlib.figure.Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    path = course.show(fig, "Bytes per rank")
    assert path == tmp_path / "out" / "05_stationary_x-bytes-per-rank.png" and path.is_file()
    assert capsys.readouterr().out == f"figure saved: {path}\n"
    with pytest.raises(ValueError, match="show: name must have a letter or digit"):
        course.show(fig, "--")


def test_show_leaves_a_jupyter_figure_inline(course, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: object()))
    assert course.show(object(), "anything") is None      # no savefig called on it
    assert capsys.readouterr().out == "" and not (tmp_path / "figures").exists()
