"""A small serial forward/backward through the reference, printing what it checked.

``make demo`` runs this until distributed training lands.
"""

import numpy

from refconv import reference as ref


def main():
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8))
    w = rng.standard_normal((8, 3, 3, 3))
    b = rng.standard_normal(8)
    y = ref.conv2d_forward(x, w, b, padding=1)
    dy = rng.standard_normal(y.shape)
    dx = ref.conv2d_backward_data(dy, w, x.shape, padding=1)
    dw = ref.conv2d_backward_filter(x, dy, w.shape, padding=1)
    checks = {
        "forward: vectorised == loops": numpy.abs(y - ref.loops.conv2d_forward(x, w, b, padding=1)).max(),
        "backward-data: vectorised == loops": numpy.abs(dx - ref.loops.conv2d_backward_data(dy, w, x.shape, padding=1)).max(),
        "backward-filter: vectorised == loops": numpy.abs(dw - ref.loops.conv2d_backward_filter(x, dy, w.shape, padding=1)).max(),
    }
    print(f"conv2d x{x.shape} w{w.shape} padding=1 -> y{y.shape}")
    ok = True
    for name, err in checks.items():
        print(f"  {name}: max |difference| = {err:.2e}")
        ok &= err < 1e-10
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
