"""The architecture's rules, checked: a docs claim is a test (STYLE.md, habit 13).

- every MPI data movement goes through the refconv/collectives/ package;
- only refconv/arrays.py imports CuPy (the one array-module helper);
- imports sit at the top of a module (the tests' too) unless they defer an optional dependency
  or an expensive initialisation (each one listed here, with why);
- model_spec does not import model (no cycle), and kernels/ use only public
  validators;
- three layering rules: kernels/ import nothing of refconv above refconv.reference (the
  array module, the validators and the reference, which themselves import nothing above);
  the pricing model (refconv/pricing/) imports no layer, so layers, which ask it for
  ``algorithm="auto"``, and pricing do not import each other; and the pricing model imports
  no tool, and layers and training import no planning tool (refconv.plan);
- the worked example of docs/testing.md is the class that
  tests/on_ranks/test_fifth_algorithm.py registers, and the test it runs on simulated ranks,
  letter for letter.
"""

import ast
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("refconv/**/*.py"), *ROOT.glob("kernels/*.py")])
TESTS = sorted(ROOT.glob("tests/**/*.py"))

# comm.<method>( for a method that moves data
DATA_MOVEMENT = re.compile(
    r"(\w+)\.(Allreduce|Iallreduce|Allgatherv?|Iallgatherv?|I?Reduce_scatter(?:_block)?|Alltoall[vw]?|Ialltoall[vw]?|"
    r"Send|Recv|Isend|Irecv|[Ss]endrecv(?:_replace)?|Bcast|Ibcast|bcast|allgather|allreduce|gather|scatter|Gatherv?|Scatterv?|"
    r"I?[Ee]xscan|I?[Ss]can|"
    r"Barrier|barrier|alltoall|send|recv|reduce|Reduce)\(")
# module names whose methods of these names are not MPI calls
NOT_MPI = {"collectives", "sharding", "refconv", "functools", "halo", "_halo", "self"}
# files allowed to call MPI directly, and why
MPI_ALLOWED = {
    "refconv/collectives/ops.py": "the operations: the one module of MPI data movement",
    "refconv/collectives/control.py": "barrier, split and small objects, under the same deadline",
    "refconv/bench/collectives.py": "times raw Allreduce, Reduce_scatter and Allgatherv against the wrappers",
    "refconv/testing/mpirun.py": "the test harness's own barrier between tests, outside the code under test",
    "refconv/simulated/comm.py": "the simulated ranks' communicator: it implements these calls (behind the collectives)",
    "refconv/simulated/engine.py": "the simulated ranks' engine: it implements these calls (behind the collectives)",
    "refconv/failure.py": "a leaving rank's 8-byte notices (Isend at exit, one posted Irecv): control, not data, "
                          "sent after training and outside the watchdog, which must not end a rank that is leaving "
                          "(and collectives imports failure)",
}

