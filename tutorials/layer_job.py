"""Run one DistConv2d on MPI ranks for each case in OUT/params.json; rank 0 writes OUT/result.json.

Tutorials 5-8 launch it through ``course.run_layer``; by hand::

    mpiexec -n 4 python -m mpi4py tutorials/layer_job.py OUT      # OUT/params.json written first

params.json: ``{"problem": {N, C, F, H, W, K, stride, padding, dilation},
"cases": [{"grid": {"channel": 4}, "algorithm": "stationary-x", "filter_groups": null}, ...]}``.

For each case every rank draws the same global ``x, w, b, dy``, runs forward and
backward on its blocks while ``collectives.stats`` records every call, then
``check_layer`` compares ``y, dx, dw, db`` with the serial reference (raising on
every rank on a mismatch, so a wrong result fails the launch).  result.json holds,
per case and rank: grid coordinates, local shapes of ``x``, ``w``, ``y``, and the
recorded calls ``[kind, comm_size, elements, bytes]``.
"""

import json
import sys

import numpy
from mpi4py import MPI

import course
import refconv
from refconv import collectives
from refconv.testing.check import check_layer
from refconv.testing.strategies import ConvProblem

comm = MPI.COMM_WORLD
out = sys.argv[1]
params = json.load(open(f"{out}/params.json"))
p = params["problem"]
problem = ConvProblem(N=p["N"], C=p["C"], F=p["F"], H=p["H"], W=p["W"], Kh=p["K"], Kw=p["K"],
                      stride=(p.get("stride", 1),) * 2, padding=(p.get("padding", 0),) * 2,
                      dilation=(p.get("dilation", 1),) * 2)
x, w, b, dy = problem.arrays(seed=0)                      # the same draw on every rank

results = []
for case in params["cases"]:
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
    ranks = comm.gather({"coords": list(grid.coords), "x_loc": list(x_loc.shape),
                         "w_loc": list(layer.weight.shape), "y_loc": list(y_loc.shape),
                         "records": course.records(region)})
    results.append({**case, "algorithm_used": layer.algorithm, "ranks": ranks})
    grid.free()

if comm.rank == 0:
    with open(f"{out}/result.json", "w") as f:
        json.dump(results, f)
    print(f"{len(results)} case(s) on {comm.size} ranks: y, dx, dw, db match the reference")
