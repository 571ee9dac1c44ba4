"""A faster block scheduler for Numba's CUDA simulator: pooled threads that take turns.

Under ``NUMBA_ENABLE_CUDASIM=1`` Numba runs each CUDA thread of a block as a Python thread.  Its block manager
(``numba.cuda.simulator.kernel.BlockManager``) costs more than most of our kernels' bodies, measured on the
forward convolution tests (docs/benchmarks.md):

- it creates and starts a new ``threading.Thread`` for every CUDA thread of every block (with two
  ``Event``\\ s each); that was half of what the interpreter did;
- it loops, as long as any thread lives, over every thread asking whether it is alive or blocked in
  ``syncthreads``: a busy loop that holds the interpreter lock while the block's threads wait for it;
- all the threads of a block are runnable at once, so they pass the interpreter lock to each other every
  5 ms (``sys.getswitchinterval``), each pass a trip through the operating system.

:class:`TurnsBlockManager` keeps what a kernel can observe and removes the three costs:

- the CUDA threads of a block run on threads of a pool that lives as long as the process and grows to the
  largest block launched; a pool thread is told its ``threadIdx`` and ``blockIdx`` and handed the kernel,
  and the kernel sees it as ``threading.current_thread()``, as before;
- the block's threads take turns, in the order of their index (x fastest): a thread runs until it calls
  ``syncthreads`` (or ``syncthreads_count``, ``_and``, ``_or``, which call it) or returns, then hands the
  turn to the next.  When every thread that is still running waits in ``syncthreads``, the barrier opens
  and they run again in the same order.  A thread that has returned no longer counts at the barrier, as
  in Numba's manager.  Between two barriers a CUDA block's threads may run in any order; this is one of
  them, the same on every run, so a simulated launch is deterministic.  (A kernel whose threads wait for
  each other without ``syncthreads``, spinning on a flag in memory, would never end here; none of ours does.)
- the first exception a thread raises is the launch's exception, with Numba's message
  (``tid=[x, y, z] ctaid=[x, y, z]: ...``) and the thread's traceback; the block's other threads stop at
  their next ``syncthreads``, as Numba has them do.

:func:`install` puts it in place of Numba's (``kernels/__init__.py`` calls it when the simulator is on; on a
GPU nothing changes).  The simulator runs one launch at a time, and so does the pool.

:func:`install` also makes device functions cheaper to call.  Under the simulator a device function's module
names ``cuda``, and Numba points that name at the launch's fake module around every call
(``kernelapi.swapped_cuda_module``: two locks and, when no call of that module is under way, a scan of every
global of the module, then the same undone).  Version 3's kernels call device functions of other modules in
their inner loops, so that was 13% of a kernel test's time.  :func:`_call` swaps a module once, at the first
call of one of its device functions in a launch, and puts ``cuda`` back when the launch ends: the same fake
module, for the whole launch instead of each call (no host code runs during a launch).  And it reads the line
that makes a shared array from its caller's frame (:func:`_shared_array`) instead of from the whole stack.
tests/cuda_kernels/test_simulator_blocks.py checks the barrier, the counts, the errors and the results
against Numba's own manager.
"""

import collections
import contextlib
import sys
import threading

import numpy
from numba.core import types
from numba.cuda.simulator import kernel as _simulator
from numba.cuda.simulator.kernelapi import Dim3, FakeCUDAShared, swapped_cuda_module
from numba.np import numpy_support

NUMBA_BLOCK_MANAGER = _simulator.BlockManager
NUMBA_CALL = _simulator.FakeCUDAKernel.__call__
NUMBA_SHARED_ARRAY = FakeCUDAShared.array


class PooledThread(_simulator.BlockThread):
    """A thread of the pool: it runs one CUDA thread of a block at a time, as Numba's ``BlockThread`` would
    (whose ``syncthreads_count``, ``_and``, ``_or`` and error messages it keeps), when it has the turn."""

    def __init__(self, number):
        threading.Thread.__init__(self, name=f"cuda-simulator-{number}", daemon=True)
        self.turn = threading.Lock()      # released to give this thread the turn
        self.turn.acquire()
        self.kernel = None
        self.debug = False

    def assign(self, manager, kernel, block, thread):
        """Make this thread CUDA thread ``thread`` of block ``block`` of ``manager``'s launch (it runs
        ``kernel`` when it gets the turn)."""
        self._manager = manager
        self.kernel = kernel
        self.blockIdx = Dim3(*block)
        self.threadIdx = Dim3(*thread)
        dims = manager._block_dim
        self.thread_id = self.threadIdx.x + dims[0] * (self.threadIdx.y + dims[1] * self.threadIdx.z)
        self.debug = manager._debug
        self.abort = False
        self.exception = None

    def run(self):
        while True:
            self.turn.acquire()
            try:
                # Numba's own run: Thread.run calls _target once, BlockThread.run turns an exception into
                # self.exception with the thread's and block's indices in its message
                self._target, self._args, self._kwargs = self.kernel, (), {}
                with numpy.errstate(divide="raise") if self.debug else contextlib.nullcontext():
                    _simulator.BlockThread.run(self)
            except BaseException as error:  # noqa: BLE001 -- anything else still ends the launch, with its error
                self.exception = (error, sys.exc_info()[2])
            finally:
                self.kernel = None
                self._manager.returned(self)

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        self._manager.waits(self)
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")


