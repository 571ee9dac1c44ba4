"""Which GPU each rank drives, and a warning when CPU ranks oversubscribe the cores.

    binding = refconv.device.bind(MPI.COMM_WORLD, backend="auto")   # every rank, before any CUDA call

Every rank calls it once.  The node-local rank is this rank's rank in the
node's shared-memory communicator (``collectives.node_comm``).  On a GPU the
rank uses device ``local_rank % visible``, for both CuPy and Numba.  Here
``visible`` counts the devices this process can see: when
``CUDA_VISIBLE_DEVICES`` is set, only those, numbered from 0 in its order.

Every rank then sees the whole job's table (one ``allgather_object``), so the
verdicts below are the same on every rank and no rank is left waiting:

- Two ranks of one node on the same physical GPU (more ranks per node than
  GPUs, or a launcher that hands every rank the same one) raise ``BindError``
  unless the user opts in with ``oversubscribe=True``
  (``--oversubscribe-gpus``, or ``REFCONV_OVERSUBSCRIBE_GPUS=1``).  A GPU is
  known by its UUID, which no launcher renumbers and which MIG slices of one GPU, sharing its
  PCI bus id, do not share (the PCI bus id where CuPy reports no UUID): with Slurm's
  one-GPU-per-task binding, or a launcher that hides the other devices by cgroups
  without setting ``CUDA_VISIBLE_DEVICES``, every rank sees a single device 0,
  and that is not a conflict when the devices differ.  (Tests, which inject a
  device count, identify GPUs by their ``CUDA_VISIBLE_DEVICES`` entries instead.)
- On the CPU, ranks per node x threads per rank above the node's cores prints
  one warning (rank 0).  ``refconv.threads`` chooses and applies the threads
  (cores / ranks per node unless the user set them); this module only reads
  them back, and counts the node's cores as it does.
"""

import dataclasses
import os
import socket
import sys

from refconv import arrays, collectives, threads
from refconv.backend import BACKENDS

OVERSUBSCRIBE_ENV = "REFCONV_OVERSUBSCRIBE_GPUS"


class BindError(ValueError):
    """The job's ranks cannot be bound to its GPUs as asked (same message on every rank)."""


@dataclasses.dataclass(frozen=True)
class Binding:
    """Where one rank runs."""

    rank: int
    host: str
    local_rank: int          # rank among the ranks of this node
    local_size: int          # ranks on this node
    backend: str             # "numpy" or "cuda" (what "auto" resolved to)
    gpu: int = None          # device index among the visible ones, None on the CPU
    gpu_id: str = None       # the physical device: its CUDA_VISIBLE_DEVICES entry, or the index
    simulator: bool = False  # cuda backend under Numba's CUDA simulator (no device)
    threads: int = None      # BLAS/OpenMP threads of this rank
    cores: int = None        # CPU cores of the node

    def as_dict(self):
        return dataclasses.asdict(self)


