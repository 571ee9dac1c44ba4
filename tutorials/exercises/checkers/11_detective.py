"""Exercise 11's checker: the detective's code on three cases against the definitions, and your suspects.

The cases are named "case 1" to "case 3", and nothing here names a bug or the function that holds
it: a mismatch says which tensor differs on which ranks of the smallest failing case, and no cause
(``hints=False``).  Your suspects are checked without a list of answers: for case k, the function you
name must be one you changed (its code differs from the skeleton's), and the skeleton with that one
function replaced by yours must pass case k's witnesses (a few fixed small cases).  Any function whose
change alone fixes the case is accepted.  The planted bugs are listed in the test that plants them back
(tests/docs_and_tutorials/test_exercises.py), not here.
"""

import ast

import numpy
from hypothesis import strategies as st

from refconv import reference as ref
from tutorials.exercises.checkers.common import HaloCase, LayerCase, channel_cases, indices, window_of
from tutorials.exercises import harness

from tutorials.exercises.harness import Compared, Part, Wrong, on_ranks
from tutorials.exercises.kit import Layer

TITLE = "the detective: three planted bugs"
LEVEL, MINUTES = 3, 45  # difficulty 1 to 3, and a learner's time
NO_SCORE = "a fix is right or wrong; the fixed code moves what the reference moves"

@st.composite
def same_padding_rows(draw):
    """A 1-D halo of "same" padding (odd kernel), stride 2 or 1, over 2 to 5 ranks."""
    P, s, K, d = (draw(st.integers(2, 5)), draw(st.sampled_from((2, 1))), draw(st.sampled_from((3, 1))),
                  draw(st.integers(1, 2)))
    H = draw(st.integers(P * s, P * s + 6))  # at least one output row a rank
    return HaloCase((P,), (H,), (K,), (s,), (d * (K - 1) // 2,), (d,))


@st.composite
def corner_volumes(draw):
    """A volume on a 2 x 2 x 2 grid whose windows reach one cell past each block: every rank reads a
    corner of the rank diagonally across."""
    size = tuple(draw(st.integers(2, 5)) for _ in range(3))
    return HaloCase((2, 2, 2), size, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))


def _exchange(name):
    def run(module, case):
        rng = numpy.random.default_rng(0)
        x = rng.standard_normal((case.n, case.c) + case.size)

        def body(comm):
            box = case.owned(comm.rank)
            x_loc = numpy.ascontiguousarray(x[(slice(None),) * 2 + tuple(slice(a, b) for a, b in box)])
            return getattr(module, name)(comm, x_loc, case.layer)
        got = on_ranks(body, case.ranks)
        return [Compared("x_win", got, [window_of(x, case.window(r)) for r in range(case.ranks)], hints=False)]
    return run


def run_forward(module, case):
    p, P = case.problem, case.ranks
    x, w, b, _ = p.arrays(case.seed)
    y = ref.conv2d_forward(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation)

    def body(comm):
        c_i = indices(p.C, P, [comm.rank])
        layer = Layer(p.C, p.F, [len(i) for i in numpy.array_split(range(p.C), P)],
                      [len(i) for i in numpy.array_split(range(p.F), P)], p.stride, p.padding, p.dilation)
        return module.forward(comm, numpy.ascontiguousarray(x[:, c_i]), numpy.ascontiguousarray(w[:, c_i]), b.copy(),
                              layer)
    got = on_ranks(body, P)
    return [Compared("y_loc", got, [y[:, indices(p.F, P, [r])] for r in range(P)], reduction=p.C * p.Kh * p.Kw,
                     hints=False)]


# -- your suspects: any function you changed whose change alone fixes the case -----------------------------
def _witnesses():
    """``{case: [fixed small cases]}``: the smallest failing cases of the skeleton, and a few beside them."""
    from refconv.testing.strategies import ConvProblem
    return {1: [HaloCase((4,), (11,), (3,), (2,), (1,), (1,)), HaloCase((3,), (8,), (3,), (2,), (1,), (1,)),
                HaloCase((5,), (13,), (1,), (2,), (0,), (1,))],
            2: [HaloCase((2, 2, 2), (2, 2, 2), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
                HaloCase((2, 2, 2), (3, 4, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))],
            3: [LayerCase(ConvProblem(N=1, C=2, F=2, H=1, W=1, Kh=1, Kw=1), 2),
                LayerCase(ConvProblem(N=1, C=3, F=4, H=3, W=3, Kh=3, Kw=3, padding=(1, 1)), 3)]}


WITNESSES = _witnesses()


def hybrid(skeleton_source, yours_source, name):
    """The skeleton's source with function ``name`` as yours has it, and the functions you added (helpers
    the skeleton has not), all else the skeleton's."""
    tree, mine = ast.parse(skeleton_source), ast.parse(yours_source)
    yours = {node.name: node for node in mine.body if isinstance(node, ast.FunctionDef)}
    theirs = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    tree.body = [yours[name] if isinstance(node, ast.FunctionDef) and node.name == name else node
                 for node in tree.body] + [node for f, node in yours.items() if f not in theirs]
    return ast.unparse(tree)


def run_suspects(module, case, earlier):
    named = module.suspects()
    if not isinstance(named, dict):
        raise Wrong([f"suspects() returns {type(named).__name__}: expected a dict {{1: name, 2: name, 3: name}}"])
    skeleton = harness.load(harness.EXERCISES.index("11_detective") + 1, skeleton=True).__source__
    yours = getattr(module, "__source__", None)
    if yours is None:
        raise Wrong(["your module has no source to compare with the skeleton (check it from its file)"])
    theirs, mine = harness.functions(skeleton), harness.functions(yours)
    changed = sorted(f for f in mine if f in theirs and mine[f] != theirs[f])
    lines = []
    for k, part in enumerate(PARTS[:3], 1):
        f = named.get(k)
        if not isinstance(f, str) or not f:
            lines.append(f"case {k}: suspects() names no function for it (its keys are case numbers 1, 2, 3)")
        elif f not in mine:
            lines.append(f"case {k}: your file has no function {f}")
        elif earlier.get(part.name) != "passed":
            lines.append(f"case {k}: still fails; fix it first, then name the function you changed")
        elif f not in changed:
            lines.append(f"case {k}: {f} is as the skeleton has it; the functions you changed: "
                         f"{', '.join(changed) or 'none'}")
        else:
            trial = harness.module_from_source(hybrid(skeleton, yours, f), "your change alone", "hybrid")
            for witness in WITNESSES[k]:
                failed = harness.attempt(part, trial, witness)
                if failed:
                    lines.append(f"case {k}: your change to {f} alone does not fix it: {failed[0]} "
                                 f"({part.describe(witness)})")
                    break
    if lines:
        raise Wrong(lines)
    return []


PARTS = [Part("case 1", same_padding_rows(), _exchange("halo_exchange"), str),
         Part("case 2", corner_volumes(), _exchange("halo_exchange_3d"), str),
         Part("case 3", channel_cases(), run_forward, str),
         Part("suspects", st.just(None), run_suspects, lambda case: "your suspects", after=True)]
