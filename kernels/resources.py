"""Every kernel compiled for real GPUs, without a GPU, and what each one uses.

The CUDA simulator runs a kernel as plain Python, so it cannot catch what
NVVM rejects: a shared array of non-literal shape, say, runs there and fails on
the first real GPU.  This module compiles every kernel of ``refconv.kernels``
with numba-cuda's real compiler (NVVM and libdevice from the pip CUDA wheels;
no driver, no device), then assembles the PTX with ``ptxas -v`` and reads the
registers, spills and shared memory of each kernel.  From those it works out
the occupancy on an SM and, for the convolutions, the bound each version can
reach on the six ResNet-50 shapes (a roofline on H200 figures).

    NUMBA_ENABLE_CUDASIM=0 python -m refconv.kernels.resources            # the table
    NUMBA_ENABLE_CUDASIM=0 python -m refconv.kernels.resources --json F   # every figure
    NUMBA_ENABLE_CUDASIM=0 python -m refconv.kernels.resources --check docs/kernels.md
    NUMBA_ENABLE_CUDASIM=0 python -m refconv.kernels.resources --write docs/kernels.md

It needs the ``gpu-compile`` extra (``pip install -e '.[gpu-compile]'``, which the
``test`` extra includes).  ``tests/cuda_kernels/test_kernel_compile.py`` runs it on every CI
run and fails on a typing error, an NVVM error, an atomic instruction in any
kernel, or a spill or stack frame in a tiled kernel.

``KERNELS`` is the inventory: every ``@cuda.jit`` kernel of the package with the
argument types its host function launches it with.  :func:`missing_kernels`
finds a kernel that the inventory lacks, so a new one cannot escape the proof.

The tables it checks against and writes (the ceilings and floors, the SM limits, the roofline, the
markdown of docs/kernels.md) are :mod:`refconv.kernels.resource_tables`.
"""

import argparse
import concurrent.futures
import dataclasses
import functools
import importlib
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types as pytypes

import numpy

from . import sass, tiles_v3
from .geometry import THREADS
from .resource_tables import (
    FFMA_SHARE_FLOORS, ISSUE_FLOORS, MAX_DIVIDES, MAX_INSTRUCTIONS_PER_FFMA, MAX_REGISTERS, SMS, markdown, occupancy,
    replace_block,
)
from .tiles_v2 import MICRO, TILE_K

CCS = ((8, 0), (9, 0))
DTYPES = (numpy.float32, numpy.float64)
MODULES = ("conv_forward", "conv_backward_data", "conv_backward_filter", "elementwise", "batch_norm", "pooling")


