"""Exercise 9's checker: your closed form of each algorithm's calls, against the layer's ``records()`` and
against what a real ``DistConv2d`` run on simulated ranks makes (``collectives.stats``)."""

import dataclasses

import numpy
from hypothesis import strategies as st

import refconv
from refconv.collectives import KINDS
from refconv.testing.check import measure_records
from refconv.testing.strategies import conv_problems
from tutorials.exercises.harness import Compared, Part, on_ranks

TITLE = "predict the bytes"
LEVEL, MINUTES = 2, 30  # difficulty 1 to 3, and a learner's time
NO_SCORE = "a prediction is exact or wrong, call for call"


@dataclasses.dataclass(frozen=True)
class TrafficCase:
    algorithm: str
    problem: object
    grid: tuple  # (P_N, P_c, 1, 1)
    p_f: int = None

    @property
    def ranks(self):
        return self.grid[0] * self.grid[1]

    def __str__(self):
        p = self.problem
        return (f"{self.algorithm}{f' (p_f = {self.p_f})' if self.p_f else ''} on grid {self.grid}, x {p.x_shape}, "
                f"w {p.w_shape}, stride {p.stride}, padding {p.padding}, dilation {p.dilation}, float64")


@st.composite
def traffic_cases(draw):
    P = draw(st.sampled_from((1, 2, 3, 4, 6)))
    P_c = draw(st.sampled_from([q for q in range(1, P + 1) if P % q == 0]))
    P_N = P // P_c
    algorithm = draw(st.sampled_from(("stationary-x", "stationary-y", "stationary-w")))
    p_f = draw(st.sampled_from([q for q in range(1, P_c + 1) if P_c % q == 0])) if algorithm == "stationary-w" else None
    problem = draw(conv_problems(max_batch=P_N + 2, min_batch=P_N, max_channels=P_c + 3, min_channels=P_c,
                                 groups=False, max_extra=3))
    return TrafficCase(algorithm, problem, (P_N, P_c, 1, 1), p_f)


def table(calls):
    """Calls as rows ``(kind, communicator size, bytes)``, the kind by its index in ``collectives.KINDS``."""
    return numpy.array([(KINDS.index(k) if k in KINDS else -1, int(q), int(b)) for k, q, b in calls],
                       dtype=int).reshape(-1, 3)


def _layer(comm, case):
    p = case.problem
    grid = refconv.ProcessGrid(comm, sample=case.grid[0], channel=case.grid[1])
    return refconv.DistConv2d(p.C, p.F, (p.Kh, p.Kw), stride=p.stride, padding=p.padding, dilation=p.dilation,
                              grid=grid, algorithm=case.algorithm, filter_groups=case.p_f, dtype=p.dtype,
                              backend="numpy")


def run_predict(module, case):
    p = case.problem

    def body(comm):
        layer = _layer(comm, case)
        x, w, b, dy = p.arrays(0)
        layer.set_global_parameters(w, b)
        layer.bind(x.shape)
        x_loc = layer.input_distribution.extract(x, layer.grid.rank)
        dy_loc = layer.output_distribution.extract(dy, layer.grid.rank)
        measured = measure_records(lambda: (layer.forward(x_loc), layer.backward(dy_loc)))
        coords = layer.grid.coords
        rows = (table(module.predict(case.algorithm, p, case.grid, coords, case.p_f)),
                table((c.kind, c.comm_size, c.bytes) for c in layer.records()),
                table((c.kind, c.comm_size, c.bytes) for c in measured))
        layer.grid.close()
        return rows
    got = on_ranks(body, case.ranks)
    yours = [g[0] for g in got]
    note = f"rows: the calls in order; columns: kind (its index in {list(KINDS)}), ranks, bytes"
    return [Compared("calls, against records()", yours, [g[1] for g in got], exact=True, note=note),
            Compared("calls, against those measured", yours, [g[2] for g in got], exact=True, note=note)]


PARTS = [Part("predict", traffic_cases(), run_predict, str)]
