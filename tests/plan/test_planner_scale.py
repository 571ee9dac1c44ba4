"""The planner at the paper's scale (issue 39): its shortcuts give what the long way gives."""

import pytest

from refconv import algorithms
from refconv.distribution import Distribution
from refconv.pricing import perf


def _cases():
    for name, algorithm in algorithms.REGISTRY.items():
        for P_c in (1, 2, 4, 8, 16):
            for groups in (1, 2, 4):
                F, C = 48, 40 * groups
                if P_c == 1 and name != "sample-spatial":
                    continue                      # perf.local_weight_shape: one channel rank is sample-spatial
                try:
                    choices = algorithms.candidates(P_c, groups, (C, F)) if P_c > 1 else [(name, None)]
                except ValueError:
                    continue
                for chosen, p_f in choices:
                    if chosen == name:
                        yield name, P_c, groups, F, C, p_f


CASES = list(_cases())


def test_the_cases_cover_every_algorithm_and_a_filter_split():
    assert {c[0] for c in CASES} == set(algorithms.REGISTRY) and any(c[5] and c[5] > 1 for c in CASES)


@pytest.mark.parametrize("name, P_c, groups, F, C, p_f", CASES)
def test_rank_0_weight_block_in_closed_form_is_the_distributions(name, P_c, groups, F, C, p_f):
    for F_, C_ in ((F, C // groups), (F + 5, C // groups + 3)):       # even and uneven blocks
        dims = algorithms.REGISTRY[name].weight_dims(P_c, p_f, groups)
        try:
            expected = Distribution((1, P_c, 1, 1), (F_, C_, 1, 1), dims, names=("F", "C", "Kh", "Kw")).local_shape(0)[:2]
        except ValueError:
            continue                                                    # a layout the layer refuses: not planned
        assert perf._weight_block(F_, C_, P_c, name, p_f, groups) == expected
