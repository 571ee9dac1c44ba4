"""The one array-module helper: NumPy on the CPU, CuPy on a real GPU.

Every place in refconv that must know whether an array lives on the host or on
a device asks this module; nothing else in the library imports cupy (the kernel
benchmark's cuDNN contender aside; tests/architecture/test_architecture.py checks both).
"""

import functools

import numpy


@functools.lru_cache(maxsize=1)
def _cupy():
    """CuPy when a real GPU is usable, else None (``import cupy`` alone proves nothing)."""
    try:
        import cupy
    except Exception:  # not installed, or a broken CUDA install
        return None
    try:
        return cupy if cupy.cuda.is_available() else None
    except Exception:
        return None


def gpu_available():
    """True when CuPy is installed and a real CUDA device answers."""
    return _cupy() is not None


def is_device_array(x):
    """True for a CuPy array (or any object exposing ``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__")


def array_module(x):
    """``cupy`` for a device array, the shapes namespace for a shapes-only array, ``numpy`` otherwise
    (the array-API idiom)."""
    if getattr(x, "shapes_only", False):
        return x.__array_namespace__()
    if is_device_array(x):
        cp = _cupy()
        if cp is None:
            raise ValueError("x: got a device array but no usable GPU/CuPy is present")
        return cp
    return numpy


def device_module():
    """The array module of device arrays: CuPy on a real GPU, NumPy under the CUDA simulator."""
    cp = _cupy()
    return numpy if cp is None else cp


def as_array(x, name="x"):
    """``x`` as a NumPy or CuPy array, sharing its memory where it can (zero-copy): NumPy and
    CuPy arrays as they are; another object with ``__cuda_array_interface__``, or a ``__dlpack__``
    on a CUDA device, through CuPy; one with a CPU ``__dlpack__`` (a CPU torch tensor, a JAX
    array) through ``numpy.from_dlpack``; anything else through ``numpy.asarray``."""
    cp = _cupy()
    if isinstance(x, numpy.ndarray) or (cp is not None and isinstance(x, cp.ndarray)):
        return x
    on_cpu = hasattr(x, "__dlpack__") and x.__dlpack_device__()[0] == 1  # DLPack's kDLCPU
    if on_cpu:
        return numpy.from_dlpack(x)
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__"):
        if cp is None:
            raise ValueError(f"{name}: got a device array but no usable GPU/CuPy is present")
        return cp.asarray(x) if hasattr(x, "__cuda_array_interface__") else cp.from_dlpack(x)
    return numpy.asarray(x)


def to_host(x):
    """A NumPy copy (or the array itself) of a host or device array."""
    if is_device_array(x):
        return _cupy().asnumpy(x)
    return numpy.asarray(x)


# ---------------------------------------------------------------- one stream end to end
# CuPy allocates, copies and computes on its current stream; every kernel of
# refconv.kernels launches on that same stream (kernel_stream); and before MPI reads
# or writes device memory, synchronize() waits for it.  So work is ordered by one
# stream, with one host wait per MPI call and none per kernel launch.


@functools.lru_cache(maxsize=8)
def _numba_stream(pointer):
    from numba import cuda  # numba-cuda: only reached on a real GPU

    from numba.cuda.core import config

    # Numba would otherwise wait for the stream named in each CuPy array's
    # __cuda_array_interface__ before every launch; that stream is the one we
    # launch on, so the wait only stalls the host.
    config.CUDA_ARRAY_INTERFACE_SYNC = False
    return cuda.default_stream() if pointer == 0 else cuda.external_stream(pointer)


def kernel_stream():
    """The stream every kernel launches on: CuPy's current stream as a Numba stream.

    ``kernel[blocks, threads, kernel_stream()](...)``.  Under the CUDA simulator
    (no CuPy) it is ``0``, which the simulator ignores.
    """
    cp = _cupy()
    if cp is None:
        return 0
    return _numba_stream(cp.cuda.get_current_stream().ptr)


def synchronize(x=None):
    """Wait for the current device stream (the one kernels launch on), so MPI may read or write device memory."""
    cp = _cupy()
    if cp is not None:
        cp.cuda.get_current_stream().synchronize()
