"""``refconv info``: what this job runs on, the first thing a scaling job prints.

    refconv info                      # one process
    mpiexec -n 4 refconv info --json  # every rank: host, node-local rank, GPU, backend, threads

It binds the ranks exactly as ``refconv train`` and ``refconv bench`` do
(``refconv.device.bind``), so a refused binding fails here first.  The record
(:func:`collect`) is also the ``env`` field of every ``refconv bench`` results
line.
"""

import importlib.metadata
import json
import platform
import sys

from mpi4py import MPI

from refconv import __version__, arrays, cli, collectives, device, threads, train_config

NAME = "info"
PACKAGES = (("numpy", "numpy"), ("numba", "numba"), ("numba-cuda", "numba-cuda"), ("cupy", None),
            ("mpi4py", "mpi4py"))


def package_version(name):
    """The installed version of distribution ``name``, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cupy_version():
    """CuPy's version, with "(no GPU)" when it is installed but no device answers."""
    for dist in ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"):
        version = package_version(dist)
        if version != "not installed":
            return version if arrays.gpu_available() else f"{version} (no GPU)"
    return "not installed"


def versions():
    out = {"refconv": __version__, "python": platform.python_version()}
    for label, dist in PACKAGES:
        out[label] = cupy_version() if dist is None else package_version(dist)
    return out


def collect(comm, backend="auto", *, oversubscribe=None, binding=None):
    """The job's record (a collective): versions, the MPI library, and one row per rank.

    ``binding``: the ``(mine, table)`` that ``device.bind`` already returned;
    without it this binds now.
    """
    mine, table = binding or device.bind(comm, backend, oversubscribe=oversubscribe)
    return {
        "versions": versions(),
        "mpi": {"library": " ".join(collectives.library_version().splitlines()[0].split()),
                "cuda_aware": collectives.cuda_aware(), "ranks": comm.Get_size()},
        "ranks": [b.as_dict() for b in table],
    }


def format_text(record):
    """The human-readable form of :func:`collect`'s record."""
    lines = ["refconv info"]
    lines += [f"  {name:<11}{version}" for name, version in record["versions"].items()]
    mpi = record["mpi"]
    lines.append(f"  {'MPI':<11}{mpi['library']}")
    lines.append(f"  {'CUDA-aware':<11}{'yes' if mpi['cuda_aware'] else 'no'} (MPIX_Query_cuda_support; "
                 f"REFCONV_CUDA_AWARE=0|1 overrides)")
    lines.append(f"  {mpi['ranks']} rank(s):")
    lines.append(f"    {'rank':>4}  {'host':<20}{'local':>6}  {'gpu':<10}{'backend':<18}{'threads':>7}")
    for r in record["ranks"]:
        gpu = "-" if r["gpu"] is None else f"{r['gpu']} (id {r['gpu_id']})"
        backend = r["backend"] + (" (simulator)" if r["simulator"] else "")
        lines.append(f"    {r['rank']:>4}  {r['host'][:19]:<20}{r['local_rank']:>3}/{r['local_size']:<2}  "
                     f"{gpu:<10}{backend:<18}{r['threads']:>7}")
    return "\n".join(lines)


HELP = "versions, MPI library, CUDA-awareness and each rank's GPU and threads"
DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print the record as JSON (one line)")
    train_config.add_option(p, "backend", purpose="the backend to bind for")
    p.add_argument("--oversubscribe-gpus", action="store_true",
                   help=f"allow more ranks per node than GPUs (or {device.OVERSUBSCRIBE_ENV}=1)")


def run(args):
    """Print the record on rank 0.  A refused binding raises ``device.BindError`` (a
    ValueError) on every rank alike; ``refconv.cli.main`` prints it once, status 2."""
    comm = MPI.COMM_WORLD
    threads.configure(comm)  # the BLAS threads train and bench would run with
    record = collect(comm, args.backend, oversubscribe=args.oversubscribe_gpus)
    if comm.Get_rank() == 0:
        print(json.dumps(record) if args.json else format_text(record), flush=True)
    return 0


def main(argv=None):
    """``python -m refconv.commands.info``: the same as ``refconv info``."""
    return cli.main([NAME, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
