"""Check a distributed layer against the serial reference, on every rank.

``check_layer(layer, problem)`` drives a convolution layer (a
:class:`refconv.layers.Layer` such as :class:`refconv.DistConv2d`, with any
registered algorithm, or :class:`refconv.DistConv3d` with a
:class:`refconv.testing.strategies.Conv3dProblem`) through:

- ``layer.grid`` (a :class:`refconv.ProcessGrid`), ``layer.backend``, ``layer.set_global_parameters(w, b)``,
- ``layer.bind(x_shape)``, ``layer.input_distribution``, ``layer.output_distribution``,
- ``layer.forward(x_loc) -> y_loc``, ``layer.backward(dy_loc) -> dx_loc``,
- ``layer.global_parameter_grads() -> (dw, db)``.

Every rank draws the same global ``x, w, b, dy`` from ``seed``, takes its blocks,
runs the layer, allgathers ``y`` and ``dx``, and compares ``y, dx, dw, db`` with
:mod:`refconv.reference`.  The tolerance grows with each result's reduction
length; a mismatch raises AssertionError on every rank (so all ranks stay in step),
with one report: the tensor, the first mismatching indices, and, through the
tensor's distribution, the rank whose block holds the wrong elements
(:func:`blame`): a bug on rank 2 alone is reported as rank 2's, though the gathered
result differs on every rank.

``check_records(comm, run, expected)`` asserts that the calls ``run()`` makes through
:mod:`refconv.collectives` are the ``expected`` records, call for call.
"""

import functools
import math
import traceback

import numpy

from refconv import collectives, reference as ref
from refconv.grid import ProcessGrid
from refconv.layers import DistConv2d, DistConv3d
from refconv.algorithms.base import Call
from refconv.arrays import to_host
from refconv.sharding import allgather
from refconv.simulated.poison import poisoned
from refconv.testing.asserts import (assert_all_ranks, caught, close_message, collective_assert_close, default_tolerance,
                                     rank_list, tolerance)

# float32 results are compared with the reference run in float32 too: both round.
FLOAT32 = dict(factor=1e-4 / 4 / float(numpy.finfo(numpy.float32).eps), floor=1e-4)


def reduction_lengths(problem):
    """How many products each result sums: ``y``, ``dx``, ``dw``, ``db``."""
    p = problem
    taps, cells = math.prod(p.w_shape[2:]), math.prod(p.y_shape[2:])  # Kh Kw (Kd Kh Kw), Ho Wo (Do Ho Wo)
    return {
        "y": p.C // p.groups * taps,
        "dx": p.F // p.groups * taps,
        "dw": p.N * cells,
        "db": p.N * cells,
    }


def expected_results(problem, x, w, b, dy):
    """The serial reference's ``y, dx, dw, db`` (of a 3-D convolution for a 5-D ``x``)."""
    g = problem.geometry
    if x.ndim == 5:
        return {
            "y": ref.conv3d_forward(x, w, b, **g),
            "dx": ref.conv3d_backward_data(dy, w, x.shape, **g),
            "dw": ref.conv3d_backward_filter(x, dy, w.shape, **g),
            "db": ref.conv3d_backward_bias(dy),
        }
    return {
        "y": ref.conv2d_forward(x, w, b, **g),
        "dx": ref.conv2d_backward_data(dy, w, x.shape, **g),
        "dw": ref.conv2d_backward_filter(x, dy, w.shape, **g),
        "db": ref.conv2d_backward_bias(dy),
    }


@functools.lru_cache(maxsize=8)
def problem_and_reference(problem, seed):
    """``((x, w, b, dy), expected)``: the global arrays drawn from ``seed`` and the serial reference's
    results, made once per process and read-only: the ranks of a simulated world share them, as they
    would each have computed the same bits (a write to them raises)."""
    arrays = problem.arrays(seed)
    expected = expected_results(problem, *arrays)
    for a in (*arrays, *expected.values()):
        if a is not None:
            a.flags.writeable = False
    return arrays, expected