# (file, imported module prefix) allowed inside a function, and why
LAZY_IMPORTS = {
    ("refconv/shapes/array.py", "refconv.shapes"): "its namespace and dispatch import ShapeArray: a cycle, broken at the call",
    ("refconv/simulated/buffers.py", "refconv.shapes"): "the simulator's core imports only refconv.collectives; the error of a mixed message, when raised",
    ("refconv/simulated/engine.py", "refconv.shapes"): "the simulator's core imports only refconv.collectives; the error of a mixed post, when raised",
    ("refconv/simulated/groups.py", "refconv.simulated"): "comm imports groups, and engine imports comm: a cycle, broken at the call",
    ("refconv/arrays.py", "cupy"): "optional dependency; importing it proves nothing about a GPU",
    ("refconv/arrays.py", "numba"): "numba.cuda's streams need a context: only on a real GPU, after the device is chosen",
    ("kernels/resources.py", "numba"): "numba-cuda's compiler modules: absent under the simulator, which the proof refuses",
    ("kernels/resources.py", "nvidia"): "ptxas from the optional gpu-compile extra",
    ("kernels/sass.py", "nvidia"): "nvdisasm from the optional gpu-compile extra",
    ("refconv/backend.py", "refconv"): "refconv.kernels imports numba.cuda, which must see NUMBA_ENABLE_CUDASIM first",
    ("refconv/simulated/__init__.py", "refconv.simulated.clock"): "the logical clock prices with the layers and the "
                                                                 "pricing model: only for a run given machine=, so "
                                                                 "the simulator's core sits below them",
    ("refconv/device.py", "numba"): "numba.cuda initialises the driver: only after the GPU is chosen",
    ("refconv/bench/kernels.py", "torch"): "optional contender",
    ("refconv/bench/kernels.py", "cupy"): "optional contender (cuDNN through CuPy)",
    ("refconv/bench/kernels.py", "refconv"): "refconv.kernels imports numba.cuda: only when timing the GPU",
    ("refconv/bench/torch_step.py", "torch"): "optional contender",
    ("refconv/bench/step.py", "torch"): "optional contender",
    ("refconv/plan/project.py", "matplotlib"): "optional (the test and docs extras): only for plots",
    ("refconv/overlap.py", "matplotlib"): "optional (the test and docs extras): only for the timeline figure",
    ("refconv/commands/plot.py", "matplotlib"): "optional (the test and docs extras): only for plots",
    ("refconv/datastore/formats.py", "h5py"): "optional (the data extra): only for an HDF5 store",
    ("refconv/datastore/imagefolder.py", "PIL"): "optional (the data extra): only for an image folder",
    ("refconv/torch.py", "torch"): "optional: refconv.torch is the only module that needs PyTorch",
    ("refconv/testing/mpirun.py", "mpi4py"): "the launcher lists tests without initialising MPI",
    ("refconv/testing/mpirun.py", "hypothesis"): "runs only inside a launched rank",
    ("refconv/testing/mpirun.py", "refconv.testing.profiles"): "runs only inside a launched rank",
    ("refconv/testing/mpirun.py", "refconv.testing.asserts"): "runs only inside a launched rank (it imports MPI)",
    ("tests/conftest.py", "cupy"): "optional; decides NUMBA_ENABLE_CUDASIM before numba is first imported",
    ("tests/conftest.py", "refconv"): "refconv may import numba: only after the simulator switch",
    ("tests/simulator/test_standins.py", "mpi4py"): "a from-import of MPI.COMM_WORLD made on a simulated rank is "
                                                    "what it tests",
    ("tests/docs_and_tutorials/test_site.py", "site_hooks"): "docs/site_hooks.py is imported from a path put on sys.path for the call",
    ("tests/docs_and_tutorials/test_tutorials.py", "course"): "tutorials/course.py is imported from a path put on sys.path for the test",
}


def _rel(path):
    return str(path.relative_to(ROOT))


def _code_lines(path):
    """Source lines outside docstrings and comments."""
    tree = ast.parse(path.read_text())
    doc_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
                and isinstance(node.value.value, str):
            doc_lines.update(range(node.lineno, node.end_lineno + 1))
    for k, line in enumerate(path.read_text().splitlines(), 1):
        if k not in doc_lines:
            yield k, line.split("#", 1)[0]


def test_the_sources_are_found():
    assert len(SOURCES) > 40 and set(MPI_ALLOWED) <= set(map(_rel, SOURCES))


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_mpi_data_movement_only_in_collectives(path):
    if _rel(path) in MPI_ALLOWED:
        return
    calls = [f"{_rel(path)}:{k}: {line.strip()}" for k, line in _code_lines(path)
             for m in DATA_MOVEMENT.finditer(line) if m.group(1) not in NOT_MPI]
    assert not calls, "call MPI through refconv.collectives:\n" + "\n".join(calls)