# ------------------------------------------------------------------ the inventory
@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel: where it lives, how to get it for a dtype, and its launch signature."""

    module: str    # a module of refconv.kernels
    name: str      # the @cuda.jit function, or the cached factory of a tiled kernel
    version: int   # 1 (direct) or 2 (tiled); 0 for kernels with one version
    args: str      # argument types, one letter each (see signature)
    threads: int   # threads per block at launch
    # the dtypes it is compiled for: version 3 is float32 only (64 float64 accumulators alone would fill the 128
    # registers; its host functions run version 2 for float64)
    dtypes: tuple = ("float32", "float64")

    @property
    def label(self):
        return f"{self.module}.{self.name}"

    @property
    def tiled(self):
        return self.version >= 2

    @property
    def fmas_per_stage(self):
        """Multiply-adds one thread does per shared-memory stage: ``TILE_K * MICRO**2`` (version 2) or
        ``tiles_v3.TILE_K * tiles_v3.MICRO**2`` (version 3)."""
        return tiles_v3.TILE_K * tiles_v3.MICRO ** 2 if self.version == 3 else TILE_K * MICRO ** 2

    def dispatcher(self, dtype):
        obj = getattr(importlib.import_module(f"refconv.kernels.{self.module}"), self.name)
        return obj(dtype) if self.tiled else obj

    def signature(self, dtype):
        """Numba types for ``args``: ``1``-``4`` a C-contiguous array of that rank in
        ``dtype``, ``s`` a scalar in ``dtype``, ``L`` an int64 array of rank 5 (pooling's argmax), ``D`` a
        float64 array of rank 2, ``T`` an int32 array of rank 2 (``geometry.tap_table``), ``i`` an int64, ``f`` a
        float64, ``b`` a bool."""
        from numba import types

        element = types.float32 if dtype == numpy.float32 else types.float64
        kinds = {"i": types.int64, "f": types.float64, "b": types.boolean, "s": element,
                 "L": types.Array(types.int64, 5, "C"), "D": types.Array(types.float64, 2, "C"),
                 "T": types.Array(types.int32, 2, "C")}
        return tuple(types.Array(element, int(a), "C") if a.isdigit() else kinds[a] for a in self.args)


TILE_THREADS = 256  # geometry.THREADS ** 2, checked in missing_kernels
KERNELS = (
    Kernel("conv_forward", "forward_direct", 1, "555" + "i" * 10, 256),
    Kernel("conv_forward", "forward_tiled", 2, "52T3" + "i" * 10, TILE_THREADS),
    Kernel("conv_forward", "forward_register_tiled", 3, "11T1" + "i" * 19, TILE_THREADS, ("float32",)),
    Kernel("conv_backward_data", "backward_data_direct", 1, "555" + "i" * 10, 256),
    Kernel("conv_backward_data", "backward_data_tiled", 2, "53T3" + "i" * 9, TILE_THREADS),
    Kernel("conv_backward_data", "backward_data_register_tiled", 3, "11T1" + "i" * 19, TILE_THREADS, ("float32",)),
    Kernel("conv_backward_filter", "backward_filter_direct", 1, "555" + "i" * 10, 256),
    Kernel("conv_backward_filter", "backward_filter_tiled", 2, "53T3" + "i" * 11, TILE_THREADS),
    Kernel("conv_backward_filter", "backward_filter_register_tiled", 3, "11TT1" + "i" * 11, TILE_THREADS, ("float32",)),
    Kernel("conv_backward_filter", "sum_splits_kernel", 0, "21", 256),
    Kernel("elementwise", "bias_add_kernel", 0, "41", 256),
    Kernel("elementwise", "relu_forward_kernel", 0, "11", 256),
    Kernel("elementwise", "relu_backward_kernel", 0, "111", 256),
    Kernel("batch_norm", "channel_sums_kernel", 0, "3311DDb", 256),
    Kernel("batch_norm", "channel_sums_finish_kernel", 0, "DD11b", 256),
    Kernel("batch_norm", "batch_norm_apply_kernel", 0, "411114", 256),
    Kernel("batch_norm", "batch_norm_backward_apply_kernel", 0, "4411111s4", 256),
    Kernel("pooling", "max_pool_forward_kernel", 0, "55L" + "i" * 9, 256),
    Kernel("pooling", "max_pool_backward_kernel", 0, "5L5" + "i" * 9, 256),
    Kernel("pooling", "avg_pool_forward_kernel", 0, "55" + "i" * 9, 256),
    Kernel("pooling", "avg_pool_backward_kernel", 0, "55" + "i" * 9, 256),
)


def missing_kernels():
    """Kernels of the package that ``KERNELS`` does not list (should be empty)."""
    from numba.cuda.dispatcher import CUDADispatcher

    assert THREADS ** 2 == TILE_THREADS, "TILE_THREADS must be geometry.THREADS ** 2"
    listed = {k.label for k in KERNELS}
    found = set()
    for name in MODULES:
        module = importlib.import_module(f"refconv.kernels.{name}")
        for attr, obj in vars(module).items():
            if getattr(obj, "__module__", module.__name__) != module.__name__:
                continue  # imported from elsewhere
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device"):
                found.add(f"{name}.{attr}")
            elif attr.endswith("_tiled") and callable(obj):
                found.add(f"{name}.{attr}")
    return sorted(found - listed)


# ------------------------------------------------------------------ compiling
def _require_compiler():
    from numba import config

    if config.ENABLE_CUDASIM:
        raise SystemExit("refconv.kernels.resources: Numba's CUDA simulator is on; run with "
                         "NUMBA_ENABLE_CUDASIM=0 (the simulator cannot compile for a GPU)")


@functools.cache
def _target_device(cc):
    """A stand-in for the current device, with the compute capability we compile for.

    A kernel that calls a ``@cuda.jit(device=True)`` function compiles that function
    for ``get_current_device().compute_capability``, which needs a driver; the
    kernel's own ``cc`` decides the PTX in the end, so only the number matters.
    """
    return pytypes.SimpleNamespace(compute_capability=cc)


def compile_ptx(kernel, dtype, cc):
    """PTX of ``kernel`` for ``dtype`` on compute capability ``cc`` (raises numba's TypingError or NVVM's error)."""
    from numba import cuda
    from numba.cuda import dispatcher as cuda_dispatcher

    saved = cuda_dispatcher.get_current_device
    cuda_dispatcher.get_current_device = lambda: _target_device(cc)
    try:
        dispatcher = kernel.dispatcher(dtype)  # its launch bounds (tiled_jit) change the code, so pass them on
        ptx, _ = cuda.compile_ptx(dispatcher.py_func, kernel.signature(dtype), cc=cc,
                                  launch_bounds=dispatcher.targetoptions.get("launch_bounds"))
    finally:
        cuda_dispatcher.get_current_device = saved
    return ptx


_PTX_ATOMIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.", re.M)
_PTX_INT_DIVIDE = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:div|rem)\.[su](?:32|64)\b", re.M)


def ptx_counts(ptx):
    """``{atomics, divides}``: the atomic (``atom.``, ``red.``) and integer ``div``/``rem`` instructions in ``ptx``.

    Divides are counted as written in the PTX: LLVM emits each 64-bit division with a
    32-bit fast path beside it (taken when both operands fit), so one ``//`` or ``%``
    in the source that survives optimisation counts two.
    """
    return {"atomics": len(_PTX_ATOMIC.findall(ptx)), "divides": len(_PTX_INT_DIVIDE.findall(ptx))}


def ptxas_path():
    """``ptxas`` from the nvidia-cuda-nvcc wheel, else from PATH, else None."""
    try:
        import nvidia.cuda_nvcc

        candidate = pathlib.Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("ptxas")


_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"Used \d+ registers.*?(\d+) bytes smem")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def assemble(ptx, cc, ptxas):
    """``{registers, shared_bytes, stack_bytes, spill_bytes}`` from ``ptxas -v`` on ``ptx``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-O3", "-v", "-o", os.devnull, str(source)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed on sm_{cc[0]}{cc[1]}: {done.stderr.strip()}")
    used = _PTXAS_USED.search(done.stderr)
    spill = _PTXAS_SPILL.search(done.stderr)
    if not used or not spill:
        raise RuntimeError(f"ptxas -v printed no resource line: {done.stderr.strip()}")
    smem = _PTXAS_SMEM.search(done.stderr)
    return {"registers": int(used.group(1)), "shared_bytes": int(smem.group(1)) if smem else 0,
            "stack_bytes": int(spill.group(1)), "spill_bytes": int(spill.group(2)) + int(spill.group(3))}


