"""Version 3's main loop, ``gemm_loop``: the double-buffered stages of the register-tiled kernels, with the
half-stage multiply ``multiply_half`` (generated, ``multiply_v3.py``) and the loads and stores of
``tiles_v3.py``.
"""

from numba import cuda

from .geometry import THREADS
from .multiply_v3 import multiply_half
from .scalars import uint32
from .tiles_v3 import A_STEP, LOADS, ROW, RUN, TILE_K, gather_loads, padded_loads, store_stage


@cuda.jit(device=True)
def gemm_loop(a_src, b_src, table, windows, a_tile, b_tile, acc, a_reg, b_reg, a_next, b_next, k_begin, k_end,
               D, H, W, b_first, Kp, zero):
    """Version 3's main loop: ``acc += A[rows, k] B[k, cols]`` over the stages of ``[k_begin, k_end)``, double
    buffered, for thread ``(tx, ty)``'s 8 x 8 micro-tile.

    A is gathered from ``a_src`` through ``windows`` (per row) and ``table`` (per depth), :func:`gather_loads`;
    B is ``b_src[b_first + col * Kp + k]``, zero-padded so that no load needs a test (:func:`padded_loads`).
    ``k_end - k_begin`` is a whole number of pairs of stages, and both ``table`` and ``b_src`` hold one spare
    stage past ``k_end`` (the last pass's prefetch reads it and never multiplies it).  Thread ``t`` loads A at
    depth ``t // 32`` of rows ``t % 32 + 32 l``, and B at depths ``4 (t % 2) + l`` of column ``t // 2``
    (``l < 4``).  Before the loop, stage ``k_begin`` goes to buffer 0; each pass of the loop then multiplies
    buffer 0 while loading the next stage into registers and storing it to buffer 1, and the reverse: one
    barrier per stage.  B's loads are issued before the first half of the multiply (``kk`` 0..3) and stored
    after it, A's before the second half: each load's latency is hidden behind half a stage of multiply-adds
    (256 per thread), and only four loaded registers are live across a half (with all eight live, ptxas
    spilled at the 128-register cap)."""
    tx = uint32(cuda.threadIdx.x)
    ty = uint32(cuda.threadIdx.y)
    t = uint32(ty * THREADS + tx)
    # Unsigned thread indices: Numba then adds no negative-index wraparound to the shared addresses
    kk_a = uint32(t // A_STEP)
    a_col = uint32(t % A_STEP)
    kk_b = uint32(t % 2 * LOADS)
    b_col = uint32(t // 2)
    a_at = uint32(kk_a * ROW + a_col)  # where this thread's loads go in a stage (store_stage)
    b_at = uint32(kk_b * ROW + b_col)
    ra = uint32(tx * RUN)  # this thread's first micro-tile row and column in a stage
    rb = uint32(ty * RUN)
    b_at_k = uint32(b_first + b_col * Kp + kk_b + k_begin)  # carried: + TILE_K per stage

    gather_loads(a_src, table, windows, a_next, k_begin, kk_a, a_col, D, H, W, zero)
    padded_loads(b_src, b_next, b_at_k)
    store_stage(a_tile, 0, a_next, a_at, A_STEP)
    store_stage(b_tile, 0, b_next, b_at, ROW)
    cuda.syncthreads()
    k = uint32(k_begin + TILE_K)  # a 32-bit counter: Numba's range() counts in 64 bits, a register more
    while k < uint32(k_end + TILE_K):  # two stages per pass: multiply buffer 0 and load stage k into 1, ...
        b_at_k = uint32(b_at_k + TILE_K)
        padded_loads(b_src, b_next, b_at_k)  # next stage's B
        multiply_half(a_tile, b_tile, 0, 0, acc, a_reg, b_reg, ra, rb)  # this stage, kk 0..3
        store_stage(b_tile, 1, b_next, b_at, ROW)
        gather_loads(a_src, table, windows, a_next, k, kk_a, a_col, D, H, W, zero)  # next stage's A
        multiply_half(a_tile, b_tile, 0, 4, acc, a_reg, b_reg, ra, rb)  # this stage, kk 4..7
        store_stage(a_tile, 1, a_next, a_at, A_STEP)
        cuda.syncthreads()
        # ... then multiply buffer 1 and load stage k + 8 into 0 (past the last stage: the spare one)
        b_at_k = uint32(b_at_k + TILE_K)
        padded_loads(b_src, b_next, b_at_k)
        multiply_half(a_tile, b_tile, 1, 0, acc, a_reg, b_reg, ra, rb)
        store_stage(b_tile, 0, b_next, b_at, ROW)
        gather_loads(a_src, table, windows, a_next, k + TILE_K, kk_a, a_col, D, H, W, zero)
        multiply_half(a_tile, b_tile, 1, 4, acc, a_reg, b_reg, ra, rb)
        store_stage(a_tile, 0, a_next, a_at, A_STEP)
        cuda.syncthreads()
        k = uint32(k + 2 * TILE_K)
