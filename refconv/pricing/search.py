"""The planner: the fastest grid (and algorithm) for every stage, by dynamic programming.

The state between stages is the grid the activation lies on.  Over a chain of
stages the best plan is a shortest path: ``M[g_in, g]`` is the least time from an
input on grid ``g_in`` to the output of the stages so far on grid ``g``, and a
stage on grid ``g'`` extends it by the min-plus product

    M'[g_in, g'] = min_g M[g_in, g] + shuffle[g, g'] + stage[g']

(``stage[g']``: the stage's best algorithm on ``g'``; the algorithm does not change
the activation layout, so it is chosen per grid).  A residual block is one node
whose cost matrix ``B[g_in, g_out]`` is its body's chain matrix plus its
shortcut's (ending with the shuffle onto the body's exit grid) plus the local sum:
both paths start from the same input grid and end on the same exit grid, exactly
as :class:`refconv.model.Residual` runs them.  The top-level input is free on any
grid (the loader scatters straight into the first layer's layout; of a model that opens with a
block, into the block's input grid, which the plan records and the written spec makes its
``defaults.grid``).  The result is
the exact optimum of the model in :mod:`refconv.pricing.perf` over every
factorisation of ``P`` that :func:`refconv.pricing.perf.feasible` keeps.

A memory limit makes the problem a constrained shortest path.  When the fastest
plan does not fit, the planner adds ``lambda`` seconds per byte of memory to every
stage (its kept bytes plus its gathered buffer: the plan's memory counts only the
largest of those, so the penalty over-counts) and raises ``lambda`` until the plan
fits (Lagrangian relaxation): the plan returned then fits, but is not guaranteed
to be the fastest that fits, and a limit that only a plan the penalty never
reaches would meet is reported as infeasible.
"""

import copy
import dataclasses
import math
import time

import numpy

from refconv import algorithms
from refconv.grid import AXES, axes_of
from refconv.pricing import graph, perf
from refconv.pricing.graph import Block, Stage
from refconv.pricing.shuffle import shuffle_matrix


MAX_RANKS = 65536  # the planner tabulates layouts per rank: beyond this it would run for many minutes
SEARCH_BUDGET_S = 300.0   # the planner refuses a search estimated longer than this (work_estimate)
OPTION_S = 4e-3           # estimated seconds to price one stage on one grid (all its options: 3.7 ms measured, 2 loaded cores)
MINPLUS_TERM_S = 3e-9     # estimated seconds per term a + b of a min-plus product (numpy, in blocks)
PROGRESS_S = 5.0   # seconds between progress reports (the first after this long: a quick plan says nothing)


class NoFeasiblePlan(ValueError):
    """No plan fits the memory limit (or no grid runs some stage)."""


class TooLarge(ValueError):
    """More ranks, or grids of them, than the planner searches in minutes."""


def check_ranks(P, ndim=len(AXES)):
    """Refuse (TooLarge, naming --ranks) a rank count whose search would run for many minutes whatever
    the model: more than MAX_RANKS, or so many grids (ordered factorisations of P into ``ndim`` axes: 5
    for a model of volumes) that pricing a single stage on each would exceed the budget.  The planner
    checks the model's own estimate again (:func:`work_estimate`)."""
    if P > MAX_RANKS:
        raise TooLarge(f"--ranks: {P} is more than the {MAX_RANKS} ranks the planner searches; plan for at most "
                       f"{MAX_RANKS}")
    count = len(perf.grids(P, ndim))
    if count * OPTION_S > SEARCH_BUDGET_S:
        _refuse(P, ndim, count * OPTION_S, lambda G: G * OPTION_S)


def work_estimate(elements, G):
    """Estimated seconds of one search of the chain ``elements`` over ``G`` grids: pricing each stage on
    each grid (``OPTION_S``), and the min-plus products: ``1 x G x G`` along the top-level chain,
    ``G x G x G`` inside a residual block (its body, its shortcut and their join).  A plain chain (cosmoflow)
    costs O(G) per stage; a residual network O(G^3) per block: the number of grids alone does not tell."""
    n_stages = sum(1 for _ in graph.stages(elements))
    squares, cubes = _products(elements, top=True)
    return n_stages * G * OPTION_S + (squares * G ** 2 + cubes * G ** 3) * MINPLUS_TERM_S


