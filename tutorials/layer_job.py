"""One DistConv2d per grid, checked against the reference: the layer tutorials 5-8 run on 4 ranks.

:func:`run_cases` is a function of a communicator, as every multi-rank step of the course
is; :func:`run` runs it on simulated ranks, and tutorial 5 runs it under mpiexec too
(``course.under_mpiexec(layer_job.run_cases, args=(problem, cases))``).

``problem``: ``{N, C, F, H, W, K}`` and optionally ``stride``, ``padding``, ``dilation``;
``cases``: ``[{"grid": {"channel": 4}, "algorithm": "stationary-x", "filter_groups": None}, ...]``.
For each case every rank draws the same global ``x, w, b, dy``, runs forward and backward on
its blocks while ``collectives.stats`` records every call, then ``check_layer`` compares ``y,
dx, dw, db`` with the serial reference (raising on every rank on a mismatch).
"""

import numpy

from tutorials import course
import refconv
from refconv import collectives, simulated
from refconv.testing.check import check_layer
from refconv.testing.strategies import ConvProblem


def run_cases(comm, problem, cases):
    """This rank's part of each case: grid coordinates, local shapes of x, w, y, and its recorded
    calls ``[kind, comm_size, elements, bytes]``, plus the algorithm the layer chose."""
    p = problem
    problem = ConvProblem(N=p["N"], C=p["C"], F=p["F"], H=p["H"], W=p["W"], Kh=p["K"], Kw=p["K"],
                          stride=(p.get("stride", 1),) * 2, padding=(p.get("padding", 0),) * 2,
                          dilation=(p.get("dilation", 1),) * 2)
    x, w, b, dy = problem.arrays(seed=0)                      # the same draw on every rank
    mine = []
    for case in cases:
        grid = refconv.ProcessGrid(comm, **case["grid"])
        layer = refconv.DistConv2d(problem.C, problem.F, (problem.Kh, problem.Kw), stride=problem.stride,
                                   padding=problem.padding, dilation=problem.dilation, grid=grid,
                                   algorithm=case["algorithm"], filter_groups=case.get("filter_groups"),
                                   input_shape=problem.x_shape, backend="numpy", dtype=numpy.float64)
        layer.set_global_parameters(w, b)                     # each rank keeps its shard: layer.weight
        x_loc = layer.input_distribution.extract(x, grid.rank)   # (n, C_i, h, w)
        dy_loc = layer.output_distribution.extract(dy, grid.rank)
        with collectives.stats.recording() as region:
            y_loc = layer.forward(x_loc)                      # (n, F_i, h', w')
            layer.backward(dy_loc)
        check_layer(layer, problem)                           # y, dx, dw, db against the reference, on every rank
        mine.append({"coords": list(grid.coords), "x_loc": list(x_loc.shape), "w_loc": list(layer.weight.shape),
                     "y_loc": list(y_loc.shape), "records": course.records(region), "algorithm_used": layer.algorithm})
        grid.free()
    return mine


def run(problem, cases, ranks=course.RANKS):
    """:func:`run_cases` on ``ranks`` simulated ranks: the ``cases``, each with ``algorithm_used`` and
    ``ranks``, every rank's part of it (:func:`gathered`)."""
    return gathered(cases, simulated.run(run_cases, ranks, args=(problem, cases)))


def gathered(cases, per_rank):
    """``per_rank[r][k]``, rank r's part of case k, as the cases with a list of their ranks' parts."""
    return [{**case, "algorithm_used": per_rank[0][k]["algorithm_used"], "ranks": [mine[k] for mine in per_rank]}
            for k, case in enumerate(cases)]


def show_ranks(case):
    """Print a case of :func:`run`: per rank its shapes and its calls as ``kind(q) bytes``."""
    print(f"{case['algorithm_used']} on {case['grid']}" + (f", filter_groups={case['filter_groups']}"
                                                           if case.get("filter_groups") else ""))
    for r, info in enumerate(case["ranks"]):
        calls = "  ".join(f"{k}(q={q}) {nb}" for k, q, _, nb in info["records"])
        print(f"  rank {r} {tuple(info['coords'])}: x_loc {tuple(info['x_loc'])} w {tuple(info['w_loc'])} "
              f"y_loc {tuple(info['y_loc'])}\n      {calls}")
