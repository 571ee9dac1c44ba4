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
# # 9. Property-testing your own decomposition
#
# *4 ranks simulated in the notebook; one function once under mpiexec.*
#
# Suppose you have a new way to split a convolution. How do you convince
# yourself it is right, for every shape, stride, padding and uneven split, and
# not just the one you tried? refconv's own multi-rank tests use a small kit
# that ships with the package, `refconv.testing`:
#
# - `strategies.dist_conv_cases(world_size, ...)`: Hypothesis draws a problem
#   and a grid that fit together, with **uneven blocks by construction**;
# - `check.check_layer(layer, problem)`: drives any object with the interface
#   of `DistConv2d` on every rank and compares `y, dx, dw, db` with the serial
#   reference, raising the same error on every rank (no rank left waiting);
# - `mutants.expect_mismatch(layer, problem)`: asserts the opposite, that a
#   deliberately wrong layer **is** caught (a test of the test).
#
# Hypothesis draws each example here, in the notebook, and every example runs
# on 4 simulated ranks (`refconv.simulated.run`, threads of this process, each
# with its own communicator; tutorial 3 introduced them). So no example pays
# for launching processes, and a failing example comes back as an ordinary
# Python exception that Hypothesis can shrink. refconv's own test suite does the
# same with `refconv.testing.ranks.on_ranks`.
#
# We write a small algorithm with a bug planted in it, let Hypothesis find the
# bug and shrink it to the smallest example, fix it, and check its
# communication volume against the cost model. `docs/testing.md` documents the
# kit.

# %%
import dataclasses

import matplotlib.pyplot as plt
from hypothesis import given, settings

from tutorials import course
import refconv
from refconv import collectives, simulated
from refconv import reference as ref
from refconv.backend import get_backend
from refconv.cost_model import layer_records
from refconv.distribution import Distribution
from refconv.testing.check import check_layer
from refconv.testing.mutants import expect_mismatch
from refconv.testing.strategies import ConvProblem, dist_conv_cases

# %% [markdown]
# ## The algorithm: data parallelism from scratch
#
# `SampleSplit` convolves each rank's samples locally and allreduces the weight
# gradients through `refconv.collectives` (the one package that talks to MPI).
# The planted bug is a real one: with `average=True` it **averages** the
# gradients over the ranks and rescales by the global batch, as data-parallel
# frameworks commonly do. That is right only when every rank has the same
# number of samples.

# %%
class SampleSplit:
    """Each rank convolves its own samples; dw and db are allreduced over all ranks."""

    def __init__(self, problem, grid, average=False):
        self.p, self.grid, self.average = problem, grid, average
        self.backend = get_backend("numpy")                             # host arrays: NumPy

    def set_global_parameters(self, w, b):
        self.w, self.b = w, b                                           # replicated on every rank

    def bind(self, x_shape):                                            # N over the sample axis
        self.input_distribution = Distribution.activations(self.grid, x_shape)
        self.output_distribution = Distribution.activations(self.grid, (x_shape[0], self.p.F, *self.p.out_hw))

    def forward(self, x_loc):
        self.x_loc = x_loc                                              # (n, C, H, W)
        return ref.conv2d_forward(x_loc, self.w, self.b, **self.p.geometry)   # (n, F, H', W')

    def backward(self, dy_loc):
        comm, n = self.grid.comm, dy_loc.shape[0]
        dw = ref.conv2d_backward_filter(self.x_loc, dy_loc, self.w.shape, **self.p.geometry)  # partial over n
        db = ref.conv2d_backward_bias(dy_loc)
        if self.average:   # the bug: the mean of per-rank means, times N; right only if every n = N / P
            scale = self.p.N / comm.size
            self.dw = collectives.allreduce(comm, dw / n) * scale
            self.db = collectives.allreduce(comm, db / n) * scale
        else:
            self.dw, self.db = collectives.allreduce(comm, dw), collectives.allreduce(comm, db)
        return ref.conv2d_backward_data(dy_loc, self.w, self.x_loc.shape, **self.p.geometry)   # local

    def global_parameter_grads(self):
        return self.dw, self.db

    def __repr__(self):
        return f"SampleSplit(average={self.average})"


