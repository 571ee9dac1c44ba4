"""Helpers of the exercises' tests (tests/docs_and_tutorials/test_exercise*.py): a check with its report
collected, and a solution with a mistake planted in it."""

import pathlib

from tutorials.exercises import harness  # the course is installed with refconv (pyproject.toml)

ROOT = pathlib.Path(__file__).resolve().parents[1]

CI = "exercises-ci"  # the Hypothesis profile the tests draw with (their files set it, autouse)


def quiet(number, **kwargs):
    """Exercise ``number`` checked with its report's lines collected (never the learner's own file: a test
    gives ``module``, ``solution`` or ``skeleton``)."""
    assert {"module", "solution", "skeleton"} & set(kwargs), "a test never checks the checkout's own file"
    lines = []
    result = harness.check(number, out=lines.append, progress=False, **kwargs)
    assert "\n".join(lines) == result.report
    return result


def planted(number, old, new):
    """Exercise ``number``'s solution with ``old`` replaced by ``new`` (which must occur once)."""
    source = harness.path_of(number, solution=True).read_text()
    assert source.count(old) == 1, f"{old!r} is not in solution {number} once"
    return harness.module_from_source(source.replace(old, new), f"planted_{number:02d}.py", "planted")
