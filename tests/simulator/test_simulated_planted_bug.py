"""A researcher's new decomposition with a rank-dependent bug, property-tested on simulated ranks.

"bcast-y" is Stationary-Y's layout with the forward allgather of ``x`` replaced by ``P_c``
broadcasts, SUMMA style: for each channel block ``j``, rank ``j`` broadcasts ``x[:, C_j]``
and every rank adds ``x[:, C_j] * w[F_i, C_j]`` to its ``y[:, F_i]``.  The planted bug takes the
weight block of the rank's own channels ``C_i`` instead of ``C_j``.  On even blocks it computes
wrong numbers (every rank fails check_layer); on uneven blocks the shapes disagree on some ranks
only, which raise at their first wrong block while the others go on to the next broadcast.
Under mpiexec that left ranks waiting in a collective until the launch's timeout, with nothing
said about where or why; on simulated ranks the run ends at once and says which rank raised what.
"""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refconv import algorithms, collectives, simulated
from refconv.algorithms.stationary_y import StationaryY
from refconv.distribution import block_range
from refconv.testing.check import check_case
from refconv.testing.strategies import dist_conv_cases


class BcastY(StationaryY):
    """Stationary-Y with the allgather of x replaced by P_c broadcasts (the correct one)."""

    name = "bcast-y"
    bug = False

    def forward(self, x_loc, w_loc, b_loc):
        # x_loc: (n, C_i, h, w); w_loc: (F_i, C, Kh, Kw)
        comm, me = self.channel_comm, self.channel_comm.Get_rank()
        blocks, y_loc = [], None
        for j in range(comm.Get_size()):
            x_j = collectives.bcast(comm, x_loc if j == me else None, root=j)       # (n, C_j, h, w)
            blocks.append(x_j)
            c0, c1 = block_range(self.geom.C, comm.Get_size(), me if self.bug else j)
            part = self.conv(self.halo.extend(x_j, self.xp), w_loc[:, c0:c1])      # (n, F_i, h', w')
            y_loc = part if y_loc is None else y_loc + part
        self.x_win = self.halo.extend(self.xp.concatenate(blocks, axis=1), self.xp)  # for backward, as Y keeps it
        return self.add_bias(y_loc, b_loc)


class BcastYPlantedBug(BcastY):
    name = "bcast-y-bug"
    bug = True


@pytest.fixture(autouse=True)
def _registered():
    """Registered while this file's tests run only: pytest imports every test file first, and the
    planner prices every registered algorithm (tests/conftest.py restores the registry after each)."""
    algorithms.register(BcastY)
    algorithms.register(BcastYPlantedBug)


def property_test(algorithm, ranks, examples):
    """The researcher's property test: drawn problems on a channel split of every rank (the first
    bug found is shrunk and reported, Hypothesis's report_multiple_bugs=False)."""
    @settings(max_examples=examples, derandomize=True, database=None, report_multiple_bugs=False)
    @given(st.data())
    def test(data):
        case = data.draw(dist_conv_cases(ranks, algorithms=(algorithm,), grid_shape=(1, ranks, 1, 1),
                                         padding_strings=False))
        simulated.run(check_case, ranks, args=(case,), timeout=60)
    return test


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_correct_decomposition_passes(ranks):
    property_test("bcast-y", ranks, 10)()


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8])
def test_the_planted_bug_ends_at_once_with_the_failing_ranks_and_the_shrunk_example(ranks):
    t0 = time.monotonic()
    with pytest.raises(BaseException) as caught:      # one failure, or Hypothesis's group of distinct ones
        property_test("bcast-y-bug", ranks, 10)()
    # it ends: no rank is left waiting for a deadline (the 10 s is measured on a quiet
    # machine in docs/benchmarks.md; this bound only catches a hang, on a loaded one)
    assert time.monotonic() - t0 < 60, "the run must end, not wait in a collective"
    failures = getattr(caught.value, "exceptions", [caught.value])
    for failure in failures:
        text = str(failure) + "\n".join(getattr(failure, "__notes__", []))
        assert "Failing test case" in text or "Falsifying example" in text, text   # the shrunk example
        assert f"on {ranks} simulated ranks:" in text, text      # every rank's outcome, listed
        if isinstance(failure, AssertionError):                  # wrong numbers on every rank
            assert "failed on every rank of" in text or "failed on rank" in text, text
        else:   # ranks apart: some wait in the next broadcast, the others report their error
            assert isinstance(failure, (simulated.Deadlock, simulated.CollectiveMismatch)), text
            assert "raised ValueError" in text and "carrying:" in text, text
