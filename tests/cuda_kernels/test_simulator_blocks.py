"""refconv.kernels.simulator: the block scheduler that runs our kernels under Numba's CUDA simulator.

Its threads take turns in a fixed order instead of Numba's polling loop (kernels/simulator.py).  What a
kernel can observe must not change: the barrier, the counts of ``syncthreads_count``/``_and``/``_or``, the
indices, early returns, and the error a failing thread raises.  The kernel tests here run on a GPU too
(they check CUDA semantics); the ones that compare the scheduler with Numba's own run under the simulator.
"""

import textwrap
import types

import numba
import numpy
import pytest
from numba import config, cuda

from refconv.kernels import simulator

SIMULATED = config.ENABLE_CUDASIM
simulator_only = pytest.mark.skipif(not SIMULATED, reason="the simulator's block scheduler; a GPU has its own")
BLOCK = 64


@cuda.jit
def reverse_in_blocks(x, y, barrier):
    """Each block reverses its 64 values through shared memory: correct only with the barrier."""
    tile = cuda.shared.array(BLOCK, numpy.float64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * BLOCK + t
    tile[t] = x[i]
    if barrier:             # the same for every thread of the block, so legal around syncthreads
        cuda.syncthreads()
    y[i] = tile[BLOCK - 1 - t]


@cuda.jit
def two_tiles(x, y):
    """Two shared arrays, one line each (one typed with Numba's type, one with NumPy's): two arrays, each
    shared by the block's threads."""
    first = cuda.shared.array(BLOCK, numba.float64)
    second = cuda.shared.array(BLOCK, numpy.float64)
    t = cuda.threadIdx.x
    first[t] = x[t]
    second[t] = -10.0 * x[t]
    cuda.syncthreads()
    y[t] = first[BLOCK - 1 - t] + second[t]


@cuda.jit
def votes(x, counts):
    """Per block: how many threads hold a positive value, whether all do, whether any does."""
    t = cuda.threadIdx.x
    value = x[cuda.blockIdx.x * BLOCK + t] > 0
    count = cuda.syncthreads_count(value)
    every = cuda.syncthreads_and(value)
    some = cuda.syncthreads_or(value)
    if t == 0:
        counts[cuda.blockIdx.x, 0] = count
        counts[cuda.blockIdx.x, 1] = every
        counts[cuda.blockIdx.x, 2] = some


@cuda.jit
def reverse_the_first_48(x, y):
    """Threads 48 to 63 return before the barrier, which then waits for the other 48 only."""
    tile = cuda.shared.array(BLOCK, numpy.float64)
    t = cuda.threadIdx.x
    if t >= 48:
        return
    tile[t] = x[t]
    cuda.syncthreads()
    y[t] = tile[47 - t]


@cuda.jit
def indices(out):
    """Each thread of a 3-D block in a 2-D grid writes its indices and lane."""
    b = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y
    t = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
    row = out[b * cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z + t]
    row[0], row[1], row[2] = cuda.threadIdx.x, cuda.threadIdx.y, cuda.threadIdx.z
    row[3], row[4] = cuda.blockIdx.x, cuda.blockIdx.y
    row[5] = cuda.laneid


@cuda.jit
def fails_on_one_thread(x):
    t = cuda.threadIdx.x
    x[t] = 1.0
    cuda.syncthreads()
    if t == 3 and cuda.blockIdx.x == 1:
        raise ValueError("thread 3 of block 1 fails")
    cuda.syncthreads()
    x[t] = 2.0


# A device function in a module of its own, as version 3's kernels call theirs (kernels/loop_v3.py, ...): under the
# simulator its module's `cuda` must point at the launch's fake module during the launch, and back after it.
OTHER = types.ModuleType("device_functions_elsewhere")
exec(textwrap.dedent("""
    from numba import cuda

    @cuda.jit(device=True)
    def lane_times(x):
        if x < 0:
            raise ValueError("a negative value")
        return cuda.threadIdx.x * x
"""), OTHER.__dict__)
lane_times = OTHER.lane_times


@cuda.jit
def calls_another_module(x, out):
    t = cuda.threadIdx.x
    out[t] = lane_times(x[t]) + lane_times(x[t])    # twice: the second call finds the module swapped


@pytest.fixture(params=["refconv", "numba"] if SIMULATED else ["gpu"])
def scheduler(request):
    """Each test under both schedulers: ours (what kernels/__init__.py installs) and Numba's own."""
    if request.param == "numba":
        simulator.install(simulator.NUMBA_BLOCK_MANAGER)
    yield request.param
    if request.param == "numba":
        simulator.install()


def test_the_kernels_package_runs_the_simulator_on_our_scheduler():
    if not SIMULATED:
        pytest.skip("on a GPU the simulator is not used")
    assert simulator.installed() is simulator.TurnsBlockManager


def test_the_barrier_orders_shared_memory(scheduler):
    x = numpy.arange(3 * BLOCK, dtype=numpy.float64)
    y = numpy.zeros_like(x)
    reverse_in_blocks[3, BLOCK](x, y, True)
    assert (y == x.reshape(3, BLOCK)[:, ::-1].ravel()).all()


def test_shared_arrays_of_two_lines_are_two_arrays_each_shared_by_the_block(scheduler):
    x = numpy.arange(1.0, BLOCK + 1.0)
    y = numpy.zeros_like(x)
    two_tiles[1, BLOCK](x, y)
    assert (y == x[::-1] - 10.0 * x).all()


@simulator_only
def test_a_missing_barrier_reads_before_the_write_on_every_run():
    """Threads take turns in index order, so thread 0 reads tile[63] before thread 63 writes it, every run:
    the race is found each time, where Numba's scheduler found it when its threads happened to interleave."""
    for run in range(3):
        x = numpy.arange(BLOCK, dtype=numpy.float64) + 1000.0 * (run + 1)   # values no earlier memory holds
        y = numpy.zeros_like(x)
        reverse_in_blocks[1, BLOCK](x, y, False)
        assert y[0] != x[-1]


def test_counts_and_votes(scheduler):
    x = -numpy.ones((4, BLOCK))
    x[0] = 1.0                 # block 0: every thread positive
    x[1, 10:20] = 1.0          # block 1: ten
    x[3, BLOCK - 1] = 1.0      # block 3: one; block 2: none
    counts = numpy.zeros((4, 3), dtype=numpy.int64)
    votes[4, BLOCK](x.ravel(), counts)
    assert counts.tolist() == [[BLOCK, 1, 1], [10, 0, 1], [0, 0, 0], [1, 0, 1]]


def test_threads_that_returned_no_longer_count_at_the_barrier(scheduler):
    x = numpy.arange(float(BLOCK))
    y = numpy.zeros(BLOCK)
    reverse_the_first_48[1, BLOCK](x, y)
    assert y.tolist() == [*range(47, -1, -1), *[0.0] * 16]


def test_indices_and_lanes_match_numbas_scheduler(scheduler):
    grid, block = (2, 3), (4, 3, 5)     # 60 threads a block: two warps, the second partial
    out = numpy.full((6 * 60, 6), -1, dtype=numpy.int64)
    indices[grid, block](out)
    expected = [(x, y, z, bx, by, (x + 4 * (y + 3 * z)) % 32)
                for by in range(3) for bx in range(2) for z in range(5) for y in range(3) for x in range(4)]
    assert sorted(map(tuple, out.tolist())) == sorted(expected)


@simulator_only
def test_a_failing_thread_ends_the_launch_with_its_indices_and_the_next_launch_runs(scheduler):
    x = numpy.zeros(BLOCK)
    with pytest.raises(ValueError, match=r"tid=\[3, 0, 0\] ctaid=\[1, 0, 0\]: thread 3 of block 1 fails"):
        fails_on_one_thread[2, BLOCK](x)
    y = numpy.zeros(3 * BLOCK)
    reverse_in_blocks[3, BLOCK](numpy.arange(3.0 * BLOCK), y, True)   # the pool is free and whole again
    assert y[0] == BLOCK - 1


@simulator_only
def test_the_pool_grows_to_the_largest_block():
    reverse_in_blocks[1, BLOCK](numpy.arange(float(BLOCK)), numpy.zeros(BLOCK), True)
    out = numpy.zeros((1024, 6), dtype=numpy.int64)
    indices[1, (32, 32, 1)](out)
    assert len(simulator._POOL) >= 1024
    assert sorted(out[:, 0] + 32 * out[:, 1]) == list(range(1024))


@simulator_only
def test_a_device_function_of_another_module_sees_the_launch_and_its_module_gets_cuda_back(scheduler):
    x, out = numpy.arange(1.0, 9.0), numpy.zeros(8)
    calls_another_module[1, 8](x, out)
    assert out.tolist() == [2 * t * v for t, v in enumerate(x)]
    assert OTHER.cuda is cuda
    with pytest.raises(ValueError, match="a negative value"):
        calls_another_module[1, 8](-x, out)
    assert OTHER.cuda is cuda
    calls_another_module[1, 8](x, out)            # and the next launch runs
    assert out[3] == 2 * 3 * 4.0
