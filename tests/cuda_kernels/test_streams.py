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
from mpi4py import MPI

import refconv
from refconv import arrays, collectives, kernels
from refconv.collectives import staging
from refconv.halo import Halo
from refconv.kernels import geometry

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


class FakeDevice:
    """The device module of :func:`as_if_on_a_gpu`: NumPy, with CuPy's pinned allocator and copy to the host
    recorded (each pinned block is a bytearray, kept in ``blocks``)."""

    def __init__(self, log):
        self.log, self.blocks = log, []
        self.cuda = type("cuda", (), {"alloc_pinned_memory": self.alloc_pinned_memory})()

    def alloc_pinned_memory(self, nbytes):
        self.log.append("pinned")
        self.blocks.append(bytearray(nbytes))
        return self.blocks[-1]

    def asnumpy(self, x, out):
        out[...] = x
        return out

    def __getattr__(self, name):
        return getattr(numpy, name)


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
    """NumPy arrays treated as device arrays, with the stream calls and pinned allocations recorded."""
    log = Log()
    log.device = FakeDevice(log)
    monkeypatch.setattr(arrays, "device_module", lambda: log.device)
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
    # staged (not CUDA-aware): the send and receive buffers are page-locked, from CuPy's pinned pool
    assert log.count("pinned") == (0 if aware else 2), log


def test_staging_buffers_are_pinned(as_if_on_a_gpu, cuda_aware):
    """G9: a staged buffer lives in the pinned block it was given (CuPy's pool reuses the block once the array
    is freed); a host array, or a device one under a CUDA-aware MPI, is not staged at all."""
    cuda_aware(False)
    device = as_if_on_a_gpu.device
    x = numpy.arange(6.0).reshape(2, 3)
    sent = staging.to_mpi(x)
    numpy.testing.assert_array_equal(sent, x)
    assert sent is not x and sent.base is not None and bytes(device.blocks[-1]) == x.tobytes()
    received = staging.empty((4,), numpy.float32, like=x)
    received[...] = 7
    assert bytes(device.blocks[-1]) == numpy.full(4, 7, numpy.float32).tobytes()
    assert len(device.blocks) == 2 and staging.empty((0,), numpy.float32, like=x).shape == (0,)
    cuda_aware(True)
    assert staging.to_mpi(x) is x and len(device.blocks) == 2


def test_a_fresh_device_receive_buffer_waits_for_the_stream(as_if_on_a_gpu, cuda_aware):
    """With a CUDA-aware MPI, the receive buffer comes from CuPy's pool, where a block may still be
    read by a queued kernel: MPI must not write into it before the stream has run."""
    cuda_aware(True)
    log = as_if_on_a_gpu
    staging.empty((4,), numpy.float64, like=numpy.zeros(1))
    staging.new((4,), numpy.float64, on_device=True)
    assert log == ["sync", "sync"]


def test_the_null_stream_is_passed_by_the_legacy_default_stream_handle():
    """G4: Numba names CuPy's null stream by handle 0, which DLPack forbids; launches take the legacy default
    stream's handle instead (the same stream), and any other stream, or the simulator's 0, as it is."""
    class Stream:
        def __init__(self, handle):
            self.handle = handle

    legacy = Stream(1)
    assert geometry.legacy_if_null(Stream(0), lambda: legacy) is legacy
    side = Stream(0x7F00)
    assert geometry.legacy_if_null(side, lambda: legacy) is side
    assert geometry.legacy_if_null(0, lambda: legacy) == 0


def test_kernel_stream_is_zero_without_a_gpu():
    """Under the simulator there is no CuPy stream: 0, which the simulator ignores."""
    if arrays.gpu_available():
        pytest.skip("a real GPU is present: kernel_stream is CuPy's current stream there")
    assert arrays.kernel_stream() == 0


# The device-to-host reads a training step on the cuda backend may make, by (module, function), and why:
# each is a wait for the stream.  Everything else in these modules reads nothing from the device.
ALLOWED_HOST_READS = {
    ("backend.py", "scalar"): "the loss, once per step (layers/loss.py's forward asks for it), as torch users' "
                              "loss.item(): the step returns it as a float, for the log and the non-finite guard",
    ("layers/conv.py", "set_global_parameters"): "reads its argument, which may be a device array, once, before training",
    ("train/inputs.py", "load_data"): "before training: the number of classes in the labels, host data read from disk",
    ("train/stepping.py", "_eval_batches"): "evaluation, once per epoch: the outputs are scored on the host",
    ("train/stepping.py", "evaluate"): "evaluation, once per epoch: the count of correct outputs (host arrays by then)",
    ("train/stepping.py", "evaluate_mse"): "evaluation, once per epoch: the sum of squares (host arrays by then)",
    ("train/serial_check.py", "check_serial"): "after training: the largest difference, a host array from MPI",
    ("backend.py", "asarray"): "the backend's own conversion: host data in, never called on device data per step",
    ("backend.py", "to_host"): "the backend's own read, the one the reads listed here call",
    ("halo.py", "__getattr__"): "a letter of an attribute's name (a str), not an array",
    ("halo.py", "_as_slice"): "plan time: the halo plan's index arrays are NumPy's (built once, in Halo.__init__)",
    ("halo.py", "_bounding_box"): "plan time: the halo plan's index arrays are NumPy's",
}
STEP_MODULES = ("layers", "algorithms", "halo.py", "optim.py", "train/loop.py", "train/inputs.py", "train/stepping.py",
                "train/guards.py", "train/checkpoints.py", "train/report.py", "train/serial_check.py", "backend.py")
