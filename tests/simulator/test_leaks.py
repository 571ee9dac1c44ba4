"""Communicators, groups and datatypes a simulated rank never frees: one ResourceLeak warning per run
(refconv.simulated.leaks), naming each object, its rank and its line; refconv's own objects close."""

import re
import warnings

import numpy
import pytest
from mpi4py import MPI

import refconv
from refconv import simulated
from refconv.collectives import staging
from refconv.optim import SGD
from refconv.simulated import ResourceLeak, leaks
from refconv.train import stepping


def line_of(marker):
    """The line of this file that ends with the comment ``# marker``."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def leak_report(fn, ranks, **kwargs):
    """The one ResourceLeak warning's text of ``simulated.run(fn, ranks)`` (fails on none, or more than one;
    an exception of the run goes through)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulated.run(fn, ranks, **kwargs)
    leaked = [w for w in caught if issubclass(w.category, ResourceLeak)]
    assert len(leaked) == 1, [str(w.message) for w in leaked]
    return str(leaked[0].message)


def clean(fn, ranks, **kwargs):
    """``simulated.run`` with every warning an error: a freed object must not be reported."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return simulated.run(fn, ranks, **kwargs)


def rank_lines(report):
    return [line for line in report.splitlines() if re.match(r"rank \d+: ", line)]


@pytest.mark.parametrize("guilty", [0, 2, 3])
def test_a_leaked_split_names_its_rank_and_line(guilty):
    def body(comm):
        sub = comm.Split(comm.rank % 2, comm.rank)  # the split
        if comm.rank != guilty:
            sub.Free()

    report = leak_report(body, 4, stepped=True)
    lines = rank_lines(report)
    assert len(lines) == 1, report
    assert re.search(rf"\brank {guilty}\b", lines[0]), report
    assert f"communicator 'world/split {guilty % 2}' (Split)" in lines[0], report
    assert lines[0].endswith(f"test_leaks.py:{line_of('the split')}"), report


def test_a_leaked_dup_on_every_rank_is_one_warning_with_a_line_per_rank():
    def body(comm):
        comm.Dup()  # the dup

    lines = rank_lines(leak_report(body, 3))
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1", "rank 2"]
    assert all("(Dup), made at" in line and line.endswith(f"test_leaks.py:{line_of('the dup')}") for line in lines)


def test_leaked_groups_are_reported_and_freed_ones_are_not():
    def body(comm):
        group = comm.Get_group()
        pair = group.Incl([0, comm.size - 1])  # the incl
        group.Free()
        if comm.rank == 1:
            rest = pair.Excl([0])
            rest.Free()
        else:
            pair.Free()

    lines = rank_lines(leak_report(body, 3))
    assert lines == [f"rank 1: group of 2 ranks (Incl), made at {lines[0].split(' at ')[1]}"], lines
    assert lines[0].endswith(f"test_leaks.py:{line_of('the incl')}")


def test_a_derived_datatype_is_seen_at_its_first_use_and_reported_until_freed():
    """Unit level: what a simulated call does with each datatype it is handed (refconv.simulated.buffers.Region)."""
    def body(comm, free):
        vector = MPI.DOUBLE.Create_vector(2, 1, 3).Commit()
        leaks.datatype_used(vector)  # the first use
        leaks.datatype_used(vector)
        leaks.datatype_used(MPI.DOUBLE)          # predefined: nothing to free
        if free or comm.rank != 1:
            vector.Free()

    lines = rank_lines(leak_report(body, 2, args=(False,)))
    assert lines == [f"rank 1: datatype (vector, 16 bytes), first used at {lines[0].split(' at ')[1]}"], lines
    assert lines[0].endswith(f"test_leaks.py:{line_of('the first use')}")
    clean(body, 2, args=(True,))


def test_a_derived_datatype_handed_to_a_send_and_never_freed_is_reported():
    def body(comm):
        pairs = MPI.DOUBLE.Create_contiguous(2).Commit()
        buf = numpy.arange(4.0) if comm.rank == 0 else numpy.zeros(4)
        if comm.rank == 0:
            comm.Send([buf, 2, pairs], 1)  # the send
        else:
            comm.Recv([buf, 2, pairs], 0)
            pairs.Free()

    lines = rank_lines(leak_report(body, 2))
    assert lines == [f"rank 0: datatype (contiguous, 16 bytes), first used at {lines[0].split(' at ')[1]}"], lines
    assert lines[0].endswith(f"test_leaks.py:{line_of('the send')}")


def test_freed_communicators_and_created_ones_are_not_reported():
    def body(comm):
        for sub in (comm.Split(0, 0), comm.Dup(), comm.Split_type(MPI.COMM_TYPE_SHARED)):
            sub.Free()
        group = comm.Get_group()
        evens = group.Incl(list(range(0, comm.size, 2)))
        made = comm.Create(evens)
        if comm.rank % 2:
            assert made == MPI.COMM_NULL
        else:
            assert (made.size, made.rank) == (len(range(0, comm.size, 2)), comm.rank // 2)
            both = comm.Create_group(evens, tag=7)
            assert (both.size, both.rank) == (made.size, made.rank)
            both.Free()
            made.Free()
        for g in (evens, group):
            g.Free()
        collective_self = refconv.collectives.comm_self()    # the rank's own, like MPI.COMM_SELF: never a leak
        return collective_self.size

    assert clean(body, 4) == [1] * 4
    assert clean(body, 3, stepped=True) == [1] * 3


def test_a_failed_run_reports_its_failure_not_its_leaks():
    def body(comm):
        comm.Dup()
        if comm.rank == 1:
            raise ValueError("rank 1 stops here")
        comm.Barrier()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="rank 1 stops here"):
            simulated.run(body, 2)


def test_a_grid_closes_twice_and_a_with_block_frees_its_sub_communicators():
    def body(comm):
        grid = refconv.ProcessGrid(comm, sample=2, channel=comm.size // 2)
        grid.channel_comm, grid.axis_comm("sample")
        grid.close()
        grid.close()
        with refconv.ProcessGrid(comm, channel=comm.size) as other:
            channel_size = other.channel_comm.size                # read inside: after the block it is freed
        assert grid.channel_comm.size == comm.size // 2     # a closed grid used again builds its comm anew
        grid.free()
        return channel_size

    assert clean(body, 4) == [4] * 4

    def forgotten(comm):
        refconv.ProcessGrid(comm, channel=comm.size).channel_comm  # the grid's split

    lines = rank_lines(leak_report(forgotten, 2))
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1"]
    assert all(f"test_leaks.py:{line_of('the grid' + chr(39) + 's split')} (refconv/grid.py:" in line for line in lines)


def step(model):
    """One training step on a batch of 4 samples of 1 channel, 8 x 8: every grid's sub-communicators made."""
    x = numpy.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(numpy.float32)
    stepping.step(model, SGD(model, 0.1), x, numpy.arange(4) % 2)


