"""The pieces every tiled (version 2) convolution kernel shares: tile constants, ``tiled_jit``, the grid, and
the device steps of a stage (zero the micro-tile, load the weights' tile, store the result).

The stage's multiply, ``multiply_stage``, is generated source checked in beside this module
(``multiply_v2.py``, written by ``generate.py``).  Version 3's pieces: ``tiles_v3.py``.
"""

from numba import config, cuda

from . import geometry
from .geometry import THREADS, kernel_jit

# Tiled (version 2) convolution kernels: implicit GEMM C[M, N] = A[M, K] @ B[K, N].
# A block of THREADS x THREADS threads computes a TILE_M x TILE_N tile of C; each
# thread owns a MICRO x MICRO register micro-tile of it, strided by THREADS so that
# neighbouring threads touch neighbouring columns of shared memory (no bank
# conflicts) and neighbouring output pixels (coalesced stores).
MICRO = 4
TILE_M = THREADS * MICRO  # 64 rows of C per block
TILE_N = THREADS * MICRO  # 64 columns of C per block
TILE_K = 16  # depth of one shared-memory stage
# One padding column in the shared tiles: a tile written column-wise then does not
# send every store of a warp to the same bank.
PAD = 1
# The shared-memory stage shapes, as module-level constants: Numba freezes a global
# tuple of ints into literals, which ``cuda.shared.array`` needs.  Written inline as
# ``(TILE_K, TILE_M + PAD)`` the sum is typed as a run-time int64, and NVVM's front
# end (not the simulator, which runs plain Python) rejects the kernel.
A_STAGE = (TILE_K, TILE_M + PAD)
B_STAGE = (TILE_K, TILE_N + PAD)
# Tile elements each thread copies into shared memory per stage.
LOADS_A = TILE_K * TILE_M // (THREADS * THREADS)  # 4
LOADS_B = TILE_K * TILE_N // (THREADS * THREADS)  # 4


def tiled_jit(kernel):
    """``cuda.jit`` for a tiled (version 2) kernel, declaring its launch bounds: blocks of ``THREADS**2`` threads.

    Told the block size (``.maxntid 256`` in the PTX), the compiler allocates far
    fewer registers: measured with ``refconv.kernels.resources`` when it was
    introduced, backward-data float64 138 -> 120, so two blocks fit on an SM
    instead of one.  The simulator's ``cuda.jit`` takes no launch bounds and needs none.
    """
    if config.ENABLE_CUDASIM:
        return cuda.jit(kernel)
    return kernel_jit(kernel, launch_bounds=THREADS * THREADS)


def gemm_grid(M, N, depth=1):
    """``(blocks, threads)`` of version 2: :func:`geometry.gemm_grid` with ``TILE_M x TILE_N`` tiles."""
    return geometry.gemm_grid(M, N, depth, TILE_M)


# arithmetic of two or three spatial dims); what does not depend on the dims is here.


@cuda.jit(device=True)
def zero_fill(acc):
    """``acc[:, :] = 0``: the ``MICRO x MICRO`` register micro-tile, before the first stage."""
    for ii in range(MICRO):
        for jj in range(MICRO):
            acc[ii, jj] = 0


@cuda.jit(device=True)
def load_weight_stage(b_tile, w2, row0, rows, col0, k0, K, t):
    """One stage of the forward kernels' B tile: ``b_tile[kk, ff] = w2[row0 + col0 + ff, k0 + kk]``.

    ``w2 (F, K)``: the weights flattened per filter, ``k = (c, i, j)`` or ``(c, a, i, j)``;
    ``row0`` the group's first filter and ``rows`` its filters; zero past ``rows`` or ``K``.
    Thread ``t`` loads row ``kk = t % TILE_K`` (neighbouring threads read neighbouring ``k``
    of one filter: coalesced) in ``LOADS_B`` columns ``t // TILE_K + 16 load``.
    """
    kk = t % TILE_K
    k = k0 + kk
    for load in range(LOADS_B):
        ff = t // TILE_K + load * (THREADS * THREADS // TILE_K)
        f = col0 + ff
        if f < rows and k < K:
            b_tile[kk, ff] = w2[row0 + f, k]
        else:
            b_tile[kk, ff] = 0



@cuda.jit(device=True)
def store_flat_tile(c2, acc, row0, rows, m0, n0, cols, tx, ty):
    """``c2[row0 + m, n] = acc[ii, jj]`` for this thread's rows ``m = m0 + tx + 16 ii < rows`` and columns
    ``n = n0 + ty + 16 jj < cols``: the backward-filter kernels' store into their workspace ``c2``, flat in
    ``q``.  The loop body holds no index arithmetic, so it unrolls fully and ``acc[ii, jj]`` keeps a
    compile-time index: ``acc`` stays in registers (a divide in it once gave a 64-byte stack frame)."""
    for ii in range(MICRO):
        m = m0 + tx + ii * THREADS
        if m < rows:
            for jj in range(MICRO):
                n = n0 + ty + jj * THREADS
                if n < cols:
                    c2[row0 + m, n] = acc[ii, jj]
