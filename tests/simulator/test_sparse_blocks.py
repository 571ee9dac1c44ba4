"""A simulated Alltoallv moves only its non-empty blocks (``buffers.blocks``, ``engine._blocks``).

At scale a shuffle between grids sends to a few of K ranks: the other K - few blocks of every rank
are empty.  These tests check that the empty blocks cost no region and no delivery (counted, not
timed), and that what the dense delivery caught is still caught: a block that carries bytes into an
empty one, an empty one into a block that expects bytes, a displacement past the buffer.
"""

import gc
import weakref

import numpy
import pytest

from refconv import simulated
from refconv.shapes.namespace import xp as shapes_xp
from refconv.simulated import buffers


def run(fn, ranks, **kw):
    return simulated.run(fn, ranks, timeout=120, **kw)


def ring(comm, xp, n=3, recv_from=None):
    """Rank r sends ``n`` values r to rank r+1 and receives them from ``recv_from(r)`` (r-1 by
    default; None: from no rank)."""
    k, r = comm.size, comm.rank
    source = (r - 1) % k if recv_from is None else recv_from(r)
    send, recv = (numpy.full(n, float(r)), numpy.zeros(n)) if xp is numpy else (xp.empty(n), xp.empty(n))
    scounts, rcounts = [0] * k, [0] * k
    scounts[(r + 1) % k] = n
    if source is not None:
        rcounts[source] = n
    zeros = [0] * k
    comm.Alltoallv([send, (scounts, zeros)], [recv, (rcounts, zeros)])
    return recv


def test_a_ring_moves_each_block_to_its_rank():
    got = run(lambda comm: ring(comm, numpy).tolist(), 8)
    assert got == [[float((r - 1) % 8)] * 3 for r in range(8)]


@pytest.mark.parametrize("ranks", [16, 64])
def test_empty_blocks_make_no_region_and_are_not_delivered(ranks, monkeypatch):
    made, moved = [], []

    class Counted(buffers.Region):
        def __init__(self, *args):
            made.append(1)
            super().__init__(*args)

        def write(self, payload):
            moved.append(1)
            super().write(payload)
    monkeypatch.setattr(buffers, "Region", Counted)
    run(lambda comm: ring(comm, numpy), ranks)
    assert len(made) == 2 * ranks       # one send and one receive region a rank, whatever K
    assert len(moved) == ranks          # one block delivered a rank


@pytest.mark.parametrize("ranks", [16, 64])
def test_a_shapes_only_buffer_makes_no_region_and_delivers_its_blocks_only(ranks, monkeypatch):
    made, moved = [], []

    class Counted(buffers.Block):
        __slots__ = ()

        def write(self, payload):
            moved.append(payload.size)
            super().write(payload)
    monkeypatch.setattr(buffers, "Region", lambda *args: made.append(1))
    monkeypatch.setattr(buffers, "Block", Counted)
    run(lambda comm: ring(comm, shapes_xp), ranks)
    assert made == [] and moved == [3 * 8] * ranks    # float64 blocks of 3: one delivered a rank


def test_bytes_into_an_empty_receive_block_are_an_error_naming_it():
    # rank 0 sends to rank 1, which receives from no rank
    with pytest.raises(ValueError, match=r"rank 0 sends 3 x MPI_DOUBLE \(float64\) \(24 bytes\) to rank 1, which receives 0 x MPI_DOUBLE \(float64\) \(0 bytes\) from it: the counts differ"):
        run(lambda comm: ring(comm, numpy, recv_from=lambda r: None if r == 1 else (r - 1) % comm.size), 4)


def test_nothing_into_a_receive_block_that_expects_bytes_is_an_error_naming_it():
    # rank 1 receives from rank 2, which sends to rank 3 only
    with pytest.raises(ValueError, match=r"rank 0 sends 3 x MPI_DOUBLE \(float64\) \(24 bytes\) to rank 1, which receives 0 x MPI_DOUBLE \(float64\) \(0 bytes\) from it: the counts differ"):
        run(lambda comm: ring(comm, numpy, recv_from=lambda r: 2 if r == 1 else (r - 1) % comm.size), 4)


def test_an_empty_block_past_the_buffer_is_an_error():
    def body(comm):
        k = comm.size
        displs = [0] * k
        displs[(comm.rank + 2) % k] = 10          # an empty block's displacement beyond 3 elements
        scounts = [0] * k
        scounts[(comm.rank + 1) % k] = 3
        comm.Alltoallv([numpy.ones(3), (scounts, displs)], [numpy.zeros(3), (scounts[::-1], [0] * k)])
    with pytest.raises(ValueError, match=r"Alltoallv send on rank \d of 'world' block \d: the message reaches byte 80 of a buffer of 24"):
        run(body, 4)


def test_a_calls_buffers_are_freed_at_once_not_by_the_garbage_collector():
    """No reference cycle through a call's blocks: a rank's buffers go when it drops them (the memory
    tracker of shapes-only runs counts a free when it happens, not at the next collection)."""
    def body(comm):
        k, r = comm.size, comm.rank
        send, recv = numpy.ones(3), numpy.zeros(3)
        counts = [0] * k
        counts[(r + 1) % k] = 3
        rcounts = [0] * k
        rcounts[(r - 1) % k] = 3
        comm.Alltoallv([send, (counts, [0] * k)], [recv, (rcounts, [0] * k)])
        refs = weakref.ref(send), weakref.ref(recv)
        del send, recv
        return [ref() is None for ref in refs]
    enabled = gc.isenabled()
    gc.disable()
    try:
        assert run(body, 8) == [[True, True]] * 8
    finally:
        if enabled:
            gc.enable()
