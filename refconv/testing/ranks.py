"""pytest tests on simulated ranks (:mod:`refconv.simulated`): ``@on_ranks(sizes...)``.

Two shapes of test, one decorator::

    from refconv.testing.ranks import on_ranks

    @on_ranks(1, 2, 3, 4)
    def test_allreduce_sums(comm):                   # the body runs on every rank, as under mpiexec
        x = numpy.full(5, comm.rank + 1.0)
        collective_assert_close(comm, collectives.allreduce(comm, x), numpy.full(5, comm.size * (comm.size + 1) / 2))

    @on_ranks(2, 4)
    @given(st.data())
    def test_drawn(ranks, data):                     # Hypothesis draws here, once, in the test's thread
        case = data.draw(dist_conv_cases(ranks))
        simulated.run(lambda comm: check_layer(build(comm, case), case.problem), ranks)

A test whose first parameter is ``comm`` runs once per size on that many ranks, each rank calling
the body with its world communicator; other parameters are pytest fixtures, resolved once, in
the test's thread.  A test with a ``ranks`` parameter gets the size and calls
:func:`refconv.simulated.run` itself: the shape for Hypothesis, which must draw outside the rank
threads, so that one engine draws and shrinks each example and every rank runs the same one.

Each size is one pytest item (``test_x[4 ranks]``), marked ``simulated``: ``pytest -m simulated``
selects them.  A test on simulated ranks needs no mpiexec and no collective asserts to stay in
step: when a rank fails, the world releases the others and the test fails with the lowest
failing rank's exception and a note listing every rank's outcome.
"""

import functools
import inspect

import pytest

from refconv import simulated

TIMEOUT_S = 300.0  # a rank computing forever is no deadlock the world can see: the run's own limit


def on_ranks(*sizes, timeout=TIMEOUT_S, stepped=False):
    """Run the decorated test once per world size in ``sizes`` (see the module's docstring)."""
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= simulated.MAX_RANKS
                            for s in sizes):
        raise ValueError(f"on_ranks: sizes must be ints in [1, {simulated.MAX_RANKS}], got {sizes!r}")

    def decorate(test):
        params = list(inspect.signature(test).parameters)
        if params[:1] == ["comm"]:
            test = _on_every_rank(test, timeout, stepped)
        elif "ranks" not in params:
            raise TypeError(f"on_ranks: {test.__name__} must take comm (its body runs on every rank) or ranks "
                            f"(it calls refconv.simulated.run itself); it takes {params}")
        marked = pytest.mark.parametrize("ranks", sizes, ids=[f"{s} ranks" for s in sizes])(test)
        return pytest.mark.simulated(marked)
    return decorate


def _on_every_rank(test, timeout, stepped):
    """``test(comm, **fixtures)`` as a pytest test of ``ranks`` and the same fixtures."""
    signature = inspect.signature(test)
    rest = list(signature.parameters.values())[1:]

    @functools.wraps(test)
    def on_ranks_test(ranks, **fixtures):
        simulated.run(test, ranks, kwargs=fixtures, timeout=timeout, stepped=stepped)

    on_ranks_test.__signature__ = signature.replace(
        parameters=[inspect.Parameter("ranks", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + rest)
    del on_ranks_test.__wrapped__   # pytest reads the signature above, not the body's
    return on_ranks_test