def ptxas_version(ptxas):
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"release (\S+), V(\S+)", out)
    return found.group(2) if found else out.strip().splitlines()[-1]


# ------------------------------------------------------------------ the run
def measure(ccs=CCS, dtypes=DTYPES, progress=None, jobs=1, only=None):
    """Compile every kernel for every ``cc`` and dtype; assemble where ptxas exists.

    Returns ``{"ptxas": version or None, "kernels": [row, ...]}``; each row has
    ``kernel, version, dtype, cc``, ``error`` where the compiler refused it, else ``atomics, divides``
    (:func:`ptx_counts`) and, with ptxas, ``registers, shared_bytes,
    stack_bytes, spill_bytes, blocks_per_sm, occupancy, limited_by``.  ``jobs`` > 1 compiles in
    that many forked processes (NVVM is single-threaded); the rows come back in the same order.
    ``only``: the labels of the kernels to compile (default: every kernel of :data:`KERNELS`).
    """
    _require_compiler()
    ptxas = ptxas_path()
    nvdisasm = sass.nvdisasm_path()
    chosen = [k for k, kernel in enumerate(KERNELS) if only is None or kernel.label in only]
    tasks = [(k, numpy.dtype(dtype).name, cc, ptxas, nvdisasm) for k in chosen for dtype in dtypes for cc in ccs
             if numpy.dtype(dtype).name in KERNELS[k].dtypes]
    rows = []
    if jobs > 1:
        context = multiprocessing.get_context("fork")  # the workers inherit the compiler set up here
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            for row in pool.map(_compile_row, *zip(*tasks)):
                rows.append(row)
                if progress:
                    progress(row)
    else:
        for task in tasks:
            rows.append(_compile_row(*task))
            if progress:
                progress(rows[-1])
    return {"ptxas": ptxas_version(ptxas) if ptxas else None, "nvdisasm": nvdisasm is not None, "kernels": rows}


