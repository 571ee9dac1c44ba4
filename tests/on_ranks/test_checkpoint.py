"""Checkpoints across ranks: save on one grid/algorithm, load on another (resharding),
and a corrupt shard raises on every rank instead of hanging.

On simulated ranks (refconv.simulated) of 1 to 4 (TwoConvs has 4 input channels, split up to
4 ways), in pytest's tmp_path.  A simulated rank cannot use ``MPI.COMM_SELF`` (refconv's
collectives refuse a real communicator there), so the one-rank side of a reshard runs on the
rank's own one-rank communicator, ``collectives.comm_self()``.  tests/mpiexec/launched/test_checkpoint.py
runs the same checks (the functions of ``comm`` and a folder here) on real processes, at 2 and 3
ranks.
"""

import os

import numpy

from refconv import checkpoint, collectives
from refconv.checkpoint import CheckpointError
from refconv.grid import ProcessGrid
from refconv.optim import SGD
from refconv.sharding import allgather
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.models import TwoConvs
from refconv.testing.ranks import on_ranks


def trained(grid, **kw):
    """A model and optimizer after one step with rank-independent gradients."""
    model = TwoConvs(grid, **kw)
    opt = SGD(model, lr=0.1, momentum=0.9)
    for i, (_, layer, pname) in enumerate(model.named_parameters()):
        setattr(layer, f"{pname}_grad", layer.parameters()[pname] * (i + 1.0) + 0.5)
    opt.step()
    return model, opt


def global_state(model, opt):
    """Every parameter and momentum buffer, gathered to its global 4-D array on every rank."""
    out = {}
    for q, layer, p in model.named_parameters():
        dist = layer.parameter_distributions()[p]
        shape4 = dist.local_shape(layer.grid.rank)
        out[q] = allgather(layer.parameters()[p].reshape(shape4), dist, layer.grid)
        if opt is not None:
            out["momentum/" + q] = allgather(opt.state()[q].reshape(shape4), dist, layer.grid)
    return out


