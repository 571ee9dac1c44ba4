"""What the tutorials share: multi-rank cells on simulated ranks, and one proof that they run under mpiexec.

A multi-rank step of a tutorial is an ordinary function of a communicator, run on 4
simulated ranks, threads of the notebook's own process (:func:`refconv.simulated.run`)::

    def body(comm):                            # runs on every rank, as under mpiexec
        ...
        return what_this_rank_found

    ranks = simulated.run(body, course.RANKS)  # one result per rank, rank 0's first

So it can be read, edited and stepped through in a debugger like any other cell.
:func:`under_mpiexec` runs the same function on real MPI ranks (``mpiexec -n 4
python -m mpi4py``) and returns every rank's result the same way, so a tutorial can
show that nothing in its function knows the difference.

Each figure of a tutorial ends its cell with :func:`show`: inline in Jupyter as ever, and saved
to a file (whose name it prints) when the tutorial runs as a script.
"""

import ast
import inspect
import linecache
import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import types

import numpy

from refconv import train
from refconv.testing.mpirun import find_mpiexec
from refconv.train import serial_check
from refconv.train_config import TrainConfig

HERE = pathlib.Path(__file__).resolve().parent
RANKS = 4  # every multi-rank tutorial runs on 4 ranks


# -- the same function on real MPI ranks ------------------------------------------------------
def under_mpiexec(fn, ranks=RANKS, *, args=(), kwargs=None, timeout=120, show=True):
    """Run ``fn(comm, *args, **kwargs)`` on ``ranks`` MPI processes; return each rank's result, rank 0's first.

    ``fn``'s own source (:func:`inspect.getsource`) goes into a job file, after what it names
    from its module: modules and importable objects as imports, the notebook's own
    functions and classes as their source, numbers and strings as literals (anything else
    raises TypeError: pass it in ``args``).  The job calls ``fn(MPI.COMM_WORLD, *args, **kwargs)``,
    and each rank pickles its result for the notebook.  ``python -m mpi4py`` aborts the job
    when a rank raises, and a job past ``timeout`` seconds is killed: either raises
    RuntimeError with the ranks' output.  ``show`` prints that output.
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("no mpiexec next to this Python or on PATH: pip install mpich (or refconv[docs])")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="refconv-tutorial-"))
    job = folder / "job.py"
    job.write_text(job_source(fn))
    (folder / "args.pkl").write_bytes(pickle.dumps((tuple(args), kwargs or {})))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):   # one BLAS thread per rank
        env.setdefault(name, "1")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", str(job), str(folder)]
    # a session of its own, so that a timeout kills mpiexec and every rank with it
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{fn.__name__} on {ranks} MPI ranks did not finish in {timeout} s ({job}):\n{output}")
    if proc.returncode != 0:
        raise RuntimeError(f"{fn.__name__} on {ranks} MPI ranks exited with {proc.returncode} ({job}):\n{output}")
    if show:
        print(output, end="")
    return [pickle.loads((folder / f"rank{r}.pkl").read_bytes()) for r in range(ranks)]


def print_job(fn):
    """Print :func:`job_source` of ``fn`` under a heading and an end line, so that it reads as the
    file it is, apart from the cell's other output."""
    source = job_source(fn)
    print(f"--- job.py, the file course.under_mpiexec writes for {fn.__name__} "
          f"({len(source.splitlines())} lines) ---")
    print(source, end="")
    print("--- end of job.py ---")


def job_source(fn):
    """A script that runs ``fn`` on ``MPI.COMM_WORLD``: what it names first, then its own source."""
    lines, sources = ["import pickle, sys", "from mpi4py import MPI"], []
    _needs(fn, lines, sources, set())
    lines.sort(key=lambda line: not line.startswith(("import ", "from ")))   # imports first, then constants
    return "\n".join([*lines, "", "", *sources,
                      "comm = MPI.COMM_WORLD",
                      "args, kwargs = pickle.loads(open(sys.argv[1] + '/args.pkl', 'rb').read())",
                      f"result = {fn.__name__}(comm, *args, **kwargs)",
                      "open(f'{sys.argv[1]}/rank{comm.rank}.pkl', 'wb').write(pickle.dumps(result))", ""])


def _needs(obj, lines, sources, seen):
    """Add to ``lines`` (imports, literals) and ``sources`` (definitions) what ``obj``'s code names."""
    seen.add(obj.__name__)
    module = vars(sys.modules[obj.__module__])
    for name in _global_names(obj, module):
        value = module[name]
        if name in seen:
            continue
        seen.add(name)
        if isinstance(value, types.ModuleType):
            lines.append(f"import {value.__name__}" + (f" as {name}" if name != value.__name__ else ""))
        elif _importable(value):
            lines.append(f"from {value.__module__} import {value.__qualname__} as {name}")
        elif isinstance(value, (types.FunctionType, type)):
            _needs(value, lines, sources, seen)
        elif _literal(value):
            lines.append(f"{name} = {value!r}")
        else:
            raise TypeError(f"under_mpiexec: {obj.__name__} uses the global {name!r}, a {type(value).__name__} "
                            f"that a job file cannot rebuild; pass it in args")
    sources.append(_source(obj).rstrip() + "\n\n")