def visible_gpu_ids(count, env=None):
    """The physical ids of the ``count`` devices this process sees, in CUDA's order."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [item.strip() for item in listed.split(",") if item.strip()][:count]


def physical_gpu_ids(count, env=None):
    """The UUID of each of the ``count`` visible devices (the same device has the same id in every
    process of the node, whatever number the launcher gave it; each MIG slice has its own, where the
    PCI bus id is the whole GPU's).  Without a real GPU (a count faked in a test) there is none to ask:
    the CUDA_VISIBLE_DEVICES entries."""
    if not arrays.gpu_available():
        return visible_gpu_ids(count, env)
    cp = arrays.device_module()
    return [device_uuid(cp.cuda.runtime.getDeviceProperties(i)) or cp.cuda.Device(i).pci_bus_id for i in range(count)]


def device_uuid(properties):
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` from ``cudaDeviceProp.uuid`` (16 bytes), as nvidia-smi
    prints it; None where the properties carry none (then the PCI bus id names the device)."""
    raw = properties.get("uuid")
    if raw is None or len(raw) != 16:
        return None
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def choose_gpu(local_rank, count):
    """The visible device a node-local rank uses: ``local_rank % count`` (None without a GPU)."""
    return local_rank % count if count else None


def gpu_count():
    """Devices CuPy sees (it honours CUDA_VISIBLE_DEVICES); 0 without a real GPU."""
    if not arrays.gpu_available():
        return 0
    return arrays.device_module().cuda.runtime.getDeviceCount()


def select_gpu(index):
    """Make device ``index`` current for CuPy and for Numba (before either creates a context)."""
    arrays.device_module().cuda.Device(index).use()
    from numba import cuda  # numba-cuda: imported only on a real GPU

    cuda.select_device(index)


def threads_per_rank():
    """BLAS/OpenMP threads of this rank: the largest pool threadpoolctl reports (what
    ``refconv.threads.configure`` set, or the libraries' own default)."""
    return max(threads.current().values(), default=1)


def resolve_backend(backend):
    """``"auto"`` -> ``"cuda"`` on a real GPU, else ``"numpy"``; others unchanged."""
    if backend not in BACKENDS:
        raise BindError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "cuda" if arrays.gpu_available() else "numpy"
    return backend


def oversubscribe_requested(flag=None, env=None):
    """The opt-in: the flag when given, else REFCONV_OVERSUBSCRIBE_GPUS=1."""
    if flag:
        return True
    env = os.environ if env is None else env
    return env.get(OVERSUBSCRIBE_ENV, "0") == "1"


def check_gpu_sharing(table, oversubscribe):
    """Raise BindError when two ranks of one node share a physical GPU and that was not asked for."""
    if oversubscribe:
        return
    for host in sorted({b.host for b in table}):
        on_host = [b for b in table if b.host == host and b.gpu_id is not None]
        ids = {b.gpu_id for b in on_host}
        if len(ids) < len(on_host):
            raise BindError(
                f"{len(on_host)} ranks on node {host} share {len(ids)} GPU(s) "
                f"({', '.join(sorted(ids))}): start at most {len(ids)} ranks per node, "
                f"make more GPUs visible (CUDA_VISIBLE_DEVICES), or opt in with --oversubscribe-gpus "
                f"({OVERSUBSCRIBE_ENV}=1)")


def cpu_warning(table):
    """One line when some node runs more threads than it has cores, else None."""
    for host in sorted({b.host for b in table}):
        on_host = [b for b in table if b.host == host and b.gpu is None]
        if not on_host:
            continue
        ranks, most, cores = len(on_host), max(b.threads for b in on_host), on_host[0].cores
        if threads.oversubscribed(most, cores, ranks):
            fix = (f"start at most {cores} ranks per node" if ranks > cores else
                   f"set OMP_NUM_THREADS={threads.default_threads(cores, ranks)} (cores / ranks per node)")
            return (f"{ranks} ranks x {most} threads on node {host} need more than its {cores} cores, "
                    f"which slows every rank down: {fix}")
    return None


def bind(comm, backend="auto", *, oversubscribe=None, count=None, env=None, cores=None, select=select_gpu,
         host=None, warn=True):
    """Bind this rank to its GPU (or note its CPU threads); returns ``(this rank's Binding,
    every rank's Bindings in rank order)``.

    ``count``, ``env``, ``cores``, ``host`` and ``select`` replace the machine's
    own answers (tests inject fakes); a collective, so every rank calls it.
    """
    env = os.environ if env is None else env
    backend = resolve_backend(backend)
    node = collectives.node_comm(comm)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    cores = cores or threads.node_layout(comm)[0]
    measured = count is None  # a real device count: name GPUs by UUID; injected: by CUDA_VISIBLE_DEVICES
    count = (gpu_count() if backend == "cuda" else 0) if measured else count
    if backend != "cuda" or not count:
        ids = []
    else:
        ids = physical_gpu_ids(count, env) if measured else visible_gpu_ids(count, env)
    gpu = choose_gpu(local_rank, len(ids))
    mine = Binding(
        rank=comm.Get_rank(), host=host or socket.gethostname(), local_rank=local_rank, local_size=local_size,
        backend=backend, gpu=gpu, gpu_id=None if gpu is None else ids[gpu],
        simulator=backend == "cuda" and not ids, threads=threads_per_rank(),
        cores=cores)
    table = collectives.allgather_object(comm, mine)
    check_gpu_sharing(table, oversubscribe_requested(oversubscribe, env))  # same table, same verdict everywhere
    if gpu is not None:
        select(gpu)
    message = cpu_warning(table)
    if warn and message and comm.Get_rank() == 0:
        print(f"refconv: warning: {message}", file=sys.stderr, flush=True)
    return mine, table