def _compile_row(index, dtype, cc, ptxas, nvdisasm=None):
    """One kernel of :data:`KERNELS` for one dtype and target: its row of :func:`measure`."""
    kernel = KERNELS[index]
    row = {"kernel": kernel.label, "version": kernel.version, "tiled": kernel.tiled, "dtype": dtype,
           "cc": f"sm_{cc[0]}{cc[1]}"}
    try:
        ptx = compile_ptx(kernel, numpy.dtype(dtype).type, cc)
    except Exception as error:  # noqa: BLE001 (a typing or NVVM error is the finding)
        row["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
        ptx = None
    if ptx:
        row.update(ptx_counts(ptx))
    if ptx and ptxas:
        row.update(assemble(ptx, cc, ptxas))
        blocks, fraction, limit = occupancy(row["registers"], row["shared_bytes"], kernel.threads, SMS[cc])
        row.update(threads=kernel.threads, blocks_per_sm=blocks, occupancy=fraction, limited_by=limit)
    if ptx and ptxas and nvdisasm and kernel.tiled and dtype == "float32":
        found = sass.profile(sass.disassemble(ptx, cc, ptxas, nvdisasm), per_stage=kernel.fmas_per_stage)
        row.update(sass={k: v for k, v in found.items() if k != "loops"})
    return row


def uncached_kernels():
    """Kernels of the inventory compiled anew by every process (no ``cache=True``): should be empty."""
    return sorted({k.label for k in KERNELS for d in DTYPES if numpy.dtype(d).name in k.dtypes
                   if type(getattr(k.dispatcher(d), "_cache", None)).__name__ != "CUDACache"})


def failures(result):
    """What the proof refuses: kernels missing from the inventory, an atomic instruction in any kernel
    (docs/kernels.md promises results that do not depend on the order blocks run in), more than
    ``MAX_DIVIDES`` divides or ``MAX_REGISTERS`` registers in any kernel, a tiled kernel below its
    static performance floors (``FFMA_SHARE_FLOORS``, ``MAX_INSTRUCTIONS_PER_FFMA``), and in a tiled
    kernel a spill or a stack frame (its register micro-tile pushed out to local memory); a kernel
    without the on-disk cache (every rank would compile it at every start)."""
    problems = [f"{name}: a kernel that KERNELS does not list (add it, with its signature)" for name in missing_kernels()]
    problems += [f"{name}: compiled by every rank at every start (use kernel_jit or tiled_jit: cache=True)"
                 for name in uncached_kernels()]
    for row in result["kernels"]:
        if "error" in row:
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: does not compile: {row['error']}")
        if row["tiled"] and row.get("spill_bytes"):
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: spills {row['spill_bytes']} bytes")
        if row.get("atomics"):
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: {row['atomics']} atomic instruction(s) "
                            "(the result would depend on the order the blocks run in)")
        if row.get("divides", 0) > MAX_DIVIDES:
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: {row['divides']} integer divides in its PTX, "
                            f"above {MAX_DIVIDES} (carry indices from load to load instead of splitting them)")
        if row.get("registers", 0) > MAX_REGISTERS:
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: {row['registers']} registers, above "
                            f"{MAX_REGISTERS}")
        if "sass" in row:
            share, per_fma = row["sass"]["inner_share"], row["sass"]["per_fma"]
            if share < FFMA_SHARE_FLOORS[row["kernel"]]:
                problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: FFMAs are {share:.0%} of its inner loop, "
                                f"below the floor {FFMA_SHARE_FLOORS[row['kernel']]:.0%}")
            module = row["kernel"].split(".")[0]
            if row.get("version") == 3 and share < ISSUE_FLOORS[module]:
                problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: FFMAs are {share:.0%} of its inner loop, "
                                f"below issue 34's floor for the {module} pass, {ISSUE_FLOORS[module]:.0%}")
            if per_fma > MAX_INSTRUCTIONS_PER_FFMA[row["kernel"]]:
                problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: {per_fma:.2f} instructions per FFMA in a "
                                f"stage, above {MAX_INSTRUCTIONS_PER_FFMA[row['kernel']]}")
        if row["tiled"] and row.get("stack_bytes"):
            problems.append(f"{row['kernel']} {row['dtype']} {row['cc']}: a {row['stack_bytes']}-byte stack frame "
                            "(local memory; the micro-tile should live in registers)")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refconv.kernels.resources", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    p.add_argument("--check", metavar="PAGE", help="fail if PAGE's generated tables differ from a fresh run")
    p.add_argument("--write", metavar="PAGE", help="rewrite PAGE's generated tables")
    p.add_argument("--quiet", action="store_true", help="no line per compiled kernel")
    p.add_argument("--cc", nargs="+", choices=[f"{a}{b}" for a, b in CCS], help="only these targets (e.g. 90)")
    p.add_argument("--dtype", nargs="+", choices=[numpy.dtype(d).name for d in DTYPES], help="only these dtypes")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="compile in this many processes (default: 2, or 1 on one core)")
    p.add_argument("--kernels", nargs="+", metavar="LABEL", choices=[k.label for k in KERNELS],
                   help="only these kernels (labels as module.function, e.g. conv_forward.forward_tiled)")
    args = p.parse_args(argv)
    ccs = tuple(cc for cc in CCS if not args.cc or f"{cc[0]}{cc[1]}" in args.cc)
    dtypes = tuple(d for d in DTYPES if not args.dtype or numpy.dtype(d).name in args.dtype)

    def progress(row):
        if not args.quiet:
            extra = (f": {row['error']}" if "error" in row else f": {row['registers']} registers, {row['spill_bytes']} B spilled, {row['shared_bytes']} B shared"
                     if "registers" in row else "")
            print(f"compiled {row['kernel']} {row['dtype']} {row['cc']}{extra}", flush=True)

    result = measure(ccs, dtypes, progress=progress, jobs=max(1, args.jobs), only=args.kernels)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    problems = failures(result)
    if result["ptxas"] is None:
        print("ptxas not found: compiled to PTX only (no registers, spills or occupancy); "
              "install the gpu-compile extra for them")
    if args.check or args.write:
        if problems:
            pass  # the tables need every kernel compiled
        elif (ccs, dtypes) != (CCS, DTYPES) or args.kernels:
            problems.append("--check/--write need every kernel, target and dtype (no --kernels, --cc or --dtype)")
        elif result["ptxas"] is None or not result["nvdisasm"]:
            problems.append("--check/--write need ptxas and nvdisasm (the gpu-compile extra)")
        else:
            page = pathlib.Path(args.check or args.write)
            text = page.read_text()
            fresh = replace_block(text, markdown(result))
            if args.write:
                page.write_text(fresh)
            elif fresh != text:
                problems.append(f"{page}: the generated tables differ from a fresh run; regenerate them with "
                                f"NUMBA_ENABLE_CUDASIM=0 python -m refconv.kernels.resources --write {page}")
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{len(result['kernels'])} compilations of {len(KERNELS)} kernels; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
