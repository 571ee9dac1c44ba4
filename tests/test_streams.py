"""One stream end to end: every kernel launches on the stream that MPI waits for.

On a GPU, CuPy works on its current stream; the kernels must launch on that same
stream (``refconv.arrays.kernel_stream``), and the collectives must wait for it
before MPI touches device memory.  No GPU here, so these tests check the order
with stand-ins: a recording ``kernel_stream`` and ``synchronize``, and a fake
communicator that records the MPI call.
"""

import ast
import pathlib

import numpy
import pytest

import refconv
from refconv import arrays, collectives, kernels
from refconv.collectives import staging

KERNELS = pathlib.Path(kernels.__file__).parent


def launches(path):
    """Every ``kernel[...](...)`` launch in a module: (line, the last item of its configuration)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            config = node.func.slice
            last = config.elts[-1] if isinstance(config, ast.Tuple) else config
            yield node.lineno, ast.unparse(last)


def test_every_launch_in_kernels_names_the_stream():
    found = [(path.name, line, last) for path in sorted(KERNELS.glob("*.py")) for line, last in launches(path)]
    assert len(found) >= 16, found  # every host function launches at least one kernel
    wrong = [f"{name}:{line} [..., {last}]" for name, line, last in found if last != "stream()"]
    assert not wrong, f"launches without the stream (kernel[blocks, threads, stream()]): {wrong}"


class Log(list):
    def event(self, name, result=None):
        def record(*args, **kwargs):
            self.append(name)
            return result
        return record


class FakeComm:
    """Two ranks' worth of Allreduce: records the call and doubles the buffer."""

    def __init__(self, log):
        self.log = log

    def Get_size(self):
        return 2

    def Get_rank(self):
        return 0

    def Get_name(self):
        return "fake"

    def Allreduce(self, send, recv, op=None):
        self.log.append("mpi")
        recv[...] = 2 * send


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
    """NumPy arrays treated as device arrays, with the stream calls recorded."""
    log = Log()
    monkeypatch.setattr(arrays, "kernel_stream", log.event("launch", 0))
    monkeypatch.setattr(arrays, "synchronize", log.event("sync"))
    monkeypatch.setattr(arrays, "is_device_array", lambda x: isinstance(x, numpy.ndarray))
    monkeypatch.setattr(arrays, "array_module", lambda x: numpy)
    monkeypatch.setattr(arrays, "to_host", numpy.asarray)
    return log


@pytest.fixture
def cuda_aware(monkeypatch):
    """``cuda_aware(True)``: the collectives take MPI for CUDA-aware (their answer is cached per process)."""
    def decide(flag):
        monkeypatch.setenv("REFCONV_CUDA_AWARE", str(int(flag)))
        staging.cuda_aware.cache_clear()
        assert staging.cuda_aware() is flag

    yield decide
    monkeypatch.undo()
    staging.cuda_aware.cache_clear()


@pytest.mark.parametrize("aware", [False, True])
def test_kernel_then_stream_wait_then_mpi(as_if_on_a_gpu, cuda_aware, aware):
    cuda_aware(aware)
    log = as_if_on_a_gpu
    x = numpy.array([-1.0, 2.0, -3.0, 4.0])
    y = kernels.relu_forward(x)
    assert log == ["launch"]  # the kernel asked for the stream once, at its launch
    total = collectives.allreduce(FakeComm(log), y)
    numpy.testing.assert_array_equal(total, [0.0, 4.0, 0.0, 8.0])
    # MPI reads y only after the stream the kernel ran on has been waited for
    assert log.index("sync") < log.index("mpi"), log
    assert log[0] == "launch" and log.count("mpi") == 1


def test_a_fresh_device_receive_buffer_waits_for_the_stream(as_if_on_a_gpu, cuda_aware):
    """With a CUDA-aware MPI, the receive buffer comes from CuPy's pool, where a block may still be
    read by a queued kernel: MPI must not write into it before the stream has run."""
    cuda_aware(True)
    log = as_if_on_a_gpu
    staging.empty((4,), numpy.float64, like=numpy.zeros(1))
    staging.new((4,), numpy.float64, on_device=True)
    assert log == ["sync", "sync"]


def test_kernel_stream_is_zero_without_a_gpu():
    """Under the simulator there is no CuPy stream: 0, which the simulator ignores."""
    if arrays.gpu_available():
        pytest.skip("a real GPU is present: kernel_stream is CuPy's current stream there")
    assert arrays.kernel_stream() == 0


# The device-to-host reads a training step on the cuda backend may make, by (module, function):
# each is a wait for the stream.  The loss is read once per step, as torch users' loss.item():
# the step returns it as a float, for the log and the non-finite guard.  Setting global parameters
# reads its argument, which may be a device array, once, before training.
ALLOWED_HOST_READS = {("layers/loss.py", "forward"), ("layers/conv.py", "set_global_parameters")}
STEP_MODULES = ("layers", "algorithms", "halo.py", "optim.py")
HOST_READS = {"to_host", "asnumpy", "item", "tolist", "get"}


def host_reads(path, root):
    """``(module, enclosing function, line)`` of every call that reads a device array into host memory."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in HOST_READS:
                if child.func.attr != "get" or not child.args:  # dict.get(key) reads nothing; cupy's .get() does
                    found.append((str(path.relative_to(root)), function, child.lineno))
            visit(child, name)

    visit(tree, None)
    return found


def test_no_host_round_trip_comes_back_into_the_training_step():
    """A read of device memory in the layers, algorithms, halos or optimizer is a stall per step on
    a GPU: any read not listed above fails here, naming where it is.  (The collectives stage device
    buffers through the host only for an MPI library that is not CUDA-aware, by design.)"""
    root = pathlib.Path(refconv.__file__).parent
    paths = [p for name in STEP_MODULES for p in ((root / name).rglob("*.py") if (root / name).is_dir()
                                                   else [root / name]) if p.exists()]
    found = [read for path in paths for read in host_reads(path, root)]
    unexpected = [f"{module}:{line} in {function}" for module, function, line in found
                  if (module, function) not in ALLOWED_HOST_READS]
    assert not unexpected, f"host reads in the training step's path: {unexpected}"
    assert {(m, f) for m, f, _ in found} >= ALLOWED_HOST_READS  # the allowed ones are still where this says