HOST_READS = {"to_host", "asnumpy", "item", "tolist", "get"}
CONVERSIONS = {"int", "float", "bool"}  # int(x) of a device scalar waits for the stream and copies it


def is_host_read(call):
    """Whether ``call`` may read device memory into host memory: a method of :data:`HOST_READS`, or
    ``int(...)``/``float(...)``/``bool(...)`` of anything but a name, a constant or a NumPy call (an argument
    converted, or host arithmetic, read nothing from a device)."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in HOST_READS:
        return call.func.attr != "get" or not call.args  # dict.get(key) reads nothing; cupy's .get() does
    if isinstance(call.func, ast.Name) and call.func.id in CONVERSIONS and len(call.args) == 1:
        arg = call.args[0]
        numpy_call = isinstance(arg, ast.Call) and ast.unparse(arg.func).startswith("numpy.")
        return not (isinstance(arg, (ast.Name, ast.Constant)) or numpy_call)
    return False


def host_reads(path, root):
    """``(module, enclosing function, line)`` of every call that reads a device array into host memory."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and is_host_read(child):
                found.append((str(path.relative_to(root)), function, child.lineno))
            visit(child, name)

    visit(tree, None)
    return found


def test_no_host_round_trip_comes_back_into_the_training_step():
    """A read of device memory in the layers, algorithms, halos, optimizer, training loop or backend is a
    stall per step on a GPU: any read not listed above fails here, naming where it is.  (The collectives
    stage device buffers through the host only for an MPI library that is not CUDA-aware, by design.)"""
    root = pathlib.Path(refconv.__file__).parent
    paths = [p for name in STEP_MODULES for p in ((root / name).rglob("*.py") if (root / name).is_dir()
                                                   else [root / name]) if p.exists()]
    assert {p.name for p in paths} >= {"loop.py", "backend.py", "halo.py", "optim.py", "loss.py", "conv.py"}
    found = [read for path in paths for read in host_reads(path, root)]
    unexpected = [f"{module}:{line} in {function}" for module, function, line in found
                  if (module, function) not in ALLOWED_HOST_READS]
    assert not unexpected, f"host reads in the training step's path: {unexpected}"
    assert {(m, f) for m, f, _ in found} == set(ALLOWED_HOST_READS)  # each allowed one is still where this says


def test_the_host_read_scan_sees_conversions_of_device_values(tmp_path):
    module = tmp_path / "step.py"
    module.write_text("def step(x, lr):\n    a = float(lr)\n    b = int(numpy.prod(x.shape))\n"
                      "    c = float(x.sum())\n    d = bool(x[0] > 0)\n    e = x.item()\n    f = {}.get(1)\n")
    assert [line for _, _, line in host_reads(module, tmp_path)] == [4, 5, 6]


class DeviceArray(numpy.ndarray):
    """Stands in for a CuPy array: indexing it with a NumPy index array (a hidden copy to the device) fails."""

    def _check(self, index):
        for i in index if isinstance(index, tuple) else (index,):
            assert not (isinstance(i, numpy.ndarray) and not isinstance(i, DeviceArray)), \
                "indexed with a NumPy index array: a synchronous host-to-device copy per call on a GPU"

    def __getitem__(self, index):
        self._check(index)
        return super().__getitem__(index)

    def __setitem__(self, index, value):
        self._check(index)
        super().__setitem__(index, value)


class FakeCupy:
    """The array module of :class:`DeviceArray`s (what the halo calls of it)."""

    __name__ = "fakecupy"
    add = numpy.add

    @staticmethod
    def asarray(a):
        return numpy.asarray(a).view(DeviceArray)

    @staticmethod
    def empty(shape, dtype):
        return numpy.empty(shape, dtype).view(DeviceArray)

    @staticmethod
    def zeros(shape, dtype):
        return numpy.zeros(shape, dtype).view(DeviceArray)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_halo_index_arrays_live_in_the_array_module(mode):
    """G7: the padding modes that read rows out of order index with arrays built by the array module."""
    halo = Halo(MPI.COMM_SELF, (1, 1), (4, 5), (4, 5), (3, 3), (1, 1), (1, 1), (1, 1), padding_mode=mode)
    x = numpy.arange(40.0).reshape(1, 2, 4, 5)
    window = halo.extend(FakeCupy.asarray(x), FakeCupy)
    expected = numpy.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode={"reflect": "reflect", "replicate": "edge",
                                                                      "circular": "wrap"}[mode])
    numpy.testing.assert_array_equal(numpy.asarray(window), expected)
    back = halo.reduce(FakeCupy.asarray(numpy.ones_like(expected)), FakeCupy)
    assert float(numpy.asarray(back).sum()) == expected.size  # every window cell's gradient lands once
    _, owned_index = halo.indices(FakeCupy)[0]
    assert any(isinstance(i, DeviceArray) for i in owned_index)  # rows out of order: index arrays, on the device
    with pytest.raises(AssertionError, match="NumPy index array"):  # what the halo did before (the plan's own)
        FakeCupy.asarray(x)[halo.mine_index[1]]