def _global_names(obj, module):
    """The names of ``module`` that ``obj`` (a function, or a class's methods) reads."""
    codes = [obj.__code__] if isinstance(obj, types.FunctionType) else _methods(obj)
    read = set()
    while codes:                              # nested functions, comprehensions
        code = codes.pop()
        read |= set(code.co_names)            # globals and attributes; locals are not there
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    loaded = {n.id for n in ast.walk(ast.parse(_source(obj))) if isinstance(n, ast.Name)}   # not attributes
    return sorted(n for n in read & loaded if n in module)


def _methods(cls):
    return [f.__code__ for f in vars(cls).values() if isinstance(f, types.FunctionType)]


def _source(obj):
    """``obj``'s source: a class is found through its methods' file, which inspect cannot do for a
    class defined in a notebook cell before Python 3.13."""
    if isinstance(obj, types.FunctionType):
        return textwrap.dedent(inspect.getsource(obj))
    first = _methods(obj)[0]
    text = "".join(linecache.getlines(first.co_filename))
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == obj.__name__
                and n.lineno <= first.co_firstlineno <= n.end_lineno)
    return ast.get_source_segment(text, node)


def _importable(value):
    module = getattr(value, "__module__", None)
    if module in (None, "__main__") or module not in sys.modules:
        return False
    found = sys.modules[module]
    for part in getattr(value, "__qualname__", "<none>").split("."):
        found = getattr(found, part, None)
    return found is value


def _literal(value):
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False


# -- tutorials 8 and 10: a few training steps, checked against the serial twin ----------------------
def train_steps(comm, model, steps=3, **options):
    """``refconv train --model MODEL --max-steps STEPS`` in float64 on NumPy, as a function of
    ``comm``: each step's loss, and the communication per step and rank (the mean over ranks),
    ``{kind: (calls, bytes)}``.  Rank 0 prints the run's setup."""
    result = train.train(_config(model, steps, options), comm=comm)
    return {"losses": result["losses"],
            "per_step": {k: (result["calls_per_step"][k], b) for k, b in result["bytes_per_step"].items()}}


def serial_steps(model, steps=3, **options):
    """The same steps on one rank, in this process, on the serial twin (every layer on a one-rank grid,
    the same parameters): the losses ``refconv train --check-serial`` compares with."""
    cfg = _config(model, steps, options)
    x_train, y_train, _, _, num_classes = train.load_dataset(cfg, numpy.dtype(cfg.dtype))
    twin = train.build_model(cfg, serial=True, in_channels=x_train.shape[1], num_classes=num_classes)
    return serial_check.serial_losses(cfg, twin, steps, x_train, y_train)


def _config(model, steps, options):
    return TrainConfig(model=str(model), epochs=1, max_steps=steps, dtype="float64", backend="numpy", progress=False,
                       **options)


# -- what the tutorials record and draw ------------------------------------------------------------
def records(region):
    """The calls of a ``collectives.stats.recording()`` region as
    ``[kind, comm_size, elements, bytes]`` lists, in call order."""
    return [[r.kind, r.comm_size, r.elements, r.bytes] for r in region.records]


def plot_bytes(ax, per_rank, title, *, moved_only=True):
    """Stacked bars: bytes of each collective kind, one bar per rank.

    ``per_rank[r]`` is rank r's :func:`records`.  ``moved_only`` leaves out calls on
    one-rank communicators (recorded by definition; nothing leaves the rank).
    """
    kinds = sorted({k for recs in per_rank for k, q, _, _ in recs if q > 1 or not moved_only})
    bottom = numpy.zeros(len(per_rank))
    for kind in kinds:
        heights = numpy.array([sum(nb for k, q, _, nb in recs if k == kind and (q > 1 or not moved_only))
                               for recs in per_rank], dtype=float)
        ax.bar(range(len(per_rank)), heights, bottom=bottom, label=kind)
        bottom += heights
    ax.set_xticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
    ax.set_ylabel("bytes (buffer sizes, CommStats)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


# -- figures ------------------------------------------------------------------------------------------
FIGURES_ENV = "REFCONV_FIGURES"   # the folder figures are saved to (default: figures/ under the current one)


def _in_jupyter():
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _tutorial_stem():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] else "tutorial")
    return pathlib.Path(path).stem


def show(fig, name):
    """End a figure's cell: in Jupyter, nothing (the figure shows inline); run as a script, save it as
    ``figures/<tutorial>-<name>.png`` (``$REFCONV_FIGURES`` names another folder) and print
    ``figure saved: figures/03_sample_parallelism-compute-and-bytes.png``.  Returns the path, or None."""
    if _in_jupyter():
        return None
    folder = pathlib.Path(os.environ.get(FIGURES_ENV) or "figures")
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"show: name must have a letter or digit (it names the file), got {name!r}")
    path = folder / f"{_tutorial_stem()}-{slug}.png"
    fig.savefig(path, dpi=100)
    print(f"figure saved: {path}")
    return path
