# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10. Planning and running a scaling job
#
# *One process, then 4 ranks simulated in the notebook, then 4 MPI processes.*
#
# Tutorials 3-9 chose a grid and an algorithm by hand, one layer at a time. A
# scaling job asks the question for a whole model at many rank counts, and
# then checks the answer by measuring. refconv has one command per step:
#
# 1. `refconv plan`: the fastest grid and algorithm for every layer of a model
#    on `P` ranks, predicted from a **machine file** (collective and compute
#    costs), written as a model file;
# 2. `refconv train --model plan.yaml`: run the plan (here, checked against
#    its serial twin);
# 3. `refconv sweep`: a scaling series, one results file; `refconv plot`:
#    speedup, efficiency and where the time goes.
#
# The commands run here as a user would type them (`python -m refconv.cli`
# is the `refconv` command of this environment).

# %%
import json
import math
import os
import subprocess
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy
import yaml

from tutorials import course
from refconv import simulated
from refconv.cost_model import layer_records

work = tempfile.mkdtemp(prefix="refconv-tutorial-10-")


def refconv(*args):
    """Run ``refconv ARGS`` in one process, in the work folder; return its output."""
    proc = subprocess.run([sys.executable, "-m", "refconv.cli", *args], cwd=work, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# %% [markdown]
# ## 1. Plan
#
# The digits CNN of `make demo`, batch 32 on 4 ranks. The machine file
# `v100-edr` holds the published figures of a V100 cluster with EDR
# InfiniBand (built in; `refconv calibrate` measures your own). The planner
# searches every factorisation of the 4 ranks into
# `sample x channel x height x width` for every layer, every channel algorithm
# and `p_f`, and the redistributions between layers, by dynamic programming
# over the chain of layers. Grouped and depthwise convolutions are planned
# too, among the classes that run them ("grouped", or X, Y and W within each
# group: `docs/grouped.md`); the model file the planner writes asks for each by
# a name a layer accepts (`refconv.algorithms.asked_as`).
#
# For a model you mean to run, `refconv calibrate --model NAME --batch B`
# also times every local convolution shape the planner prices for it on your
# ranks, into the machine file's `conv_table`; `refconv train --algorithm auto
# --machine FILE` prices each convolution with the same model
# (`docs/planning.md`).

# %%
plan_text = refconv("plan", "--model", "digits-cnn", "--ranks", "4", "--batch", "32", "--image-size", "16",
                    "--machine", "v100-edr", "--out", "plan.yaml")
print(plan_text)
plan = yaml.safe_load(open(os.path.join(work, "plan.yaml")))

# %% [markdown]
# Each row is a layer that starts a stage: its strategy (`s4` = `sample=4`,
# `c4 w(pf=2)` = Stationary-W on `channel=4` with `p_f = 2`) and its predicted
# milliseconds of compute and of each kind of communication. The first
# convolution cannot split its channels (the digits have one), so its grid has
# no channel axis; for the wider layers the planner weighs the activation
# traffic of X, Y and W against the weight-gradient allreduce they shrink
# (tutorial 7), and the shuffles a change of grid costs between layers.

# %%
# a stage row: layer, type, strategy (may contain spaces), six columns of ms, memory in MiB
columns = ["compute", "allreduce", "allgather", "red-scat", "halo", "shuffle"]
rows = [line.split() for line in plan_text.splitlines() if line[:1].isdigit()]
fig, ax = plt.subplots(figsize=(8, 3.4))
bottom = [0.0] * len(rows)
for j, name in enumerate(columns):
    values = [float(row[-7 + j]) for row in rows]
    ax.bar(range(len(rows)), values, bottom=bottom, label=name)
    bottom = [b + v for b, v in zip(bottom, values)]
ax.set_xticks(range(len(rows)), [f"{row[0]} {row[1]}\n{' '.join(row[2:-7])}" for row in rows], fontsize=8)
ax.set_ylabel("predicted ms per step")
ax.set_title("refconv plan: digits CNN, batch 32, 4 ranks (v100-edr figures)", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()
course.show(fig, "plan-bytes")

# %% [markdown]
# ## 2. Run the plan
#
# `plan.yaml` is an ordinary model file (`docs/models.md`), so the training
# loop of `refconv train` runs it. `course.train_steps` (tutorial 8) is that loop
# as a function of the communicator: three steps on 4 simulated ranks, then the
# same three steps on the serial twin in this process, compared as
# `refconv train --check-serial` compares them. Then the same function once on
# 4 MPI processes (`course.under_mpiexec`).

# %%
plan_file = os.path.join(work, "plan.yaml")
trained = simulated.run(course.train_steps, course.RANKS, args=(plan_file,), kwargs={"batch_size": 32})
serial_losses = course.serial_steps(plan_file, batch_size=32)
real = course.under_mpiexec(course.train_steps, args=(plan_file,), kwargs={"batch_size": 32}, timeout=240)
for k, (a, b, c) in enumerate(zip(trained[0]["losses"], serial_losses, real[0]["losses"])):
    print(f"step {k + 1}: simulated ranks {a:.12f}  serial {b:.12f}  mpiexec {c:.12f}")

# %% [markdown]
# ## 3. Measure a scaling series
#
# `refconv sweep` launches one job per rank count and strategy (here with
# `mpiexec`; `--launcher srun` inside a Slurm allocation) and appends every
# measurement to one JSON-lines file: times per pass, and the bytes and calls
# of each collective. `refconv plot` turns the file into figures.
#
# This laptop has 2 cores, so 4 ranks oversubscribe it and every "speedup"
# here is a slowdown: the timings show the method, not a machine. The bytes,
# on the other hand, are exact, and we check them against the cost model.

# %%
print(refconv("sweep", "--ranks", "1,4", "--strategies", "stationary-x", "--bench", "layer",
              "--shape", "tiny", "--batch", "4", "--repeat", "2", "--warmup", "1", "--out", "sweep.jsonl"))
print(refconv("plot", "sweep.jsonl", "--out-dir", "figures"))
points = [json.loads(line) for line in open(os.path.join(work, "sweep.jsonl"))]

# %%
# Each figure at the size `refconv plot` drew it (110 dpi), one below the other: side by side,
# the three panels of scaling.png shrank past reading.
for name in ("scaling.png", "breakdown.png"):
    image = plt.imread(os.path.join(work, "figures", name))
    fig = plt.figure(figsize=(image.shape[1] / 110, image.shape[0] / 110), dpi=110)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image)
    ax.set_axis_off()
    course.show(fig, name.removesuffix(".png"))

# %% [markdown]
# What the cost model predicts for the 4-rank point (Stationary-X on
# `channel=4`), against what the sweep recorded (bytes of each kind on the
# busiest rank):

# %%
def predicted(point):
    cfg = point["config"]
    grid = cfg["grid"]
    shape = cfg["shape"]
    calls = layer_records(cfg["algorithm"], (cfg["batch"], shape["C"], shape["H"], shape["H"]), shape["F"],
                          (shape["K"], shape["K"]), stride=(shape["stride"],) * 2, padding=(shape["padding"],) * 2,
                          grid_shape=(grid["sample"], grid["channel"], grid["height"], grid["width"]),
                          itemsize=4 if cfg["dtype"] == "float32" else 8)
    totals = {}
    for call in calls:
        totals[call.kind] = totals.get(call.kind, 0) + call.bytes
    return totals


four = [p for p in points if p["config"]["ranks"] == 4]
for p in four:
    print(f"{p['label']:24s} measured {p['bytes']}  predicted {predicted(p)}")

# %% [markdown]
# ## Checks

# %%
assert numpy.allclose(trained[0]["losses"], serial_losses, rtol=1e-6, atol=0)   # --check-serial's tolerance
assert numpy.allclose(real[0]["losses"], trained[0]["losses"], rtol=1e-10, atol=0)
assert real[0]["per_step"] == trained[0]["per_step"]                       # the same calls under mpiexec
conv_grids = [layer.get("grid", plan.get("defaults", {}).get("grid")) for layer in plan["layers"]
              if layer["type"] == "conv"]
assert all(g is not None and math.prod(g.values()) == 4 for g in conv_grids)   # every grid uses the 4 ranks
assert conv_grids[0].get("channel", 1) == 1                                # one input channel: no channel split
assert {p["config"]["ranks"] for p in points} == {1, 4} and len(four) == 1
assert all(p["bytes"] == predicted(p) for p in four)                       # the model counts what was sent
print("tutorial 10: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - The planner prices calls from their bytes: write the closed form of each
#   algorithm's traffic and check it against `records()` and the measured
#   counts: [predict the bytes](exercises/09_predict_the_bytes.md).
# - Run one layer on a grid the planner might pick, `sample x channel x height`:
#   [a hybrid grid](exercises/10_hybrid_grid.md).