_POOL = []
_POOL_IN_USE = threading.Lock()


def pool(size):
    """The first ``size`` threads of the pool, started if new."""
    while len(_POOL) < size:
        thread = PooledThread(len(_POOL))
        thread.start()
        _POOL.append(thread)
    return _POOL[:size]


class TurnsBlockManager(_simulator.BlockManager):
    """Runs one block on the pool, its threads taking turns; raises the first exception one of them raised.

    Only the thread that has the turn changes the manager's state, so it needs no lock: it gives the turn
    away (a lock release) as its last act before waiting for it again."""

    def run(self, grid_point, *args):
        def kernel():
            self._f(*args)

        if not _POOL_IN_USE.acquire(blocking=False):
            raise RuntimeError("Numba's CUDA simulator runs one kernel launch at a time; another is running "
                               "in another thread")
        try:
            points = list(numpy.ndindex(*self._block_dim[::-1]))     # (z, y, x): x varies fastest
            self._threads = pool(len(points))
            for thread, (z, y, x) in zip(self._threads, points):
                thread.assign(self, kernel, grid_point, (x, y, z))
            self._to_run = collections.deque(self._threads)     # this phase's threads yet to have the turn
            self._at_barrier = []                                # this phase's threads waiting in syncthreads
            self._failed = None                                  # the first thread to raise
            self._finished = threading.Lock()
            self._finished.acquire()                             # released when the last thread returns
            self._to_run.popleft().turn.release()
            self._finished.acquire()
        finally:
            _POOL_IN_USE.release()
        if self._failed is not None:
            error, traceback = self._failed.exception
            raise error.with_traceback(traceback)

    def waits(self, thread):
        """``thread`` called syncthreads: it gives the turn away and returns when it has the turn again, after
        the barrier opened (or the block is told to abort)."""
        self._at_barrier.append(thread)
        following = self._next()
        if following is not thread:
            following.turn.release()
            thread.turn.acquire()

    def returned(self, thread):
        """``thread`` has returned or raised: it gives the turn away for good."""
        if thread.exception is not None and self._failed is None:
            self._failed = thread
            for other in self._threads:
                other.abort = True
        following = self._next()
        if following is None:
            self._finished.release()
        else:
            following.turn.release()

    def _next(self):
        """The thread to have the turn next: the next of this phase, else the first at the barrier (which
        opens), else None (every thread has returned)."""
        if not self._to_run and self._at_barrier:
            self._to_run.extend(self._at_barrier)
            self._at_barrier = []
        return self._to_run.popleft() if self._to_run else None


class _Swapped:
    """During a launch: the modules whose ``cuda`` points at the launch's fake module until it ends."""

    def __init__(self):
        self.modules = set()                  # id() of each module's globals
        self.undo = contextlib.ExitStack()


_LAUNCH = None      # the launch under way (a _Swapped), else None


def _call(kernel, *args):
    """``FakeCUDAKernel.__call__``, with device functions called plainly once their module is swapped for the
    launch (the module docstring says why)."""
    global _LAUNCH
    launch = _LAUNCH
    if launch is not None and kernel._device:
        where = kernel.fn.__globals__
        if id(where) not in launch.modules:
            launch.undo.enter_context(swapped_cuda_module(kernel.fn, _simulator._get_kernel_context()))
            launch.modules.add(id(where))
        return kernel.fn(*args)
    if kernel._device or launch is not None or _simulator._kernel_context is not None:
        return NUMBA_CALL(kernel, *args)     # a device function called from the host; a second launch (refused)
    _LAUNCH = _Swapped()
    try:
        with _LAUNCH.undo:
            return NUMBA_CALL(kernel, *args)
    finally:
        _LAUNCH = None


def _shared_array(shared, shape, dtype, alignment=None):
    """``cuda.shared.array`` under the simulator: Numba's, which gives every thread of a block the one array
    its caller's line made (keyed by file and line), with that line read from the caller's frame.  Numba's
    extracted the whole stack, each frame's source line included, on every call of every thread: 4% of a
    version-3 kernel test.  Dynamic shared memory (``shape`` 0) and alignment (refused) stay Numba's."""
    if shape == 0 or alignment is not None:
        return NUMBA_SHARED_ARRAY(shared, shape, dtype, alignment)
    caller = sys._getframe(1)
    where = (caller.f_code.co_filename, caller.f_lineno)
    found = shared._allocations.get(where)
    if found is None:
        dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
        found = shared._allocations[where] = numpy.empty(shape, dtype)
    return found


def install(manager=TurnsBlockManager):
    """Run every simulated launch from now on with ``manager`` (:class:`TurnsBlockManager`, or
    :data:`NUMBA_BLOCK_MANAGER` to go back to Numba's own, and Numba's own calls of device functions and
    shared arrays)."""
    ours = manager is TurnsBlockManager
    _simulator.BlockManager = manager
    _simulator.FakeCUDAKernel.__call__ = _call if ours else NUMBA_CALL
    FakeCUDAShared.array = _shared_array if ours else NUMBA_SHARED_ARRAY


def installed():
    """The block manager simulated launches use now."""
    return _simulator.BlockManager