def _products(elements, top):
    """``(squares, cubes)``: the (1, G) x (G, G) and (G, G) x (G, G) min-plus products of one search of
    a chain (``Planner.chain``: the top-level chain starts from a row, a block's from nothing)."""
    squares = cubes = 0
    for i, e in enumerate(elements):
        if i > 0 or top:
            squares, cubes = (squares + 1, cubes) if top else (squares, cubes + 1)
        if isinstance(e, Block):
            _, body = _products(e.body, top=False)
            _, short = _products(e.shortcut, top=False)
            cubes += body + short + (1 if e.shortcut else 0)
    return squares, cubes


def _refuse(P, ndim, seconds, estimate):
    """TooLarge: a search of ``P`` ranks estimated at ``seconds``; ``estimate(G)``: the same for G grids."""
    fits = [p for p in range(1, P) if p & (p - 1) == 0 and estimate(len(perf.grids(p, ndim))) <= SEARCH_BUDGET_S]
    hint = f" (e.g. {fits[-1]}: {len(perf.grids(fits[-1], ndim))} grids)" if fits else ""
    raise TooLarge(f"--ranks: {P} ranks factor into {len(perf.grids(P, ndim))} grids ({' x '.join(axes_of(ndim))}), "
                   f"a search estimated at {seconds:.0f} s, more than the {SEARCH_BUDGET_S:.0f} s the planner "
                   f"allows; choose a rank count with fewer factors{hint}")


