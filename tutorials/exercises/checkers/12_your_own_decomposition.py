"""Exercise 12's checker: your ``SummaY`` registered as "summa-y", through ``check_layer`` (with each rank's
blocks compared for the report) and ``check_records``, at 2 to 5 simulated ranks."""

import numpy
from hypothesis import strategies as st

import refconv
from refconv import algorithms
from refconv.collectives import KINDS
from refconv.testing.check import check_layer, measure_records, run_layer
from refconv.testing.strategies import ConvProblem, DistConvCase, dist_conv_cases
from tutorials.exercises import score as scoring
from tutorials.exercises.harness import Compared, Part, not_written_in, on_ranks

TITLE = "your own decomposition: SUMMA-style Stationary-Y"
LEVEL, MINUTES = 3, 90  # difficulty 1 to 3, and a learner's time
NAME = "summa-y"


@st.composite
def summa_cases(draw):
    P = draw(st.integers(2, 5))
    P_c = draw(st.sampled_from([q for q in range(2, P + 1) if P % q == 0]))
    return draw(dist_conv_cases(P, algorithms=(NAME,), grid_shape=(P // P_c, P_c, 1, 1), padding_strings=False,
                                padding_modes=("zeros",), max_channels=P_c + 2))


def describe(case):
    p = case.problem
    return (f"grid {case.grid_shape}, x {p.x_shape}, w {p.w_shape}, stride {p.stride}, padding {p.padding}, "
            f"dilation {p.dilation}")


def _layer(comm, case):
    return refconv.DistConv2d(case.problem.C, case.problem.F, (case.problem.Kh, case.problem.Kw),
                              grid=refconv.ProcessGrid(comm, **case.grid_kwargs()), backend="numpy",
                              **case.layer_kwargs())


def run_layer_part(module, case):
    algorithms.register(module.SummaY)

    def body(comm):
        layer = _layer(comm, case)
        actual, expected = run_layer(layer, case.problem)  # y and dx gathered: compare this rank's blocks
        mine = {"y": layer.output_distribution, "dx": layer.input_distribution}
        blocks = {k: (mine[k].extract(actual[k], comm.rank), mine[k].extract(expected[k], comm.rank)) if k in mine
                  else (actual[k], expected[k]) for k in ("y", "dx", "dw", "db")}
        layer.grid.close()
        fresh = _layer(comm, case)
        try:
            check_layer(fresh, case.problem)
            verdict = "passes"
        except AssertionError as exc:
            verdict = str(exc).splitlines()[0]
            if not_written_in(str(exc)):
                raise not_written_in(str(exc)) from None
        finally:
            fresh.grid.close()
        return blocks, verdict
    got = on_ranks(body, int(numpy.prod(case.grid_shape)))
    p = case.problem
    cells = p.N * p.y_shape[2] * p.y_shape[3]
    lengths = {"y": p.C * p.Kh * p.Kw, "dx": p.F * p.Kh * p.Kw, "dw": cells, "db": cells}
    return [Compared(f"{k}, this rank's block" if k in ("y", "dx") else k, [g[0][k][0] for g in got],
                     [g[0][k][1] for g in got], reduction=lengths[k]) for k in ("y", "dx", "dw", "db")] + \
        [Compared("check_layer's verdict", [g[1] for g in got], ["passes"] * len(got), exact=True)]


def _table(calls):
    rows = [(KINDS.index(c.kind), c.comm_size, c.bytes, c.messages) for c in calls]
    return numpy.array(rows, dtype=int).reshape(-1, 4)


def run_records_part(module, case):
    algorithms.register(module.SummaY)
    p = case.problem

    def body(comm):
        layer = _layer(comm, case)
        x, w, b, dy = p.arrays(0)
        layer.set_global_parameters(w, b)
        layer.bind(x.shape)
        x_loc = layer.input_distribution.extract(x, comm.rank)
        dy_loc = layer.output_distribution.extract(dy, comm.rank)
        measured = measure_records(lambda: (layer.forward(x_loc), layer.backward(dy_loc)))
        layer.grid.close()
        return _table(layer.records()), _table(measured)
    got = on_ranks(body, int(numpy.prod(case.grid_shape)))
    return [Compared("records(), against the calls measured", [g[0] for g in got], [g[1] for g in got], exact=True,
                     note=f"rows: the calls in order; columns: kind (its index in {list(KINDS)}), ranks, bytes, "
                          f"messages")]


PARTS = [Part("check_layer", summa_cases(), run_layer_part, describe),
         Part("check_records", summa_cases(), run_records_part, describe)]

SCORE_CASE = DistConvCase(ConvProblem(N=2, C=8, F=8, H=8, W=8, Kh=3, Kw=3, padding=(1, 1)), (1, 4, 1, 1), NAME)


def score(module, solution):
    c, p = SCORE_CASE, SCORE_CASE.problem
    x, w, b, dy = p.arrays(0)

    def body_of(m):
        def body(comm):
            layer = _layer(comm, c)
            layer.set_global_parameters(w, b)
            layer.bind(x.shape)
            x_loc = layer.input_distribution.extract(x, comm.rank)
            dy_loc = layer.output_distribution.extract(dy, comm.rank)
            scoring.given(x_loc, dy_loc, layer.weight)
            y_loc = layer.forward(x_loc)
            scoring.checkpoint()
            dx_loc = layer.backward(dy_loc)
            scoring.checkpoint()
            layer.grid.close()
            return y_loc, dx_loc
        return body
    lines = []
    for m in (module, solution):  # the registry holds one "summa-y" at a time: register, then measure
        algorithms.register(m.SummaY)
        lines.append(scoring.measure(body_of(m), 4))
    return scoring.table(f"{c.grid_shape} grid, x {p.x_shape}, w {p.w_shape}, padding 1", *lines)