SPEC = {"in_channels": 1, "defaults": {"grid": {"sample": 2}},
        "layers": [{"type": "conv", "out": 4, "kernel": 3, "padding": 1}, {"type": "relu"},
                   {"type": "conv", "out": 4, "kernel": 3, "padding": 1, "grid": {"channel": 2}},
                   {"type": "gap"}, {"type": "linear", "out": 2}]}


def test_a_model_in_a_with_block_frees_every_grid_it_built():
    def body(comm):
        with refconv.Model.from_spec(SPEC, comm=comm, backend="numpy") as model:
            step(model)
            grids = refconv.grid.grids_in(model)
        assert len(grids) == 2 and all(not g._cache for g in grids)
        model.close()                                        # twice: nothing left to free
        return len(grids)

    assert clean(body, 2) == [2, 2]

    def forgotten(comm):
        step(refconv.Model.from_spec(SPEC, comm=comm, backend="numpy"))

    assert len(rank_lines(leak_report(forgotten, 2))) >= 2


def test_the_block_type_cache_is_the_process_s_and_frees_on_request():
    """Under MPI (COMM_SELF here) the block datatypes are cached for the process; simulated ranks never fill it."""
    kept = staging.block_types(numpy.float32, 2, [1, 2], 3, 4)
    assert all(t and not t.is_predefined for t in kept)
    staging.free_block_types()
    staging.free_block_types()
    assert not staging._BLOCK_TYPES and not any(kept)

    def on_a_rank(comm):
        return staging.block_types(numpy.float32, 2, [1, 2], 3, 4)

    assert clean(on_a_rank, 2)[0] == [staging.BlockLayout(2, 12, 16), staging.BlockLayout(2, 24, 16)]
    assert not staging._BLOCK_TYPES