def grids(comm):
    """(grid, model kwargs) pairs over ``comm`` that lay the parameters out differently."""
    P = comm.size
    out = [(ProcessGrid(comm, channel=P), dict(algorithm="stationary-x")),
           (ProcessGrid(comm, channel=P), dict(algorithm="stationary-y")),
           (ProcessGrid(comm, sample=P), dict())]
    if P % 2 == 0:
        out.append((ProcessGrid(comm, sample=2, channel=P // 2), dict(algorithm="stationary-y")))
        out.append((ProcessGrid(comm, channel=P), dict(algorithm="stationary-w", filter_groups=2)))
    return out


def reshard_between_grids(comm, folder):
    """Saved on each layout of ``grids``, loaded on each: the same global state, step and extra."""
    layouts = grids(comm)
    for i, (grid_a, kw_a) in enumerate(layouts):
        directory = os.path.join(folder, f"from-{i}")
        model, opt = trained(grid_a, **kw_a)
        want = global_state(model, opt)
        checkpoint.save(directory, model, opt, step=11, extra={"from": i})
        for grid_b, kw_b in layouts:
            other = TwoConvs(grid_b, seed=7, **kw_b)
            other_opt = SGD(other, lr=0.1, momentum=0.9)
            step, extra = checkpoint.load(directory, other, other_opt)
            got = global_state(other, other_opt)
            bad = [k for k in want if not numpy.array_equal(want[k], got[k])]
            assert_all_ranks(comm, (step, extra) == (11, {"from": i}) and not bad,
                             f"{kw_a} {grid_a.shape} -> {kw_b} {grid_b.shape}: differ {bad}")


def reshard_to_one_rank(comm, folder, alone):
    """Save on all ranks, load on each rank's one-rank communicator ``alone``, and back (saved by
    rank 0 alone)."""
    directory, directory1 = os.path.join(folder, "all"), os.path.join(folder, "one")
    model, opt = trained(ProcessGrid(comm, channel=comm.size))
    want = global_state(model, opt)
    checkpoint.save(directory, model, opt, step=3)
    solo = TwoConvs(ProcessGrid(alone), seed=5)
    solo_opt = SGD(solo, lr=0.1, momentum=0.9)
    checkpoint.load(directory, solo, solo_opt)
    got = global_state(solo, solo_opt)
    assert_all_ranks(comm, all(numpy.array_equal(want[k], got[k]) for k in want), "P -> 1")

    if comm.rank == 0:
        checkpoint.save(directory1, solo, solo_opt, step=4)
    comm.Barrier()
    back = TwoConvs(ProcessGrid(comm, sample=comm.size // 2, channel=2), seed=6)
    back_opt = SGD(back, lr=0.1, momentum=0.9)
    step, _ = checkpoint.load(directory1, back, back_opt)
    got = global_state(back, back_opt)
    assert_all_ranks(comm, step == 4 and all(numpy.array_equal(want[k], got[k]) for k in want),
                     "1 -> P")


def damaged_shard_raises(comm, directory):
    """A corrupt, then a missing shard: load raises the same error on every rank, the model untouched."""
    grid = ProcessGrid(comm, channel=comm.size)
    model, opt = trained(grid)
    checkpoint.save(directory, model, opt, step=1)
    last = os.path.join(directory, checkpoint.shard_name(comm.size - 1, comm.size, 1, save=1))
    # a sample-parallel model needs only shard 0, yet the corrupt last shard is still found
    loaders = [TwoConvs(grid, seed=3), TwoConvs(ProcessGrid(comm, sample=comm.size), seed=3)]
    for damage, match in (("flip", "corrupt shard"), ("delete", "missing shard")):
        comm.Barrier()
        if comm.rank == 0:
            if damage == "flip":
                blob = bytearray(open(last, "rb").read())
                blob[100] ^= 0xFF
                open(last, "wb").write(bytes(blob))
            else:
                os.remove(last)
        comm.Barrier()
        for other in loaders:
            before = global_state(other, None)
            try:
                checkpoint.load(directory, other)
                message = None
            except CheckpointError as exc:
                message = str(exc)
            after = global_state(other, None)
            messages = comm.allgather(message)
            assert_all_ranks(comm, message is not None and match in message
                             and len(set(messages)) == 1
                             and all(numpy.array_equal(before[k], after[k]) for k in before),
                             f"{damage}: {message!r}")


def nonfinite_never_saved(comm, directory):
    """A NaN in one rank's shard: save raises on every rank before writing, naming the
    tensor, and the committed checkpoint and its files stay as they were."""
    model, opt = trained(ProcessGrid(comm, channel=comm.size))
    checkpoint.save(directory, model, opt, step=1)
    files = sorted(os.listdir(directory))
    manifest = open(os.path.join(directory, checkpoint.MANIFEST)).read()
    _, layer, pname = next(iter(model.named_parameters()))
    if comm.rank == comm.size - 1:
        layer.parameters()[pname].flat[0] = numpy.nan
    try:
        checkpoint.save(directory, model, opt, step=2)
        message = None
    except CheckpointError as exc:
        message = str(exc)
    messages = comm.allgather(message)
    comm.Barrier()
    assert_all_ranks(comm, message is not None and "not finite" in message and f"rank {comm.size - 1}" in message
                     and len(set(messages)) == 1 and sorted(os.listdir(directory)) == files
                     and open(os.path.join(directory, checkpoint.MANIFEST)).read() == manifest, repr(messages))


# -- on simulated ranks -------------------------------------------------------------------------------------
@on_ranks(1, 2, 3, 4)
def test_reshard_between_grids_and_algorithms(comm, tmp_path):
    reshard_between_grids(comm, str(tmp_path))


@on_ranks(2, 4)
def test_reshard_to_a_different_world_size(comm, tmp_path):
    reshard_to_one_rank(comm, str(tmp_path), collectives.comm_self())  # what MPI.COMM_SELF is under mpiexec


@on_ranks(2, 3, 4)
def test_corrupt_or_missing_shard_raises_on_every_rank(comm, tmp_path):
    damaged_shard_raises(comm, str(tmp_path))


@on_ranks(1, 2, 3, 4)
def test_a_nonfinite_tensor_is_never_saved(comm, tmp_path):
    nonfinite_never_saved(comm, str(tmp_path))