# %% [markdown]
# ## The property test
#
# `check_on_ranks` is what every rank runs for one example: it builds the
# sample grid and checks the layer. The test draws a problem with uneven
# batches by construction (`dist_conv_cases(4, axes=("sample",))`) and runs
# `check_on_ranks` on 4 simulated ranks. When `check_layer` fails, it fails on
# every rank, and `simulated.run` raises that `AssertionError` in the notebook,
# which is what Hypothesis needs to shrink the example. The settings are
# derandomized, so that this page shows the same examples on every run.
#
# We run it with the bug, then fixed, and record each example for the figure.

# %%
def check_on_ranks(comm, problem, average):
    grid = refconv.ProcessGrid(comm, sample=comm.size)
    try:
        return check_layer(SampleSplit(problem, grid, average), problem)
    finally:
        grid.free()


def property_test(average, examples):
    tried = []                                # (problem, passed) in the order Hypothesis ran them

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None)
    @given(case=dist_conv_cases(course.RANKS, axes=("sample",)))
    def test(case):
        try:
            simulated.run(check_on_ranks, course.RANKS, args=(case.problem, average))
        except AssertionError:
            tried.append((case.problem, False))
            raise
        tried.append((case.problem, True))

    try:
        test()
    except AssertionError as failure:         # Hypothesis replays the smallest failing example last
        return tried, failure
    return tried, None


buggy_run, failure = property_test(average=True, examples=25)
shrunk = buggy_run[-1][0]
fixed_run, no_failure = property_test(average=False, examples=15)
print(f"with the bug: {len(buggy_run)} examples run, the smallest failing one: {shrunk}")
print(f"fixed: {len(fixed_run)} examples pass")

# %% [markdown]
# The failure Hypothesis reports is the one `simulated.run` raised for the
# smallest example: the `AssertionError` of `check_layer`, which names, rank by
# rank, the tensors that differ and where, with a note that lists how every
# rank ended (the first to raise it, and the others, released from the
# collective they were in).

# %%
summary = [note for note in failure.__notes__ if note.startswith("on 4 simulated ranks")]
print(failure)
print(*summary, sep="\n")

# %% [markdown]
# ## What Hypothesis did
#
# It drew examples until one failed, then **shrank** it: tried smaller and
# simpler variants of the failing problem, kept those that still failed, and
# finally replayed the smallest. Every run is plotted below, the problem's
# size against the order in which it ran; the failures are red.

# %%
def size(p):
    return p.N * p.C * p.F * p.H * p.W * p.Kh * p.Kw


fig, ax = plt.subplots(figsize=(8, 3.4))
for k, (p, passed) in enumerate(buggy_run):
    ax.plot(k, size(p), "o" if passed else "x", color="C2" if passed else "C3", ms=5)
first_fail = next(k for k, (_, passed) in enumerate(buggy_run) if not passed)
ax.axvline(first_fail, color="0.6", lw=0.8)
ax.text(first_fail + 0.3, size(buggy_run[first_fail][0]), "first failure, then shrinking", fontsize=8)
ax.set_yscale("log")
ax.set_xlabel("example, in the order Hypothesis ran it")
ax.set_ylabel("problem size N C F H W Kh Kw")
ax.set_title("the buggy SampleSplit on 4 ranks: passes (green) and failures (red)", fontsize=10)
fig.tight_layout()
course.show(fig, "passes-and-failures")

print("the smallest failing problem:", {k: getattr(shrunk, k) for k in ("N", "C", "F", "H", "W", "Kh", "Kw", "groups")})

# %% [markdown]
# The smallest failure is a 1x1 convolution of one channel on 1x1 images:
# nothing about the geometry matters. What remains is `N = 5` on 4 ranks, the
# only batch that splits unevenly here (2, 1, 1, 1). That is the bug's
# signature, found without our telling Hypothesis where to look, because the
# strategies draw uneven splits on purpose.
#
# A test of the test: `expect_mismatch` confirms the mutant is caught on that
# problem, for the gradients; and on an even split (`N = 4`) the same mutant
# **passes** `check_layer`: a test that only tried `N = 4` would never have
# seen it.

