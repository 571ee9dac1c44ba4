"""The compile proof: every kernel compiles for real GPUs (sm_80, sm_90) with NVVM, without a GPU.

The rest of the suite runs the kernels under Numba's simulator, which runs them as
plain Python and so cannot see what NVVM rejects.  These tests run
``refconv.kernels.resources`` in a subprocess with the simulator off (it must be
off before numba is first imported, and this process has it on).  The toolchain
comes from the ``gpu-compile`` extra, which the ``test`` extra includes: without
it these tests fail, they do not skip.

The whole proof (a minute of NVVM, ptxas and nvdisasm) is a function of the code it runs, the page it
checks and the toolchain.  So a passing run is kept with the list of the repository's files it loaded
(every module of refconv/ and kernels/ in its ``sys.modules`` when it ended) and a sha256 of those
files, of every file of kernels/ (a new kernel module is a new file there), of docs/kernels.md and of the
toolchain (:func:`proof_key`).  A run whose files and toolchain hash the same reads the kept run back
instead of compiling again; any change to one of them compiles again.  The kept run goes to
tests/cuda_kernels/compile_proof.json, which is committed, so a fresh clone (CI) whose kernels and
toolchain are those of the last commit that proved them compiles nothing; commit that file when a run
rewrites it.  It also goes to ~/.cache/refconv (or $REFCONV_CACHE_DIR), one file a key.  To compile
anyway: REFCONV_PROVE_AGAIN=1.
"""

import hashlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

from refconv.kernels import resources

ROOT = pathlib.Path(__file__).resolve().parents[2]


CACHE = pathlib.Path(os.environ.get("REFCONV_CACHE_DIR") or pathlib.Path.home() / ".cache" / "refconv") / "compile-proof"
KEPT = ROOT / "tests" / "cuda_kernels" / "compile_proof.json"
PROOF_ARGS = ["--quiet", "--json", "{out}", "--check", "docs/kernels.md"]

# runs the proof as `python -m refconv.kernels.resources` would, then lists the repository's files it loaded
PROVE = """
import json, pathlib, sys
from refconv.kernels import resources
root, loaded_to, args = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
status = resources.main(args)
files = {pathlib.Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
pathlib.Path(loaded_to).write_text(json.dumps(sorted(str(f.relative_to(root)) for f in files
                                                     if f.is_relative_to(root) and ".venv" not in f.parts)))
sys.exit(status)
"""


def run_compiler(*args, code=None, timeout=600):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "refconv.kernels.resources", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


# The tools that install the venv's packages compile nothing the proof runs: a venv made by make setup (uv,
# beside the pip of `python -m venv`) and one made by hand with an upgraded pip prove the same.
INSTALLERS = {"pip", "uv"}


def proof_key(root, args, loaded):
    """sha256 of what ``python -m refconv.kernels.resources *args`` depends on: ``loaded`` (the files of
    refconv/ and kernels/ it imported), every file of kernels/, docs/kernels.md (the page --check
    compares), every installed distribution and its version (numba, numba-cuda, llvmlite and the NVVM,
    ptxas and nvdisasm wheels among them) but the installers (:data:`INSTALLERS`), a ptxas on PATH, the
    Python, and the NUMBA_ and CUDA environment variables.  None if a loaded file is gone."""
    digest = hashlib.sha256(json.dumps(args).encode())
    files = {root / name for name in loaded} | {*root.glob("kernels/**/*")} | {root / "docs" / "kernels.md"}
    for path in sorted(f for f in files if "__pycache__" not in f.parts and not f.is_dir()):
        if not path.is_file():
            return None
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    ptxas = shutil.which("ptxas")
    toolchain = {
        "distributions": sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                                if d.metadata["Name"].lower() not in INSTALLERS),
        "ptxas on PATH": [ptxas, os.stat(ptxas).st_size, os.stat(ptxas).st_mtime_ns] if ptxas else None,
        "python": sys.version, "platform": sys.platform,
        "environment": sorted((k, v) for k, v in os.environ.items() if k.startswith(("NUMBA_", "CUDA"))),
    }
    digest.update(json.dumps(toolchain).encode())
    return digest.hexdigest()


def kept_runs():
    """The passing runs kept: the committed one first, then ~/.cache's."""
    paths = [KEPT, *sorted(CACHE.glob("*.json"))] if CACHE.is_dir() else [KEPT]
    for path in paths:
        try:
            yield path, json.loads(path.read_text())
        except (OSError, ValueError):
            continue


def keep(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)  # whole or absent, for a concurrent run


