"""The scalar types the kernels name: Numba's on a GPU, NumPy's under the simulator.

A kernel casts with them (``t = uint32(ty * THREADS + tx)``) and types shared and local arrays with them
(``cuda.shared.array(WINDOWS, int32)``).  Compiled for a GPU, Numba reads each name as its type, so this
module gives Numba's.  Under the simulator (``NUMBA_ENABLE_CUDASIM=1``) the kernel body runs as Python, and a
cast is a call: Numba's type first checks whether its argument is a type (an ABC check), imports its typing
module, and then calls NumPy's type of the same name, ``numpy.uint32(value)``, for the value.  This module
gives NumPy's type there: the same value, about four times sooner (0.3 against 1.4 us a cast here); the
casts took 15% of a version-3 kernel test's time (docs/benchmarks.md).  The simulator's shared and local
arrays take a NumPy type as well as Numba's.
"""

from numba import config

if config.ENABLE_CUDASIM:
    from numpy import float64, int32, int64, uint32
else:
    from numba import float64, int32, int64, uint32

__all__ = ["float64", "int32", "int64", "uint32"]
