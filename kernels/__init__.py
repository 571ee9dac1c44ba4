"""Hand-written Numba CUDA kernels, installed as ``refconv.kernels``."""
