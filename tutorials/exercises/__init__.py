"""The exercises of the course, each with a checker: ``python -m tutorials.exercises check N``.

Exercise ``N`` is four files here: its page ``NN_slug.md`` (the problem and hints), its
skeleton ``skeletons/NN_slug.py`` (the parts to write call :func:`todo`), a reference solution
in ``solutions/NN_slug.py``, and its checker in ``checkers/NN_slug.py``.  Yours, ``NN_slug.py``
here, is copied from the skeleton on first use (git ignores it).  From a notebook::

    from tutorials.exercises import check
    check(5)                       # your tutorials/exercises/05_stationary_x.py
    check(5, solution=True)        # the reference solution, with its score

README.md lists the exercises; :mod:`.harness` says what a check runs and prints.
"""

import os

# the kernel puzzle runs Numba's CUDA simulator unless told otherwise: set before numba is imported
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from tutorials.exercises.harness import EXERCISES, NotWritten, check, todo  # noqa: E402

__all__ = ["EXERCISES", "NotWritten", "check", "todo"]