def run_proof(out):
    """The proof's (returncode, output), writing its JSON to ``out``: from a kept run whose files and
    toolchain hash the same (:func:`proof_key`), else compiled (and kept when it passes)."""
    if os.environ.get("REFCONV_PROVE_AGAIN") != "1":
        for path, record in kept_runs():
            if record.get("key") and proof_key(ROOT, PROOF_ARGS, record["loaded"]) == record["key"]:
                out.write_text(record["result"])
                return 0, f"(the passing run kept in {path})\n" + record["output"]
    loaded_to = out.with_name("loaded.json")
    done = run_compiler(str(ROOT), str(loaded_to), *[a.format(out=out) for a in PROOF_ARGS], code=PROVE)
    if done.returncode == 0:
        loaded = json.loads(loaded_to.read_text())
        key = proof_key(ROOT, PROOF_ARGS, loaded)
        record = {"key": key, "loaded": loaded, "output": done.stdout + done.stderr, "result": out.read_text()}
        keep(KEPT, record)
        keep(CACHE / f"{key}.json", record)
    return done.returncode, done.stdout + done.stderr


def test_the_proof_key_changes_with_a_kernel_a_loaded_module_the_page_or_a_new_kernel_file(tmp_path):
    for name, text in [("kernels/conv.py", "a"), ("refconv/checks.py", "b"), ("refconv/train.py", "t"),
                       ("docs/kernels.md", "c")]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    loaded = ["kernels/conv.py", "refconv/checks.py"]
    first = proof_key(tmp_path, ["--check"], loaded)
    assert proof_key(tmp_path, ["--check"], loaded) == first
    assert proof_key(tmp_path, ["--write"], loaded) != first
    for name in ("kernels/conv.py", "refconv/checks.py", "docs/kernels.md"):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(before + " ")
        assert proof_key(tmp_path, ["--check"], loaded) != first, name
        (tmp_path / name).write_text(before)
    (tmp_path / "refconv" / "train.py").write_text("changed, but the proof never loaded it")
    assert proof_key(tmp_path, ["--check"], loaded) == first
    (tmp_path / "kernels" / "v3.py").write_text("")  # a new kernel file, even empty
    assert proof_key(tmp_path, ["--check"], loaded) != first
    (tmp_path / "kernels" / "v3.py").unlink()
    (tmp_path / "refconv" / "checks.py").unlink()   # a loaded file gone: no key, so no kept run matches
    assert proof_key(tmp_path, ["--check"], loaded) is None


def test_every_kernel_compiles_for_sm80_and_sm90_without_spills_and_the_docs_table_is_current(tmp_path):
    out = tmp_path / "resources.json"
    returncode, output = run_proof(out)
    assert returncode == 0, output
    result = json.loads(out.read_text())
    assert result["ptxas"], "ptxas from the gpu-compile extra must be found, so registers and spills are read"
    rows = result["kernels"]
    compiled = {(r["kernel"], r["dtype"], r["cc"]) for r in rows if "error" not in r}
    from_inventory = {r["kernel"] for r in rows}
    assert len(from_inventory) >= 19  # every kernel of the package (missing_kernels() keeps the list complete)
    fast = {"conv_forward.forward_register_tiled", "conv_backward_data.backward_data_register_tiled",
            "conv_backward_filter.backward_filter_register_tiled"}  # version 3: float32 only
    assert compiled == {(k, d, c) for k in from_inventory for d in ("float32", "float64") for c in ("sm_80", "sm_90")
                        if d == "float32" or k not in fast}
    tiled = [r for r in rows if r["tiled"]]
    # per pass one tiled kernel of each version (2 and 3), for images and volumes alike (the 3-D copies are gone)
    assert {r["kernel"] for r in tiled} == {"conv_forward.forward_tiled", "conv_backward_data.backward_data_tiled",
                                            "conv_backward_filter.backward_filter_tiled"} | fast
    # every kernel: at most 16 integer divides in its PTX and 128 registers (backward-data and pooling included)
    assert all(r["divides"] <= 16 and r["registers"] <= 128 for r in rows), \
        [(r["kernel"], r["dtype"], r["cc"], r["divides"], r["registers"]) for r in rows if r["divides"] > 16
         or r["registers"] > 128]
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 and r["shared_bytes"] > 0 and 0 < r["occupancy"] <= 1
               for r in tiled), tiled  # no spill, and the micro-tile stays in registers
    assert all(r["atomics"] == 0 for r in rows), [r for r in rows if r["atomics"]]
    # among them split-K's partials and their fixed-order sum, so the order of blocks cannot change dW
    split_k = {"conv_backward_filter.backward_filter_tiled", "conv_backward_filter.sum_splits_kernel",
               "conv_backward_filter.backward_filter_register_tiled"}
    assert split_k <= {r["kernel"] for r in rows if r["atomics"] == 0}
    # the static performance table: SASS of each tiled kernel, float32, both targets, within the floors
    # (--check above fails below them); the kk loop is written out, so one pass of the inner loop is a stage
    assert result["nvdisasm"], "nvdisasm from the gpu-compile extra must be found, so the SASS is read"
    profiled = {(r["kernel"], r["cc"]): r["sass"] for r in rows if "sass" in r}
    assert set(profiled) == {(r["kernel"], c) for r in tiled for c in ("sm_80", "sm_90")}
    # version 2: one 16-deep stage of 4 x 4 micro-tiles per pass, 256 FFMAs; version 3: two 8-deep stages of
    # 8 x 8, 1024 FFMAs, the whole loop written out
    assert all(s["inner_trips_per_stage"] == 1 and s["inner_fma"] == (1024 if k in fast else 256)
               for (k, _), s in profiled.items()), profiled
    assert all(s["inner_share"] >= 0.2 and s["per_fma"] <= 5 for s in profiled.values()), profiled
    # version 3 at what it reaches (78.5% to 79.4%), above issue 34's floors: the forward inner loop >= 75% FFMA,
    # every pass >= 60%; 128 registers, no spill (above), 2 blocks per SM
    v3 = {key: s for key, s in profiled.items() if key[0] in fast}
    assert len(v3) == 6 and all(s["inner_share"] >= 0.78 and s["per_fma"] <= 1.28 for s in v3.values()), v3
    assert all(s["inner_share"] >= 0.75 for (k, _), s in v3.items() if k.startswith("conv_forward")), v3
    assert all(r["registers"] <= 128 and r["blocks_per_sm"] == 2 for r in tiled if r["kernel"] in fast), tiled


