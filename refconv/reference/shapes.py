"""The layer shapes every benchmark and the device check measure: data, importing nothing.

Here, below the benchmarks, so that ``refconv.kernels`` (whose compile proof prices these shapes)
needs nothing above ``refconv.reference`` (tests/architecture/test_architecture.py).  ``refconv.bench`` re-exports them.
"""

# name: (C, F, H=W, K, stride, padding): the ResNet-50 3x3 layers and the stem, and a 1x1 layer
SHAPES = {
    "conv2": (64, 64, 56, 3, 1, 1),
    "conv3": (128, 128, 28, 3, 1, 1),
    "conv4": (256, 256, 14, 3, 1, 1),
    "conv5": (512, 512, 7, 3, 1, 1),
    "conv1": (3, 64, 224, 7, 2, 3),
    "conv4-1x1": (1024, 256, 14, 1, 1, 0),
}
QUICK_SHAPES = {"quick3x3": (8, 8, 8, 3, 1, 1), "quick1x1": (8, 4, 6, 1, 1, 0)}
# name: (C, F, D=H=W, K, stride, padding): CosmoFlow's conv layers (MLPerf HPC) on a 32^3 input
SHAPES3D = {"cosmo1": (4, 32, 32, 3, 1, 1), "cosmo2": (32, 64, 16, 3, 1, 1), "cosmo3": (64, 128, 8, 3, 1, 1),
            "cosmo4": (128, 256, 4, 3, 1, 1), "cosmo5": (256, 256, 2, 3, 1, 1)}
QUICK_SHAPES3D = {"quick3d": (4, 8, 6, 3, 1, 1), "quick1x1x1": (8, 4, 4, 1, 1, 0)}