def test_the_mpi_scan_finds_a_direct_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""comm.Allreduce(x) in a docstring is fine."""\ny = comm.Allreduce(x, out)  # but not here\n')
    found = [m.group(0) for _, line in _code_lines(bad) for m in DATA_MOVEMENT.finditer(line)]
    assert found == ["comm.Allreduce("]


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_only_arrays_imports_cupy(path):
    if _rel(path) in ("refconv/arrays.py", "refconv/bench/kernels.py"):  # the bench times cuDNN through CuPy
        return
    imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in imports if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] == "cupy"], f"{_rel(path)} imports cupy: use refconv.arrays"


def _lazy_imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import):
                    yield from ((sub.lineno, a.name) for a in sub.names)
                elif isinstance(sub, ast.ImportFrom):
                    yield sub.lineno, sub.module or "."


@pytest.mark.parametrize("path", SOURCES + TESTS, ids=_rel)
def test_imports_at_the_top(path):
    hidden = [f"{_rel(path)}:{line}: import {name}" for line, name in _lazy_imports(path)
              if not any(_rel(path) == f and (name == m or name.startswith(m + ".")) for f, m in LAZY_IMPORTS)]
    assert not hidden, "move these imports to the top of the module (or list why in LAZY_IMPORTS):\n" + \
        "\n".join(hidden)


def test_no_import_cycle_between_model_and_spec():
    spec = ast.parse((ROOT / "refconv/model_spec.py").read_text())
    imported = {n.module for n in ast.walk(spec) if isinstance(n, ast.ImportFrom)}
    assert "refconv.model" not in imported


@pytest.mark.parametrize("path", sorted(ROOT.glob("kernels/*.py")), ids=_rel)
def test_kernels_use_only_public_validators(path):
    text = path.read_text()
    assert not re.search(r"from refconv[\w.]* import _|refconv\.\w+\._", text), f"{_rel(path)} imports a private"


def _between(text, start, end):
    i = text.index(start)
    return text[i:text.index(end, i)].rstrip()


START = "@algorithms.register\nclass AllreduceX"


TEST_START = "def _layer(case, grid):"


def test_the_worked_example_is_the_tested_class():
    text, page = (ROOT / "tests/on_ranks/test_fifth_algorithm.py").read_text(), (ROOT / "docs/testing.md").read_text()
    tested = _between(text, START, "# -- end of the algorithm")
    assert _between(page, START, "```") == tested, \
        "docs/testing.md shows a different AllreduceX than tests/on_ranks/test_fifth_algorithm.py"
    tested = _between(text, TEST_START, "# -- end of the test")
    assert _between(page, TEST_START, "```") == tested, \
        "docs/testing.md shows a different first test than tests/on_ranks/test_fifth_algorithm.py"


# the modules that run things: commands, benchmarks, the planning tools
TOOLS = ("refconv.plan", "refconv.train", "refconv.bench", "refconv.commands", "refconv.cli")


def _imported(path):
    """Every module ``path`` imports, absolute (``from refconv import x`` gives refconv and refconv.x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _is_tool(name):
    return any(name == t or name.startswith(t + ".") for t in TOOLS)


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p).startswith("refconv/pricing/")], ids=_rel)
def test_the_pricing_model_imports_no_tool(path):
    assert not [n for n in _imported(path) if _is_tool(n)], f"{_rel(path)} imports a tool"


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p).startswith("refconv/layers/")
                                  or _rel(p).startswith("refconv/train")  # train.py, train_config.py, train_*.py
                                  or _rel(p) in ("refconv/model.py", "refconv/model_spec.py")], ids=_rel)
def test_layers_and_training_import_no_planning_tool(path):
    assert not [n for n in _imported(path) if n == "refconv.plan" or n.startswith("refconv.plan.")], \
        f"{_rel(path)} imports refconv.plan: ask refconv.pricing"


def test_the_import_scan_sees_from_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from refconv import plan\nfrom refconv.bench import common\n")
    assert [n for n in _imported(bad) if _is_tool(n)] == ["refconv.plan", "refconv.bench", "refconv.bench.common"]


# kernels/ sit at the bottom: what they import of refconv, and what those import of refconv in turn
BELOW_KERNELS = ("refconv.arrays", "refconv.checks", "refconv.reference")


def _refconv_imports(path):
    """The refconv modules ``path`` imports, ``refconv`` itself (from ``from refconv import x``) left out."""
    return sorted({n for n in _imported(path) if n.startswith("refconv.")})


def _below(name):
    return any(name == m or name.startswith(m + ".") for m in BELOW_KERNELS)


@pytest.mark.parametrize("path", sorted(ROOT.glob("kernels/*.py")) + sorted(ROOT.glob("refconv/reference/*.py"))
                         + [ROOT / "refconv/arrays.py", ROOT / "refconv/checks.py"], ids=_rel)
def test_kernels_import_nothing_above_the_reference(path):
    """Layering rule 1: refconv.kernels, and the modules it imports, import only refconv.arrays,
    refconv.checks and refconv.reference (a from-import names a module or a name in one)."""
    above = [n for n in _refconv_imports(path) if not _below(n)]
    assert not above, f"{_rel(path)} imports {above}: kernels/ may use only {BELOW_KERNELS}"


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p).startswith("refconv/pricing/")], ids=_rel)
def test_the_pricing_model_imports_no_layer(path):
    """Layering rule 2: layers ask the pricing model (``algorithm="auto"``), so pricing must not import
    a layer module; the calls of the layers it prices stand in refconv/pricing/records.py."""
    layers = [n for n in _imported(path) if n == "refconv.layers" or n.startswith("refconv.layers.")]
    assert not layers, f"{_rel(path)} imports {layers}: a cycle with refconv.layers"


def test_the_layering_scans_see_a_bad_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from refconv.bench.torch_step import SHAPES\nfrom refconv import checks\n"
                   "from refconv.layers.pool import gap_records\n")
    assert [n for n in _refconv_imports(bad) if not _below(n)] == [
        "refconv.bench.torch_step", "refconv.bench.torch_step.SHAPES", "refconv.layers.pool",
        "refconv.layers.pool.gap_records"]