def run_layer(layer, problem, seed=0):
    """Run ``layer`` on the global arrays drawn from ``seed``; returns ``(actual, expected)`` dicts."""
    grid = layer.grid
    (x, w, b, dy), expected = problem_and_reference(problem, seed)
    layer.set_global_parameters(w, b)
    layer.bind(x.shape)
    to_device = layer.backend.asarray
    x_loc = to_device(layer.input_distribution.extract(x, grid.rank))
    y_loc = layer.forward(x_loc)
    dy_loc = to_device(layer.output_distribution.extract(dy, grid.rank))
    dx_loc = layer.backward(dy_loc)
    dw, db = layer.global_parameter_grads()
    actual = {
        "y": allgather(y_loc, layer.output_distribution, grid),
        "dx": allgather(dx_loc, layer.input_distribution, grid),
        "dw": dw,
        "db": db,
    }
    return actual, expected


def _span(pieces, length):
    """``:`` for a whole dim, ``4:6`` for one piece, ``[0:2, 6:8]`` for several."""
    if pieces == [(0, length)]:
        return ":"
    text = ", ".join(f"{s}:{e}" for s, e in pieces)
    return text if len(pieces) == 1 else f"[{text}]"


def blame(name, actual, expected, dist, *, rtol, atol):
    """Where the wrong elements of a gathered tensor lie: ``the wrong elements of y lie in rank 2's
    block (global [:, 4:6, :, :]); first local index (0, 1, 3, 2): yours 1.5, reference 0.5``.

    ``actual``/``expected``: the global tensor (``name``), gathered and the reference's; ``dist``: the
    layout it was gathered through (its shape, or ``(F,)`` viewed as ``(F, 1, 1, 1)``).
    Ranks that hold the same block (a replicated grid axis) are named together.  None when nothing
    differs, or when the wrong elements lie in every block (no one rank to blame)."""
    a, e = to_host(actual), to_host(expected)
    if a.shape != e.shape or a.size != math.prod(dist.global_shape):
        return None
    a, e = a.reshape(dist.global_shape), e.reshape(dist.global_shape)
    bad = ~numpy.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    blocks = {}                                   # the block's pieces per dim -> the ranks holding it
    for q in range(math.prod(dist.grid_shape)):
        key = tuple(tuple(dist.pieces(q, d)) for d in range(bad.ndim))
        blocks.setdefault(key, []).append(q)
    owners = [(key, ranks) for key, ranks in blocks.items() if bad[dist.index(ranks[0])].any()]
    if not owners or len(owners) == len(blocks):
        return None
    (key, ranks), where = owners[0], dist.index(owners[0][1][0])
    local = tuple(int(i) for i in numpy.argwhere(bad[where])[0])
    span = ", ".join(_span(list(p), n) for p, n in zip(key, dist.global_shape))
    block = f"{rank_list(ranks)}'s block" if len(ranks) == 1 else f"the block of {rank_list(ranks)}"
    first = (f"{block} (global [{span}]): {int(bad[where].sum())} of its {bad[where].size}; "
             f"first local index {local}: yours {a[where][local]}, reference {e[where][local]}")
    if len(owners) == 1:
        return f"the wrong elements of {name} lie in {first}"
    others = "; ".join(rank_list(r) for _, r in owners)
    return f"the wrong elements of {name} lie in the blocks of {others}; in {first}"


def _layouts(layer):
    """The distribution each gathered result of ``check_layer`` went through, where the layer says."""
    params = layer.parameter_distributions() if hasattr(layer, "parameter_distributions") else {}
    return {"y": layer.output_distribution, "dx": layer.input_distribution,
            "dw": params.get("weight"), "db": params.get("bias")}


def _poison(ours, expected):
    """On simulated ranks, where a nonblocking receive's buffer holds poison until its Wait
    (:mod:`refconv.simulated.poison`): a line saying so when poison the reference lacks reached ``ours``."""
    if collectives.local.simulated() is None or poisoned([expected]) or not poisoned([ours]):
        return ""
    return ("\n  it holds the poison of a simulated receive buffer (NaN, or an integer's extreme): a receive "
            "buffer read before its Wait")


