"""One way to import the course (issue 41, point 2): ``from tutorials.exercises import check`` and
``python -m tutorials.exercises`` work with the venv's python started from the repository root, from
tutorials/ and from tutorials/exercises/, because the editable install maps ``tutorials`` to this
checkout (pyproject.toml's package-dir).  No PYTHONPATH: a notebook's kernel has none."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ["", "tutorials", "tutorials/exercises"]


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f or "the root")
def test_the_exercises_import_from(folder):
    done = _run(["-c", "import tutorials.exercises as e; from tutorials.exercises import check, EXERCISES; "
                       "print(len(EXERCISES)); print(e.__file__)"], ROOT / folder)
    assert done.returncode == 0, done.stderr
    count, where = done.stdout.split()
    assert count == "13"
    assert pathlib.Path(where) == ROOT / "tutorials/exercises/__init__.py"   # this checkout, the learner's files


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f or "the root")
def test_the_exercise_command_runs_from(folder):
    done = _run(["-m", "tutorials.exercises", "list"], ROOT / folder)
    assert done.returncode == 0, done.stderr
    assert "stationary_x" in done.stdout


def test_course_is_a_module_of_the_package_too():
    done = _run(["-c", "import tutorials.course as c; print(c.__file__)"], ROOT / "tutorials/exercises")
    assert done.returncode == 0, done.stderr
    assert pathlib.Path(done.stdout.strip()) == ROOT / "tutorials/course.py"
