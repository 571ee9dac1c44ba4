"""Assert that a deliberately wrong layer is caught: tests that test the test.

A property test that never fails proves little.  Plant a bug in a copy of your
layer (a *mutant*: a forgotten allreduce, a bias added on every rank, a halo one
row short) and check that :func:`refconv.testing.check.check_layer` rejects it::

    from refconv.testing.mutants import expect_mismatch

    caught = expect_mismatch(ForgetsBias(problem, grid), problem, tensors={"y"})
    # caught: {"y"}, the tensors that differed, the same set on every rank

``expect_mismatch`` is collective, like ``check_layer``: every rank of
``layer.grid.comm`` must call it, and every rank returns the same set or raises
the same AssertionError (when the mutant passes, or when a tensor named in
``tensors`` was not among those that differed).
"""

import re

from refconv.testing.check import check_layer

TENSORS = ("y", "dx", "dw", "db")
# check_layer's message names each mismatching tensor at the start of a line: "db: 2 of 2 elements differ ..."
_NAMED = re.compile(r"^(y|dx|dw|db): ", re.M)


def mismatched_tensors(message):
    """The tensors (``y``, ``dx``, ``dw``, ``db``) that a ``check_layer`` failure message names."""
    return set(_NAMED.findall(message))


def expect_mismatch(layer, problem, *, tensors=None, seed=0):
    """Collective: assert that ``check_layer(layer, problem)`` fails; return the tensors that differed.

    ``tensors`` (a subset of ``y, dx, dw, db``), when given, must all be among
    those that differed: a mutant caught for the wrong reason is not caught.
    A layer that raises is reported by ``check_layer`` as a mismatch with its
    traceback, so it counts as caught, with an empty set of tensors.
    """
    if tensors is not None and not set(tensors) <= set(TENSORS):
        raise ValueError(f"tensors: expected a subset of {TENSORS}, got {sorted(tensors)}")
    try:
        check_layer(layer, problem, seed=seed)
    except AssertionError as exc:  # raised identically on every rank: the ranks agree on what follows
        differed = mismatched_tensors(str(exc))
    else:
        raise AssertionError(f"{layer!r} on {problem}: check_layer found no mismatch; the planted bug went unseen")
    if tensors is not None and not set(tensors) <= differed:
        raise AssertionError(f"{layer!r} on {problem}: expected {sorted(tensors)} to differ, "
                             f"but check_layer reported {sorted(differed) or 'a crash'}")
    return differed