def minplus(A, B):
    """``(C, argmin)`` with ``C[i, j] = min_k A[i, k] + B[k, j]`` (infinite where no k is finite).

    Only the ``k`` finite somewhere in both and the columns finite somewhere in ``B``
    take part: a grid that cannot run a stage is infinite in its whole column.
    """
    R, G = A.shape[0], B.shape[1]
    out, arg = numpy.full((R, G), numpy.inf), numpy.zeros((R, G), dtype=numpy.int64)
    ks = numpy.flatnonzero(numpy.isfinite(A).any(axis=0) & numpy.isfinite(B).any(axis=1))
    js = numpy.flatnonzero(numpy.isfinite(B).any(axis=0))
    if not len(ks) or not len(js):
        return out, arg
    A_k, B_kj = A[:, ks], B[numpy.ix_(ks, js)]
    step = max(1, 4_000_000 // B_kj.size)
    for s in range(0, R, step):
        t = A_k[s:s + step, :, None] + B_kj[None, :, :]  # (rows, k, j)
        best = t.argmin(axis=1)
        out[s:s + step, js] = numpy.take_along_axis(t, best[:, None, :], axis=1)[:, 0, :]
        arg[s:s + step, js] = ks[best]
    return out, arg


@dataclasses.dataclass
class Row:
    """One line of the plan: a stage (or a block's sum), its cost, the shuffle into it."""

    name: str
    kind: str
    cost: perf.StageCost
    shape: tuple


@dataclasses.dataclass
class Plan:
    rows: list
    choices: dict  # stage path -> StageCost
    ranks: int
    input_shape: tuple
    hidden: float = 1.0  # the share of each gradient allreduce the machine overlaps (Machine.overlap)
    input_grid: tuple = None  # the grid the model's input lies on (the first stage's, or a leading block's input)

    @property
    def seconds(self):
        return sum(r.cost.seconds for r in self.rows)

    @property
    def grad_seconds(self):
        return sum(r.cost.grad for r in self.rows)

    @property
    def memory(self):
        return sum(r.cost.memory for r in self.rows) + max(r.cost.workspace for r in self.rows)

    @property
    def overlapped_seconds(self):
        return perf.overlapped_step([r.cost for r in self.rows], self.hidden)

    @property
    def halo_hidden_seconds(self):
        """Seconds of the halo exchanges and returns that overlap hides (part of the overlapped step)."""
        return sum(r.cost.hidden_fwd + r.cost.hidden_bwd for r in self.rows)

    def comm(self, kind):
        return sum(r.cost.comm.get(kind, 0.0) for r in self.rows)

    @property
    def compute_seconds(self):
        return sum(r.cost.fwd + r.cost.bwd for r in self.rows)


class Planner:
    """Plans ``spec`` (a dict) for ``ranks`` ranks and a global input ``(N, C, H, W)``, or for a
    model of volumes ``(N, C, D, H, W)`` on grids ``(P_N, P_c, P_D, P_H, P_W)``."""

    def __init__(self, spec, input_shape, ranks, machine, progress=None, every_s=PROGRESS_S):
        self.ndim = graph.dims_of(spec) + 2  # axes of a grid: one per axis of the activations
        check_ranks(ranks, self.ndim)
        self.spec, self.input_shape, self.P, self.machine = spec, tuple(input_shape), ranks, machine
        self.elements = graph.bind(spec, self.input_shape)
        self.grids = perf.grids(ranks, self.ndim)
        seconds = work_estimate(self.elements, len(self.grids))
        if seconds > SEARCH_BUDGET_S:
            _refuse(ranks, self.ndim, seconds, lambda G: work_estimate(self.elements, G))
        self._options, self._shuffles = {}, {}
        # progress(text) every every_s seconds while searching (None: silent)
        self._say, self._every, self._started = progress, every_s, time.monotonic()
        self._last, self._passes, self._done = self._started, 0, 0
        self._total = sum(1 for _ in graph.stages(self.elements))

    def _tick(self, what, total):
        """One more of ``total`` stages (or grids) done: a progress line when ``every_s`` has passed."""
        self._done += 1
        now = time.monotonic()
        if self._say is not None and now - self._last >= self._every:
            self._last = now
            self._say(f"refconv plan: {self.P} ranks, {len(self.grids)} grids: {what} {self._done}/{total} "
                      f"({now - self._started:.0f} s)")

    # -- costs ---------------------------------------------------------------------------------------
    def options(self, stage):
        """Per grid index, the list of StageCosts (cached by the stage's layers and shapes)."""
        key = repr([(l.kind, sorted((k, str(v)) for k, v in l.spec.items() if k not in ("grid", "algorithm",
                    "filter_groups")), l.in_shape) for l in stage.layers])
        if key not in self._options:
            self._options[key] = [perf.stage_options(stage, g, self.machine) for g in self.grids]
        return self._options[key]

    def shuffle(self, shape):
        if shape not in self._shuffles:
            self._shuffles[shape] = shuffle_matrix(shape, self.grids, self.machine)
        return self._shuffles[shape]

    def best(self, stage, lam):
        """(costs vector (G,), chosen StageCost per grid) under objective time + lam * memory."""
        vec, pick = numpy.full(len(self.grids), numpy.inf), [None] * len(self.grids)
        for i, opts in enumerate(self.options(stage)):
            if opts:
                pick[i] = min(opts, key=lambda c: c.seconds + lam * (c.memory + c.workspace))
                vec[i] = pick[i].seconds + lam * (pick[i].memory + pick[i].workspace)
        return vec, pick

    def block_extra(self, block, lam):
        """Seconds (and lam x memory) on the exit grid: the sum, and the layers after the block."""
        vec = numpy.array([perf.add_seconds(block.out_shape, g, self.machine) for g in self.grids])
        for layer in block.followers:
            v, _ = self.best(Stage(layer, []), lam)
            vec = vec + v
        return vec

    # -- the dynamic programme -----------------------------------------------------------------------
    def chain(self, elements, shape, M, lam):
        """Extend ``M`` (None: the identity, (G, G)) through ``elements``; returns (M, trace)."""
        trace = []
        for e in elements:
            if isinstance(e, Stage):
                vec, pick = self.best(e, lam)
                self._tick(f"search {self._passes}, stage", self._total)
                step = self.shuffle(e.in_shape) + vec[None, :]
                if M is None:
                    M, arg = step, None
                else:
                    M, arg = minplus(M, step)
                trace.append((e, arg, pick))
            else:
                B, inner = self.block(e, lam)
                if M is None:
                    M, arg = B, None
                else:
                    M, arg = minplus(M, B)
                trace.append((e, arg, inner))
        return M, trace

    def block(self, block, lam):
        body, body_trace = self.chain(block.body, block.in_shape, None, lam)
        end = self.shuffle(block.out_shape)
        if block.shortcut:
            short, short_trace = self.chain(block.shortcut, block.in_shape, None, lam)
            short, short_arg = minplus(short, end)
        else:
            short, short_trace, short_arg = end, [], None
        extra = self.block_extra(block, lam)
        return body + short + extra[None, :], (body_trace, short_trace, short_arg)

    def backtrack(self, trace, row, last, out):
        """Fill ``out`` {stage path: grid index} walking ``trace`` back from grid ``last``; returns the
        grid index the walk ends on (that of the chain's input)."""
        for e, arg, info in reversed(trace):
            prev = row if arg is None else arg[row, last]
            if isinstance(e, Stage):
                out[e.main.path] = info[last]
            else:
                body_trace, short_trace, short_arg = info
                self.backtrack(body_trace, prev, last, out)
                if short_trace:
                    self.backtrack(short_trace, prev, short_arg[prev, last], out)
            last = prev
        return last

    def search(self, lam=0.0):
        """``({stage path: StageCost}, input grid)`` of the optimum under time + lam * memory; the input
        grid is None unless the model opens with a block (else the first stage's grid)."""
        self._passes, self._done = self._passes + 1, 0
        M, trace = self.chain(self.elements, self.input_shape, numpy.zeros((1, len(self.grids))), lam)
        last = int(numpy.argmin(M[0]))
        if not numpy.isfinite(M[0, last]):
            raise NoFeasiblePlan(f"--ranks: no grid of {self.P} ranks runs every layer of this model "
                                 f"(each layer needs sample <= batch, channel <= its channels, and "
                                 f"{'/'.join(axes_of(self.ndim)[2:])} blocks of at least max(kernel, 2) rows)")
        choices = {}
        first = self.backtrack(trace, 0, last, choices)
        return choices, (self.grids[first] if isinstance(self.elements[0], Block) else None)

    def plan(self, memory_limit=None):
        """The fastest plan (exact), or under ``memory_limit`` bytes a plan that fits (see above)."""
        result = self.evaluate(*self.search(0.0))
        if memory_limit is None or result.memory <= memory_limit:
            return result
        # lambda in seconds per byte, from a scale where the penalty is 1/1000 of the step
        lam, fits = 1e-3 * result.seconds / result.memory, None
        for _ in range(12):  # raise lambda until the plan fits (up to 4**11 times the start)
            candidate = self.evaluate(*self.search(lam))
            if candidate.memory <= memory_limit:
                fits = candidate
                break
            lam *= 4
        if fits is None:
            raise NoFeasiblePlan(f"--memory-per-rank: no plan on {self.P} ranks fits {memory_limit / 2**30:.3g} GiB "
                                 f"per rank (the leanest needs {candidate.memory / 2**30:.3g} GiB); add ranks or "
                                 f"lower the batch")
        hi, lo = lam, lam / 4
        for _ in range(6):  # tighten lambda: the least penalty that still fits is the fastest of these
            mid = math.sqrt(hi * lo)
            candidate = self.evaluate(*self.search(mid))
            if candidate.memory <= memory_limit:
                hi, fits = mid, candidate
            else:
                lo = mid
        return fits

    # -- any assignment --------------------------------------------------------------------------------
    def evaluate(self, choices, input_grid=None):
        """The Plan of ``choices`` ({stage path: StageCost}): every stage and shuffle, in order.  The
        input lies on the first stage's grid (the loader scatters it there), or, where the model
        opens with a block, on ``input_grid`` (None: its first stage's grid too)."""
        rows = []
        if input_grid is None or not isinstance(self.elements[0], Block):
            input_grid = choices[next(graph.stages(self.elements)).main.path].grid
        self._walk(self.elements, input_grid, choices, rows)
        return Plan(rows, choices, self.P, self.input_shape, self.machine.overlap, input_grid)

    def _walk(self, elements, grid, choices, rows):
        for e in elements:
            if isinstance(e, Stage):
                cost = copy.deepcopy(choices[e.main.path])
                if grid != cost.grid:
                    shuffle = self.shuffle(e.in_shape)[self.grids.index(grid), self.grids.index(cost.grid)]
                    cost.comm["alltoallv"] = cost.comm.get("alltoallv", 0.0) + shuffle
                rows.append(Row(e.name, e.main.kind, cost, e.out_shape))
                grid = cost.grid
            else:
                out = self._walk(e.body, grid, choices, rows)
                end = self._walk(e.shortcut, grid, choices, rows) if e.shortcut else grid
                cost = perf.StageCost(out)
                cost.fwd = cost.bwd = perf.add_seconds(e.out_shape, out, self.machine) / 2
                if end != out:
                    cost.comm["alltoallv"] = self.shuffle(e.out_shape)[self.grids.index(end), self.grids.index(out)]
                for layer in e.followers:
                    cost.add(perf.stage_options(Stage(layer, []), out, self.machine)[0])
                rows.append(Row(e.name, "residual", cost, e.out_shape))
                grid = out
        return grid

    def of_spec(self, planned):
        """The Plan of a planned model file's own strategy (:func:`to_spec`'s dict: each stage's
        ``grid`` and conv ``algorithm``), each stage priced as the search prices that choice, so
        ``refconv simulate`` can set a planned file's clocked step beside its prediction.  A
        ValueError names the stage whose grid or algorithm this world cannot run."""
        axes, choices = axes_of(self.ndim), {}
        for stage in graph.stages(self.elements):
            node = planned
            for p in stage.main.path:
                node = node[p]
            grid = tuple((node.get("grid") or {}).get(a, 1) for a in axes)
            if grid not in self.grids:
                raise ValueError(f"model: stage {stage.name}'s grid {grid_dict(grid)} does not multiply to "
                                 f"{self.P} ranks (a file planned for another rank count?)")
            opts = self.options(stage)[self.grids.index(grid)]
            asked = node.get("algorithm")
            match = [c for c in opts if asked is None or _runs(c, asked, node.get("filter_groups"), grid)]
            if not match:
                raise ValueError(f"model: stage {stage.name} cannot run {asked or 'any algorithm'} on "
                                 f"{grid_dict(grid)}")
            choices[stage.main.path] = match[0]
        default = (planned.get("defaults") or {}).get("grid") or {}
        input_grid = tuple(default.get(a, 1) for a in axes)
        return self.evaluate(choices, input_grid if input_grid in self.grids else None)

    def uniform(self, grid, algorithm=None, filter_groups=None):
        """Every stage on ``grid`` (a stage that cannot split channels on ``grid`` folds the
        channel ranks into the sample axis, as the presets' "no-channel" stems do); None if
        some stage runs on neither."""
        folded = (grid[0] * grid[1], 1) + tuple(grid[2:])
        choices = {}
        for stage in graph.stages(self.elements):
            for g in (grid, folded):
                opts = self.options(stage)[self.grids.index(g)]
                if opts:
                    match = [c for c in opts if _runs(c, algorithm, filter_groups, g)]
                    if match:
                        choices[stage.main.path] = match[0]
                        break
            else:
                return None
        return self.evaluate(choices, grid)  # the input on the grid (a leading block's: --grid's)

    def sample_parallel(self):
        """Pure sample parallelism, every stage on ``(P, 1, ...)`` (None where it cannot run)."""
        return self.uniform((self.P,) + (1,) * (self.ndim - 1), "stationary-x")

    def best_uniform(self):
        """(label, Plan): the fastest single strategy used for every layer."""
        best, self._done = None, 0
        for g in self.grids:
            self._tick("the best single strategy, grid", len(self.grids))
            algos = perf.candidates(g[1]) if g[1] > 1 else [("stationary-x", None)]
            for algorithm, p_f in algos:
                plan = self.uniform(g, algorithm, p_f)
                if plan is not None and (best is None or plan.seconds < best[1].seconds):
                    best = (strategy_label(g, algorithm if g[1] > 1 else None, p_f), plan)
        return best


def _runs(cost, algorithm, filter_groups, grid):
    """Is ``cost`` (a StageCost) what asking for ``algorithm`` (and ``filter_groups``) runs on
    ``grid``?  A grouped layer runs "grouped" whatever is asked, or X, Y or W within its groups
    (the baseline's W asks for a ``p_f`` of ``P_c``; within a group it matches only where equal)."""
    if cost.algorithm is None or (grid[1] == 1 and cost.algorithm == "stationary-x") or cost.algorithm == "grouped":
        return True
    if cost.algorithm == "stationary-w":
        return algorithm == "stationary-w" and cost.filter_groups == filter_groups
    return algorithms.asked_as(cost.algorithm) == algorithm


def strategy_label(grid, algorithm=None, filter_groups=None):
    parts = [f"{a[0]}{p}" for a, p in zip(axes_of(grid), grid) if p > 1] or ["serial"]
    label = "x".join(parts)
    if algorithm and grid[1] > 1:
        label += " " + algorithm.replace("stationary-", "") + (f"(pf={filter_groups})" if filter_groups else "")
    return label


def grid_dict(grid):
    return {a: p for a, p in zip(axes_of(grid), grid) if p > 1} or {"sample": 1}


def to_spec(spec, plan):
    """A copy of ``spec`` with every stage's ``grid`` (and conv ``algorithm``) set from ``plan``."""
    out = copy.deepcopy(spec)
    elements = graph.bind(spec, plan.input_shape)
    # a block's input lies on defaults.grid when the model opens with it (model_spec's rule)
    opens_with_block = isinstance(elements[0], Block)
    out["defaults"] = {"grid": grid_dict(plan.input_grid) if opens_with_block else {"sample": plan.ranks}}
    out.setdefault("name", "model")
    out["name"] = f"{out['name']}-planned-{plan.ranks}"

    def at(path):
        node = out
        for p in path:
            node = node[p]
        return node

    for stage in graph.stages(elements):
        cost = plan.choices[stage.main.path]
        main = at(stage.main.path)
        main["grid"] = grid_dict(cost.grid)
        main.pop("algorithm", None)
        main.pop("filter_groups", None)
        if stage.main.kind == "conv" and cost.grid[1] > 1:
            main["algorithm"] = algorithms.asked_as(cost.algorithm)  # "grouped-y" runs when "stationary-y" is asked
            if cost.filter_groups:
                main["filter_groups"] = cost.filter_groups
        for layer in stage.followers:
            node = at(layer.path)
            node.pop("grid", None)
            if layer.kind == "linear":
                node["grid"] = grid_dict(cost.grid)
    for path in _block_follower_paths(elements):
        at(path).pop("grid", None)
    return out


def _block_follower_paths(elements):
    for e in elements:
        if isinstance(e, Block):
            yield from (l.path for l in e.followers)
            yield from _block_follower_paths(e.body)
            yield from _block_follower_paths(e.shortcut)


def plan_model(spec, input_shape, ranks, machine, memory_limit=None, progress=None):
    """``(planner, plan)`` for ``spec`` (a dict) on ``ranks`` ranks; see :class:`Planner`."""
    planner = Planner(spec, input_shape, ranks, machine, progress)
    return planner, planner.plan(memory_limit)