def test_the_committed_proof_lists_the_modules_the_kernels_import():
    """The kept run's list of loaded files is what the key covers: it must hold the kernels and the refconv
    modules they import (a list that missed them would let a change to them read back a stale proof)."""
    record = json.loads(KEPT.read_text())
    assert {"kernels/conv_forward.py", "kernels/resources.py", "refconv/checks.py", "refconv/arrays.py",
            "refconv/__init__.py"} <= set(record["loaded"])


def test_the_atomic_counter_finds_atomics_where_they_are():
    """The split-K partials and their fixed-order sum have no atom./red. in their PTX (asserted for every
    compiled kernel above, the split-K ones named), so no order of blocks matters; here, the counter that
    assertion rests on finds both kinds."""
    ptx = "\tatom.global.add.f32 %f1, [%rd1], %f2;\n\t@%p1 red.global.add.f64 [%rd2], %fd1;\n\tadd.f32 %f3, %f1, %f2;"
    assert resources.ptx_counts(ptx) == {"atomics": 2, "divides": 0}


def test_the_proof_fails_on_the_typing_error_the_simulator_hid_and_on_a_spill_a_stack_frame_an_atomic_or_a_ceiling():
    """The defect this proof exists for: a shared array whose shape is a run-time sum."""
    code = textwrap.dedent("""
        import numpy
        from numba import cuda, types
        from numba.core.errors import TypingError
        from refconv.kernels import resource_tables, resources
        from refconv.kernels.tiles_v2 import PAD, TILE_K, TILE_M

        def bad(x):  # as the tiled kernels were written before the proof
            tile = cuda.shared.array((TILE_K, TILE_M + PAD), numpy.float32)
            tile[0, 0] = x[0]

        def good(x):
            tile = cuda.shared.array((TILE_K, TILE_M), numpy.float32)
            tile[0, 0] = x[0]
            x[0] = tile[0, 0]

        sig = (types.Array(types.float32, 1, "C"),)
        try:
            cuda.compile_ptx(bad, sig, cc=(9, 0))
        except TypingError:
            print("bad: TypingError")
        ptx, _ = cuda.compile_ptx(good, sig, cc=(9, 0))
        print("good:", resources.assemble(ptx, (9, 0), resources.ptxas_path()))
        row = dict(kernel="conv_forward.forward_tiled", tiled=True, dtype="float32", cc="sm_90", spill_bytes=8)
        print("spill:", resources.failures({"kernels": [row]}))
        row = dict(row, spill_bytes=0, stack_bytes=64)
        print("stack:", resources.failures({"kernels": [row]}))
        row = dict(row, stack_bytes=0, atomics=8)
        print("atomics:", resources.failures({"kernels": [row]}))
        row = dict(row, atomics=0, divides=17, registers=130)
        print("ceilings:", resources.failures({"kernels": [row]}))
        fast = dict(kernel="conv_forward.forward_register_tiled", version=3, tiled=True, dtype="float32", cc="sm_90",
                    sass=dict(inner_share=0.70, per_fma=1.2))
        slow = dict(fast, kernel="conv_backward_data.backward_data_register_tiled", sass=dict(inner_share=0.5, per_fma=1.2))
        print("floors:", resources.failures({"kernels": [fast, slow]}))
        print("blocks:", resource_tables.occupancy(128, 8320, 256, resource_tables.SMS[(9, 0)]))
    """)
    done = run_compiler(code=code)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["bad"] == "TypingError"
    assert "'shared_bytes': 4096" in lines["good"] and "'spill_bytes': 0" in lines["good"]
    assert "spills 8 bytes" in lines["spill"]
    assert "a 64-byte stack frame" in lines["stack"]
    assert "8 atomic instruction(s)" in lines["atomics"]
    assert "17 integer divides in its PTX, above 16" in lines["ceilings"] and "130 registers, above 128" in lines["ceilings"]
    # a version 3 kernel below its own floor, and below issue 34's floor for its pass
    assert "conv_forward.forward_register_tiled float32 sm_90: FFMAs are 70% of its inner loop, below the floor 78%" \
        in lines["floors"]
    assert "conv_forward.forward_register_tiled float32 sm_90: FFMAs are 70% of its inner loop, below issue 34's floor " \
        "for the conv_forward pass, 75%" in lines["floors"]
    assert "conv_backward_data.backward_data_register_tiled float32 sm_90: FFMAs are 50% of its inner loop, below " \
        "issue 34's floor for the conv_backward_data pass, 60%" in lines["floors"]
    # 128 registers x 32 lanes = 4096 per warp; 65536 / 4096 = 16 warps = 2 blocks of 8 warps: 25%, by registers
    assert lines["blocks"] == "(2, 0.25, 'registers')"