def check_layer(layer, problem, *, seed=0, rtol=None, atol=None):
    """Assert, on every rank, that ``layer`` computes what the serial reference does.

    ``rtol``/``atol`` default to the reduction-aware tolerance of
    :func:`refconv.testing.asserts.default_tolerance`; float32 problems get a
    looser default (the reference then runs in float32 too).
    """
    comm = layer.grid.comm
    try:
        actual, expected = run_layer(layer, problem, seed)
        lengths = reduction_lengths(problem)
        problems = []
        for name in ("y", "dx", "dw", "db"):
            if actual[name] is None and expected[name] is not None and name == "db":
                continue  # a layer without bias
            kw = dict(reduction_length=lengths[name], name=name)
            if rtol is not None:
                kw["rtol"] = rtol
            if atol is not None:
                kw["atol"] = atol
            if problem.dtype == "float32" and rtol is None:
                kw["rtol"] = kw["atol"] = default_tolerance("float32", lengths[name], **FLOAT32)[0]
            ours = to_host(actual[name])
            msg = close_message(ours, expected[name], **kw)
            if msg:
                tol = dict(zip(("rtol", "atol"), tolerance(ours, expected[name], rtol=kw.get("rtol"),
                                                           atol=kw.get("atol"), reduction_length=lengths[name])))
                dist = _layouts(layer)[name]
                owner = dist and blame(name, ours, expected[name], dist, **tol)
                problems.append(msg + (f"\n  {owner}" if owner else "") + _poison(ours, expected[name]))
        message = "\n".join(problems)
    except Exception as exc:  # report a crash on one rank on every rank instead of hanging
        caught(exc)
        message = f"raised {exc!r}\n{traceback.format_exc()}"
    assert_all_ranks(comm, not message, f"{layer!r} on {problem}:\n{message}")
    return True


def case_layer(comm, case, backend="numpy"):
    """The layer of a drawn :class:`refconv.testing.strategies.DistConvCase` on ``comm``'s ranks: a
    DistConv2d, or a DistConv3d for a volume's problem, on the case's grid."""
    p = case.problem
    layer_class = DistConv3d if len(p.w_shape) == 5 else DistConv2d
    return layer_class(p.C, p.F, p.w_shape[2:], grid=ProcessGrid(comm, **case.grid_kwargs()), backend=backend,
                       **case.layer_kwargs())


def check_case(comm, case, backend="numpy"):
    """:func:`check_layer` of the case's layer (:func:`case_layer`), then its grid freed: the body a
    property test runs on every rank (``refconv.simulated.run(check_case, ranks, args=(case,))``)."""
    layer = case_layer(comm, case, backend)
    try:
        return check_layer(layer, case.problem)
    finally:
        layer.grid.free()


def _order(call):
    return call.kind, call.comm_size, call.bytes, call.messages


def measure_records(run):
    """The calls ``run()`` makes through :mod:`refconv.collectives`, in order, as
    :class:`refconv.algorithms.base.Call` (kind, communicator size, bytes, messages)."""
    with collectives.stats.recording() as region:
        run()
    return [Call(r.kind, r.comm_size, r.bytes, r.messages) for r in region.records]


def check_records(comm, run, expected, what="", *, ordered=True):
    """Run ``run()`` on every rank of ``comm`` and assert, on every rank alike, that the calls it
    makes (kind, communicator size, bytes and messages, in order) are the ``expected`` Calls:
    what a layer's ``records()`` (or a model's, summed over its layers) predicts and the
    planner prices.  ``ordered=False`` compares them as multisets (a model's records list
    each layer's forward and backward together; a step runs every forward first).
    Returns the measured Calls."""
    measured = measure_records(run)
    expected = [Call(c.kind, c.comm_size, c.bytes, c.messages) for c in expected]
    if not ordered:
        measured, expected = sorted(measured, key=_order), sorted(expected, key=_order)
    diff = next((i for i, (m, e) in enumerate(zip(measured, expected)) if m != e), min(len(measured), len(expected)))
    assert_all_ranks(comm, measured == expected,
                     f"{what}: the calls made differ from the records from call {diff} on:\n"
                     f"measured {measured[diff:diff + 4]} ({len(measured)} calls)\n"
                     f"records  {expected[diff:diff + 4]} ({len(expected)} calls)")
    return measured


