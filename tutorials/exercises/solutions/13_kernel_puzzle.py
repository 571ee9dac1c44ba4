"""Exercise 13, a reference solution: a tiled convolution kernel with its input tile and weights in shared memory."""

from numba import cuda, float32

TILE = 8  # outputs per block along each axis: TILE x TILE threads
KMAX = 3  # the largest kernel the shared tiles hold
HALO = TILE + KMAX - 1  # the input tile a block's outputs read


def conv_tile_kernel(x, w, y):
    x_tile = cuda.shared.array((HALO, HALO), dtype=float32)
    w_tile = cuda.shared.array((KMAX, KMAX), dtype=float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    i0, j0 = cuda.blockIdx.x * TILE, cuda.blockIdx.y * TILE  # the block's first output row and column
    K = w.shape[0]
    t = tx * TILE + ty
    for c in range(t, HALO * HALO, TILE * TILE):  # the threads load the tile together, one cell each in turn
        a, b = c // HALO, c % HALO
        if i0 + a < x.shape[0] and j0 + b < x.shape[1]:
            x_tile[a, b] = x[i0 + a, j0 + b]
        else:
            x_tile[a, b] = 0.0
    if t < K * K:
        w_tile[t // K, t % K] = w[t // K, t % K]
    cuda.syncthreads()
    i, j = i0 + tx, j0 + ty
    if i < y.shape[0] and j < y.shape[1]:
        acc = float32(0.0)
        for a in range(K):
            for b in range(K):
                acc += x_tile[tx + a, ty + b] * w_tile[a, b]
        y[i, j] = acc


def launch(Ho, Wo):
    """``(blocks, threads)`` for an output of ``Ho x Wo``: a block per TILE x TILE outputs, rounded up."""
    return (-(-Ho // TILE), -(-Wo // TILE)), (TILE, TILE)