def test_float32_batch_norm_apply_stays_float32():
    """The per-element batch-norm kernels compiled for float32 hold no float64 instruction (count is passed in the
    data's dtype); the float64 versions do, so the check can see one."""
    code = textwrap.dedent("""
        import re
        import numpy
        from refconv.kernels import resources

        for kernel in resources.KERNELS:
            if kernel.name in ("batch_norm_apply_kernel", "batch_norm_backward_apply_kernel"):
                for dtype in (numpy.float32, numpy.float64):
                    f64 = re.findall(r"[.]f64[^0-9a-z_]", resources.compile_ptx(kernel, dtype, (9, 0)))
                    print(f"{kernel.name} {numpy.dtype(dtype).name}: {len(f64)}")
    """)
    done = run_compiler(code=code)
    assert done.returncode == 0, done.stdout + done.stderr
    counts = {k: int(v) for k, v in (line.split(": ") for line in done.stdout.splitlines())}
    assert set(counts) == {f"{k} {d}" for k in ("batch_norm_apply_kernel", "batch_norm_backward_apply_kernel")
                           for d in ("float32", "float64")}
    assert all(v == 0 for k, v in counts.items() if k.endswith("float32")), counts
    assert all(v > 0 for k, v in counts.items() if k.endswith("float64")), counts


LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDS R2, [R3] ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_2:
        /*0030*/                   LDS R4, [R5] ;
        /*0040*/                   FFMA R6, R4, R4, R6 ;
        /*0050*/                   FFMA R7, R4, R4, R7 ;
        /*0060*/                   FFMA R8, R4, R4, R8 ;
        /*0070*/                   FFMA R9, R4, R4, R9 ;
        /*0080*/               @P0 BRA `(.L_x_2) ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/               @P1 BRA `(.L_x_1) ;
        /*00b0*/                   EXIT ;
"""


def test_the_sass_profile_finds_the_inner_loop_and_counts_per_stage():
    """kernels/sass.py on a hand-written listing: a stage loop (with its barriers) around a kk loop of 4 FFMAs
    in 6 instructions, which a stage runs 64 times (256 FFMAs per thread)."""
    code = "from refconv.kernels import sass\np = sass.profile(" + repr(LISTING) + ")\n" \
           "print(p['inner_loop'], p['inner_fma'], p['inner_trips_per_stage'], p['stage_instructions'], p['loops'])"
    done = run_compiler(code=code)
    assert done.returncode == 0, done.stdout + done.stderr
    # the stage loop: 10 instructions, of which the inner 6 run 64 times: 4 + 6 * 64 = 388
    assert done.stdout.split(" ", 4)[:4] == ["6", "4", "64", "388"], done.stdout
    assert "[(10, 0.4), (6, 0.6666666666666666)]" in done.stdout