def check_batch_norm(comm, layer, x, dy, gamma, beta):
    """``layer`` (a BatchNorm2d or BatchNorm3d bound to ``x``'s shape, float64) against refconv.reference's
    batch norm on the whole ``x``: y, dx, dgamma, dbeta and the running statistics after one training
    step, then the eval-mode output, and the calls of the step against ``layer.records()``.  Collective."""
    grid, dist, C = layer.grid, layer.input_distribution, x.shape[1]
    (c0, c1), = dist.pieces(grid.rank, 1)
    layer.weight[...], layer.bias[...] = gamma[c0:c1], beta[c0:c1]
    x_loc, dy_loc = dist.extract(x, grid.rank), layer.output_distribution.extract(dy, grid.rank)
    y_loc = layer.forward(x_loc)
    dx_loc = layer.backward(dy_loc)
    rm, rv = numpy.zeros(C), numpy.ones(C)
    suffix = "" if x.ndim == 4 else f"{x.ndim - 2}d"
    y, saved = getattr(ref, f"batch_norm{suffix}_forward")(x, gamma, beta, running_mean=rm, running_var=rv)
    dx, dgamma, dbeta = getattr(ref, f"batch_norm{suffix}_backward")(dy, x, gamma, saved)
    M = x.size // C
    channels = layer.parameter_distributions()["weight"]  # (C, 1, 1, 1) over the channel axis

    def vector(v):  # a rank's per-channel shard (C_i,) -> the global (C,)
        return allgather(numpy.ascontiguousarray(v.reshape(-1, 1, 1, 1)), channels, grid).reshape(-1)

    gathered = lambda local, d: allgather(numpy.ascontiguousarray(local), d, grid)  # noqa: E731
    for name, ours, expected in [("y", gathered(y_loc, layer.output_distribution), y),
                                 ("dgamma", vector(layer.weight_grad), dgamma), ("dbeta", vector(layer.bias_grad), dbeta),
                                 ("running_mean", vector(layer.running_mean), rm),
                                 ("running_var", vector(layer.running_var), rv)]:
        collective_assert_close(comm, ours, expected, reduction_length=M, name=name)
    # dx = gamma * invstd / M * (M dy - dbeta - xhat dgamma) cancels: with few elements per channel
    # (M = 2 makes xhat = +-sqrt(var / (var + eps))) the terms nearly cancel and dx keeps only the
    # difference.  Its rounding error is relative to the terms, so the absolute tolerance is too.
    per_channel = lambda v: v.reshape((1, C) + (1,) * (x.ndim - 2))  # noqa: E731
    mean, invstd = saved
    xhat = (x - per_channel(mean)) * per_channel(invstd)
    terms = abs(per_channel(gamma * invstd / M)) * (M * abs(dy) + abs(per_channel(dbeta)) + abs(xhat * per_channel(dgamma)))
    rtol, _ = default_tolerance(x.dtype, M)
    collective_assert_close(comm, gathered(dx_loc, dist), dx, rtol=rtol, atol=rtol * float(terms.max()), name="dx")
    layer.training = False  # eval mode normalises with the running statistics
    shape = (1, C) + (1,) * (x.ndim - 2)
    expected = (x - rm.reshape(shape)) / numpy.sqrt(rv.reshape(shape) + 1e-5) * gamma.reshape(shape) + beta.reshape(shape)
    collective_assert_close(comm, gathered(layer.forward(x_loc), layer.output_distribution), expected, name="y (eval)")
    layer.training = True
    check_records(comm, lambda: (layer.forward(x_loc), layer.backward(dy_loc)), layer.records(), repr(layer))

