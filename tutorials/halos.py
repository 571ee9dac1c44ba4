"""Tutorial 3: halo exchange on 4 MPI ranks (the image height split 4 ways).

Run from the repository root:

    mpiexec -n 4 python -m mpi4py tutorials/halos.py

The layer is a 3x3 convolution with stride 2, dilation 3 and padding 2 on 11
input rows: blocks of 3, 3, 3, 2 rows (uneven), 5 output rows (2, 1, 1, 1), and
rank 0's window reaches past its nearest neighbour into rank 2's rows.

The script

1. builds the ``Halo`` of the height group and prints, per rank, the rows it
   owns, the output rows it computes, the window those outputs read, and which
   rank sends each piece of the window;
2. runs ``Halo.extend`` on the real ``x`` blocks and checks each rank's window
   against the zero-padded global ``x``, and checks the bytes ``CommStats``
   recorded against the pieces it planned to send;
3. runs ``DistConv2d`` forward and backward on a ``height=4`` grid and compares
   ``y``, ``dx``, ``dw``, ``db`` with the serial reference.

It exits non-zero (every rank) on any mismatch; the "OK" lines are printed only
after the comparisons have passed.
"""

import numpy
from mpi4py import MPI

import refconv
from refconv import collectives
from refconv import reference as ref
from refconv.distribution import block_range
from refconv.halo import Halo
from refconv.testing.asserts import assert_all_ranks, close_message, collective_assert_close

comm = MPI.COMM_WORLD
if comm.size != 4:
    raise SystemExit(f"run this with 4 ranks (mpiexec -n 4 ...), not {comm.size}")

N, C, F, H, W, K = 2, 3, 4, 11, 7, 3
geometry = dict(stride=2, padding=2, dilation=3)
Ho = (H + 2 * 2 - 3 * (K - 1) - 1) // 2 + 1            # 5 output rows
Wo = (W + 2 * 2 - 3 * (K - 1) - 1) // 2 + 1            # 3 output columns

rng = numpy.random.default_rng(0)                       # the same global arrays on every rank
x = rng.standard_normal((N, C, H, W))
w = rng.standard_normal((F, C, K, K))
b = rng.standard_normal(F)
dy = rng.standard_normal((N, F, Ho, Wo))

grid = refconv.ProcessGrid(comm, height=4)
spatial = grid.sub_comm(("height", "width"))            # the halo group, ranked h * P_W + w
halo = Halo(spatial, (grid.P_H, grid.P_W), (H, W), (Ho, Wo), (K, K), (2, 2), (2, 2), (3, 3))
me = spatial.Get_rank()

# -- 1. the geometry, as each rank sees it ------------------------------------------------
own, win = halo.owned[me], halo.window[me]
o0, o1 = block_range(Ho, grid.P_H, grid.coords[2])
def rows(lo, hi):
    return f"row {lo}" if hi - lo == 1 else f"rows {lo}..{hi - 1}"


parts = [f"{rows(win.h0, min(win.h1, 0))} zero padding"] if win.h0 < 0 else []
for r, owned in enumerate(halo.owned):
    piece = owned.intersect(win)                        # owned rows of rank r inside my window
    if piece is not None:
        parts.append(f"{rows(piece.h0, piece.h1)} from rank {r}" + (" (itself)" if r == me else ""))
if win.h1 > H:
    parts.append(f"{rows(max(win.h0, H), win.h1)} zero padding")
line = (f"  rank {me}: owns rows [{own.h0}, {own.h1}), computes output rows [{o0}, {o1}), "
        f"reads window [{win.h0}, {win.h1}):\n      " + "; ".join(parts))
lines = comm.gather(line)
if comm.rank == 0:
    print(f"H = {H} rows on height=4, 3x3 conv, stride 2, dilation 3, padding 2: H' = {Ho}")
    print("\n".join(lines))

# -- 2. the exchange itself -----------------------------------------------------------------
x_loc = x[:, :, own.h0:own.h1, own.w0:own.w1]            # (N, C, h, W)
with collectives.stats.recording() as region:
    x_win = halo.extend(x_loc, numpy)                    # (N, C, h_win, w_win)
x_padded = numpy.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)))   # zeros outside the image (4 >= any overhang)
expected_win = x_padded[:, :, win.h0 + 4:win.h1 + 4, win.w0 + 4:win.w1 + 4]
sent = sum(p.shape[0] * p.shape[1] for r in range(spatial.size) if r != me
           if (p := own.intersect(halo.window[r])) is not None) * N * C * x.itemsize
recorded = region.summary()["halo"]["bytes"]
collective_assert_close(comm, x_win, expected_win, name=f"rank {me}'s window")
assert_all_ranks(comm, recorded == sent, f"rank {me}: CommStats recorded {recorded} halo bytes, planned {sent}")
lines = comm.gather(f"  rank {me}: sent {recorded} bytes = {recorded // (N * C * W * x.itemsize)} row(s) x N*C*W x 8 bytes")
if comm.rank == 0:
    print("halo exchange, bytes each rank sent:")
    print("\n".join(lines))
    print("  OK: every rank's window equals the zero-padded global x; halo bytes match the plan")

# -- 3. the layer -----------------------------------------------------------------------------
layer = refconv.DistConv2d(C, F, K, **geometry, grid=grid, backend="numpy", dtype=numpy.float64,
                           input_shape=(N, C, H, W))
layer.set_global_parameters(w, b)
y_loc = layer.forward(layer.input_distribution.extract(x, grid.rank))       # (N, F, h', Wo)
dx_loc = layer.backward(layer.output_distribution.extract(dy, grid.rank))   # (N, C, h, W)
y = refconv.gather(y_loc, layer.output_distribution, grid)
dx = refconv.gather(dx_loc, layer.input_distribution, grid)
dw, db = layer.global_parameter_grads()

problems = []
if grid.rank == 0:
    checks = [("y", y, ref.conv2d_forward(x, w, b, **geometry), C * K * K),
              ("dx", dx, ref.conv2d_backward_data(dy, w, x.shape, **geometry), F * K * K),
              ("dw", dw, ref.conv2d_backward_filter(x, dy, w.shape, **geometry), N * Ho * Wo),
              ("db", db, ref.conv2d_backward_bias(dy), N * Ho * Wo)]
    problems = [m for name, got, want, L in checks
                if (m := close_message(got, want, reduction_length=L, name=name)) is not None]
assert_all_ranks(comm, not problems, "\n".join(problems))
if grid.rank == 0:
    print(f"DistConv2d on height=4: y {y.shape}, dx {dx.shape}")
    print("  OK: y, dx, dw, db match the reference")
grid.free()