# %%
def mutant_on_ranks(comm, problem):
    grid = refconv.ProcessGrid(comm, sample=comm.size)
    caught = expect_mismatch(SampleSplit(problem, grid, average=True), problem, tensors={"dw", "db"})
    even = dataclasses.replace(problem, N=comm.size)
    slips = check_layer(SampleSplit(even, grid, average=True), even)
    grid.free()
    return sorted(caught), slips


caught, even_slips_through = simulated.run(mutant_on_ranks, course.RANKS, args=(shrunk,))[0]
print(f"the mutant is caught on the shrunk problem for {caught}; on N = 4 it passes: {even_slips_through}")

# %% [markdown]
# ## The communication volume
#
# On a 3x3 layer with 3 input channels and 4 filters, the fixed layer makes
# exactly the calls the cost model predicts for sample parallelism: one
# allreduce of `dw` (`4 x 3 x 3 x 3` float64 values) and one of `db` (4), over
# the 4 ranks.

# %%
def volume(comm):
    grid = refconv.ProcessGrid(comm, sample=comm.size)
    problem = ConvProblem(N=6, C=3, F=4, H=5, W=5, Kh=3, Kw=3, padding=(1, 1))
    layer = SampleSplit(problem, grid)
    x, w, b, dy = problem.arrays()
    layer.set_global_parameters(w, b)
    layer.bind(x.shape)
    with collectives.stats.recording() as region:
        layer.forward(layer.input_distribution.extract(x, grid.rank))
        layer.backward(layer.output_distribution.extract(dy, grid.rank))
    model = layer_records("stationary-x", problem.x_shape, problem.F, (problem.Kh, problem.Kw), stride=problem.stride,
                          padding=problem.padding, dilation=problem.dilation, groups=problem.groups,
                          grid_shape=(comm.size, 1, 1, 1), coords=(grid.coords[0], 0, 0, 0), itemsize=8)
    grid.free()
    return {"measured": course.records(region), "model": [[c.kind, c.comm_size, c.bytes] for c in model]}


ranks = simulated.run(volume, course.RANKS)
for r, info in enumerate(ranks):
    print(f"rank {r}: measured {[(k, q, nb) for k, q, _, nb in info['measured']]}")
print(f"model : {[tuple(c) for c in ranks[0]['model']]}")

# %% [markdown]
# ## The same function on real MPI ranks
#
# Nothing above knows it ran on threads. `course.under_mpiexec` writes
# `volume`'s own source, with the `SampleSplit` class it uses and the imports
# they name, into a job file and runs it with `mpiexec -n 4 python -m mpi4py`:
# every rank records the same calls as its simulated twin.

# %%
real = course.under_mpiexec(volume)
assert real == ranks
print("under mpiexec: every rank made the calls its simulated twin made")

# %% [markdown]
# ## Checks

# %%
assert shrunk.N % 4 != 0 and size(shrunk) == shrunk.N                     # uneven batch, everything else minimal
assert not buggy_run[-1][1] and buggy_run[first_fail][0].N % 4 != 0
assert isinstance(failure, AssertionError) and no_failure is None and len(summary) == 1
assert all(passed for _, passed in fixed_run) and len(fixed_run) == 15
assert caught == ["db", "dw"] and even_slips_through is True
assert all([[k, q, nb] for k, q, _, nb in info["measured"]] == info["model"] for info in ranks)
print("tutorial 9: all checks passed")

# %% [markdown]
# ## Try this
#
# Exercises with a checker (`tutorials/exercises/`):
#
# - Three planted bugs to find and fix with the kit of this tutorial, with
#   nothing said of where they are: [detective](exercises/11_detective.md).
# - Write a decomposition of your own, a broadcast variant of Stationary-Y,
#   until `check_layer` and `check_records` pass at 2 to 5 ranks: [your own
#   decomposition](exercises/12_your_own_decomposition.md).