# -- the layer order (README.md, "Layout") ------------------------------------------------------------
# Low to high: a module imports, at module level, only modules of its own layer or of a lower one.  A
# module belongs to the longest prefix listed (refconv.simulated.clock is not refconv.simulated's core).
# An import inside a function (LAZY_IMPORTS) is not an arrow: refconv.backend loads refconv.kernels only
# when asked, refconv.simulated the clock only for machine=.
LAYERS = (
    ("reference", ("refconv.arrays", "refconv.checks", "refconv.failure", "refconv.reference", "refconv.kernels",
                   "refconv.backend", "refconv.spec_tree", "refconv.recipe", "refconv.overlap", "refconv.datasets",
                   "refconv.testing", "refconv.testing.mpirun", "refconv.testing.profiles")),
    ("collectives", ("refconv.collectives", "refconv.shapes")),   # shapes-only arrays: their memory is per rank
    ("simulated core", ("refconv.simulated",)),   # world, comm, engine, buffers and run(): the clock is lazy
    ("grid and distribution", ("refconv.grid", "refconv.distribution", "refconv.halo", "refconv.sharding",
                               "refconv.threads", "refconv.device", "refconv.testing.asserts",
                               "refconv.testing.strategies", "refconv.testing.ranks")),
    ("algorithms", ("refconv.algorithms",)),
    ("pricing", ("refconv.pricing",)),
    ("layers", ("refconv.layers", "refconv.testing.check", "refconv.testing.mutants", "refconv.testing.models")),
    ("model", ("refconv", "refconv.model", "refconv.model_spec", "refconv.optim", "refconv.checkpoint",
               "refconv.torch", "refconv.simulated.clock")),
    ("data and options", ("refconv.datastore", "refconv.train_config")),
    ("train", ("refconv.train",)),
    ("tools and commands", ("refconv.cli", "refconv.commands", "refconv.bench", "refconv.plan", "refconv.cost_model",
                            "refconv.launch", "refconv.testing.commands")),
)


def _module_name(path):
    parts = list(pathlib.Path(_rel(path)).with_suffix("").parts)
    parts = ["refconv", *parts] if parts[0] == "kernels" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(name):
    """The index in LAYERS of module ``name`` (or of a name in it), or None."""
    found = [(len(m), k) for k, (_, modules) in enumerate(LAYERS) for m in modules
             if name == m or name.startswith(m + ".")]
    return max(found)[1] if found else None


def _module_level_imports(path):
    """The refconv modules ``path`` imports outside any function (``from refconv import x``: refconv.x)."""
    names = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                names.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                names.extend(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return sorted({n for n in names if n.startswith("refconv.")})


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_every_module_has_a_layer(path):
    assert _layer(_module_name(path)) is not None, \
        f"{_rel(path)} ({_module_name(path)}) is in no layer: add it to LAYERS and to README.md's layer order"


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_module_imports_a_higher_layer(path):
    mine = _layer(_module_name(path))
    higher = [f"{n} ({LAYERS[_layer(n)][0]})" for n in _module_level_imports(path)
              if _layer(n) is not None and mine is not None and _layer(n) > mine]
    assert not higher, f"{_rel(path)} ({LAYERS[mine][0]}) imports a higher layer: {higher}"


def test_the_layer_scan_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from refconv import train\nfrom refconv.layers.pool import gap_records\n\n"
                   "def lazy():\n    from refconv.simulated import clock\n")
    assert _module_level_imports(bad) == ["refconv.layers.pool.gap_records", "refconv.train"]
    assert [_layer(n) for n in _module_level_imports(bad)] == [6, 9]


def test_the_readme_states_the_layer_order():
    readme = (ROOT / "README.md").read_text()
    order = " < ".join(name for name, _ in LAYERS)
    assert order in readme, f"README.md should state the layer order of LAYERS: {order}"


SIMULATOR_CORE = ("world", "comm", "request", "engine", "buffers", "params", "poison", "standins", "schedules",
                  "groups", "leaks")
CORE_THIRD_PARTY = ("numpy", "mpi4py")   # mpi4py for MPI's constants and datatypes, which the simulated comm keeps


