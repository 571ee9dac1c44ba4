"""A counting fake of ``numba.cuda`` that runs a kernel's own Python source and counts each thread's loads.

The kernel puzzle's checker runs your kernel twice: under Numba's CUDA simulator (or a real GPU) to
check what it computes, and here, to count.  Here the kernel's function (the same code object) runs
with its global ``cuda`` replaced by :class:`FakeCuda`: every thread of a block is a Python thread,
``cuda.syncthreads()`` a barrier of the block's live threads (a thread that has returned no longer
holds the others, as on current GPUs), ``cuda.shared.array`` one array per block and call site, and
every global and shared array a :class:`Counted` wrapper that counts, per thread, each element read
(a load) and written (a store).  Blocks run one after another.

With ``order="forward"`` (or ``"reverse"``) a block is a turnstile (:class:`_Turnstile`): its threads run
one at a time, in that order of their index, each until it calls ``syncthreads()`` or returns.  Two
such runs of a kernel that misses a ``syncthreads()`` read cells not yet written in one order or the
other, so they differ: the checker's race hint.  A kernel with its barriers gives the same result.
"""

import threading

import numpy
from numba import cuda as real_cuda

GLOBAL, SHARED = "global", "shared"


class Dim3:
    def __init__(self, x=1, y=1, z=1):
        self.x, self.y, self.z = x, y, z


class Counted:
    """An array that counts the calling thread's loads and stores of its elements."""

    def __init__(self, array, space, counts):
        self.array, self.space, self.counts = array, space, counts
        self.shape, self.size, self.ndim, self.dtype = array.shape, array.size, array.ndim, array.dtype

    def _count(self, what, key):
        n = numpy.size(self.array[key])
        me = _ME.thread
        self.counts[me][(self.space, what)] = self.counts[me].get((self.space, what), 0) + n

    def __getitem__(self, key):
        self._count("loads", key)
        return self.array[key]

    def __setitem__(self, key, value):
        self._count("stores", key)
        self.array[key] = value

    def __len__(self):
        return len(self.array)


_ME = threading.local()  # the calling thread's (block, thread) index, and its block


class _Block:
    def __init__(self, threads):
        self.live, self.arrived, self.generation = threads, 0, 0
        self.lock = threading.Condition()
        self.shared = []  # the k-th cuda.shared.array call of any thread gets self.shared[k]

    def sync(self):
        with self.lock:
            self.arrived += 1
            generation = self.generation
            if self.arrived == self.live:
                self._release()
            elif not self.lock.wait_for(lambda: self.generation != generation, timeout=30):
                raise RuntimeError("cuda.syncthreads(): the block's other threads never arrived")

    def left(self):
        with self.lock:
            self.live -= 1
            if self.live and self.arrived == self.live:
                self._release()

    def _release(self):
        self.arrived, self.generation = 0, self.generation + 1
        self.lock.notify_all()


class _Turnstile(_Block):
    """A block whose threads run one at a time: ``pending`` in order this round, ``later`` the next round."""

    def __init__(self, order):
        super().__init__(len(order))
        self.pending, self.later = list(order), []

    def _wait_turn(self):
        if not self.lock.wait_for(lambda: self.pending and self.pending[0] == _ME.thread_idx_key, timeout=30):
            raise RuntimeError("a turnstile block: the thread before this one never yielded")

    def enter(self):
        with self.lock:
            self._wait_turn()

    def _yield(self, again):
        self.pending.pop(0)
        if again:
            self.later.append(_ME.thread_idx_key)
        if not self.pending:
            self.pending, self.later = self.later, []
        self.lock.notify_all()

    def sync(self):
        with self.lock:
            self._yield(again=True)
            self._wait_turn()

    def left(self):
        with self.lock:
            self._yield(again=False)


class _Shared:
    def __init__(self, counts):
        self.counts = counts

    def array(self, shape, dtype):
        me = _ME
        k = me.shared_calls
        me.shared_calls += 1
        with me.block.lock:
            if k == len(me.block.shared):
                me.block.shared.append(Counted(numpy.zeros(shape, dtype=numpy.dtype(str(dtype))), SHARED, self.counts))
        return me.block.shared[k]


class FakeCuda:
    """What a kernel sees as ``cuda``; anything else is numba.cuda's own (types, math)."""

    def __init__(self, counts, grid_dim, block_dim):
        self.shared = _Shared(counts)
        self.gridDim, self.blockDim = Dim3(*grid_dim), Dim3(*block_dim)

    threadIdx = property(lambda self: _ME.thread_idx)
    blockIdx = property(lambda self: _ME.block_idx)

    def grid(self, ndim):
        t, b, d = _ME.thread_idx, _ME.block_idx, self.blockDim
        out = (b.x * d.x + t.x, b.y * d.y + t.y, b.z * d.z + t.z)[:ndim]
        return out[0] if ndim == 1 else out

    def syncthreads(self):
        _ME.block.sync()

    def __getattr__(self, name):
        return getattr(real_cuda, name)


def run(kernel_fn, grid_dim, block_dim, *arrays, order=None):
    """Run ``kernel_fn(*arrays)`` (its Python function) on the fake; returns ``counts[(block, thread)] =
    {(space, "loads" or "stores"): n}``, every thread of the launch listed.  Raises the first exception a
    thread raised (yours: a todo not written, an index out of range).  ``order``: None (threads run
    together), "forward" or "reverse" (one at a time, see the module's docstring)."""
    if order not in (None, "forward", "reverse"):
        raise ValueError(f"order: expected None, 'forward' or 'reverse', got {order!r}")
    grid_dim, block_dim = tuple(grid_dim) + (1,) * (3 - len(grid_dim)), tuple(block_dim) + (1,) * (3 - len(block_dim))
    counts = {}
    fake = FakeCuda(counts, grid_dim, block_dim)
    scope = dict(kernel_fn.__globals__, cuda=fake)
    fn = type(kernel_fn)(kernel_fn.__code__, scope, kernel_fn.__name__, kernel_fn.__defaults__, kernel_fn.__closure__)
    wrapped = [Counted(a, GLOBAL, counts) if isinstance(a, numpy.ndarray) else a for a in arrays]
    errors = []
    for b in numpy.ndindex(*grid_dim[::-1]):
        block_idx = Dim3(*b[::-1])
        threads = list(numpy.ndindex(*block_dim[::-1]))
        block = _Block(len(threads)) if order is None else \
            _Turnstile(threads if order == "forward" else threads[::-1])

        def thread(t, block_idx=block_idx, block=block, b=b):
            _ME.thread, _ME.thread_idx, _ME.block_idx = (b[::-1], t[::-1]), Dim3(*t[::-1]), block_idx
            _ME.block, _ME.shared_calls, _ME.thread_idx_key = block, 0, t
            counts[_ME.thread] = {}
            try:
                if order is not None:
                    block.enter()
                fn(*wrapped)
            except BaseException as exc:  # noqa: B036 -- reported to the launch, as the simulator does
                errors.append(exc)
            finally:
                block.left()
        running = [threading.Thread(target=thread, args=(t,), daemon=True) for t in threads]
        for r in running:
            r.start()
        for r in running:
            r.join()
        if errors:
            raise errors[0]
    return counts