@pytest.mark.parametrize("name", SIMULATOR_CORE)
def test_the_simulator_core_imports_only_collectives(name):
    """The simulator's core sits low: world, comm, engine, buffers, params, poison, standins, schedules, groups and leaks import, at module level, only
    refconv.collectives, each other, NumPy, mpi4py and the standard library."""
    path = ROOT / f"refconv/simulated/{name}.py"
    tree = ast.parse(path.read_text())
    modules = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
    core = tuple(f"refconv.simulated.{m}" for m in SIMULATOR_CORE) + ("refconv.simulated", "refconv.collectives")
    bad = [m for m in modules if m.split(".")[0] not in {*sys.stdlib_module_names, *CORE_THIRD_PARTY}
           and not any(m == c or m.startswith(c + ".") for c in core)]
    assert not bad, f"refconv/simulated/{name}.py imports {bad}: the core may use only refconv.collectives"


def test_the_simulated_package_loads_the_clock_only_for_a_machine():
    modules = _module_level_imports(ROOT / "refconv/simulated/__init__.py")
    assert not [m for m in modules if m.startswith("refconv.simulated.clock") or _layer(m) > _layer("refconv.simulated")]


MAX_TOP_LEVEL_MODULES = 24


def test_the_package_top_level_stays_small():
    """New modules go into a package (refconv/commands/, refconv/train/, ...), not beside refconv/cli.py."""
    top = sorted(p.name for p in ROOT.glob("refconv/*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, \
        f"refconv/ holds {len(top)} modules, more than {MAX_TOP_LEVEL_MODULES}: move some into a package: {top}"


def test_library_packages_import_no_command():
    """A command (a module with a command-line entry point) lives in refconv/commands/ or with its tool
    (refconv/plan/, refconv/bench/): nothing below the tools imports one."""
    top = len(LAYERS) - 1
    for path in SOURCES:
        if _layer(_module_name(path)) != top:
            commands = [n for n in _module_level_imports(path) if n.startswith(("refconv.commands", "refconv.cli"))]
            assert not commands, f"{_rel(path)} imports the command {commands}"


TRAIN_API = ("train", "step", "evaluate", "learning_rate", "Diverged", "format_summary", "build_model", "load_dataset",
             "load_model_spec")


def test_the_training_api_has_one_spelling():
    """What refconv.train exports is spelled refconv.train.NAME outside the package (docs and tutorials too),
    never with the submodule that holds it."""
    exported = [n for n in ast.parse((ROOT / "refconv/train/__init__.py").read_text()).body
                if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"][0]
    assert sorted(ast.literal_eval(exported.value)) == sorted(TRAIN_API)
    pattern = re.compile(r"from refconv\.train\.(\w+) import ([^\n]*)|refconv\.train\.(\w+)\.(\w+)")
    files = [*SOURCES, *TESTS, *ROOT.glob("docs/**/*.md"), *ROOT.glob("tutorials/**/*.py"), ROOT / "README.md",
             *ROOT.glob("scripts/*.py"), *ROOT.glob("examples/**/*.py")]
    found = []
    for path in files:
        if _rel(path).startswith("refconv/train/"):
            continue
        for m in pattern.finditer(path.read_text()):
            names = re.findall(r"\w+", m.group(2)) if m.group(1) else [m.group(4)]
            found += [f"{_rel(path)}: {m.group(0)}" for n in names if n in TRAIN_API]
    assert not found, "spell these refconv.train.NAME:\n" + "\n".join(found)

# ------------------------------------------------------------------ module length (issue 40)
MAX_MODULE_LINES = 500
GENERATED_HEADER = "# Generated by "  # a checked-in generated source (kernels/generate.py) is exempt


def _long_modules(paths, limit=MAX_MODULE_LINES):
    """``["path: N lines", ...]`` of the sources over ``limit`` lines, longest first, generated ones left out."""
    counts = {}
    for path in paths:
        text = path.read_text()
        if not text.startswith(GENERATED_HEADER):
            counts[path] = len(text.splitlines())
    return [f"{_rel(p) if ROOT in p.parents else p}: {n} lines"
            for p, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n > limit]


def test_no_source_module_is_over_500_lines():
    """A module that outgrows a few hundred lines is split along a line a reader recognises (STYLE.md, habit 8)."""
    long = _long_modules(SOURCES)
    assert not long, (f"split these modules (at most {MAX_MODULE_LINES} lines, generated sources excepted):\n"
                      + "\n".join(long))


def test_the_length_rule_sees_a_long_module_and_spares_a_generated_one(tmp_path):
    long, generated, short = (tmp_path / name for name in ("long.py", "generated.py", "short.py"))
    long.write_text("x = 1\n" * 501)
    generated.write_text(GENERATED_HEADER + "a script\n" + "x = 1\n" * 600)
    short.write_text("x = 1\n" * 500)
    assert _long_modules([short, generated, long]) == [f"{long}: 501 lines"]
