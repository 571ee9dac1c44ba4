"""The static performance table: what the tiled kernels' machine code (SASS) spends per multiply-add.

No GPU is needed to read the code a GPU would run: ptxas (the ``nvidia-cuda-nvcc-cu12`` wheel)
assembles the PTX of ``refconv.kernels.resources`` into a cubin for sm_80 or sm_90, and ``nvdisasm``
(the ``nvidia-cuda-nvdisasm`` wheel, both in the ``gpu-compile`` extra) prints its instructions.
From them, per tiled kernel:

- the **inner loop**: the innermost loop that holds the FFMAs (fused multiply-adds, float32) or
  DFMAs (float64), and the share of its instructions that are those;
- **instructions per FMA in a stage**: one pass of the stage loop (the loop around the inner loop,
  with the shared-memory loads of the next stage and the barriers), with the inner loop counted
  as often as a stage runs it, over the multiply-adds a thread does in that pass (``TILE_K * MICRO**2``
  per stage in version 2; version 3's loop holds two stages of ``tiles_v3.TILE_K * tiles_v3.MICRO**2``).

A loop is a backward branch: ``BRA`` to a label at a lower address.  These counts are of the code
as written, not of the time it takes (no latencies, no occupancy): a floor checked in CI
(tests/cuda_kernels/test_kernel_compile.py), and the evidence until a device run measures the speed.
"""

import pathlib
import re
import shutil
import subprocess
import tempfile

from .tiles_v2 import MICRO, TILE_K

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", re.M)
_LABEL = re.compile(r"^(\.L_x_\d+):", re.M)
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def nvdisasm_path():
    """``nvdisasm`` from the nvidia-cuda-nvdisasm wheel (beside the nvidia packages), else from PATH, else None."""
    try:
        import nvidia

        for root in nvidia.__path__:
            for candidate in sorted(pathlib.Path(root).glob("cu*/bin/nvdisasm")):
                return str(candidate)
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def disassemble(ptx, cc, ptxas, nvdisasm):
    """The SASS text of ``ptx`` assembled for ``cc`` (``nvdisasm -c``: the code only)."""
    with tempfile.TemporaryDirectory() as tmp:
        source, cubin = pathlib.Path(tmp) / "kernel.ptx", pathlib.Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-O3", "-o", str(cubin), str(source)], check=True,
                       capture_output=True)
        done = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()}")
    return done.stdout


def instructions(sass):
    """``[(address, opcode, operands)]`` and ``{label: address of the next instruction}``."""
    found = [(int(a, 16), op, rest) for a, op, rest in _INSTRUCTION.findall(sass)]
    labels = {}
    for match in _LABEL.finditer(sass):
        following = _INSTRUCTION.search(sass, match.end())
        labels[match.group(1)] = int(following.group(1), 16) if following else None
    return found, labels


def loops(found, labels):
    """``[(start, end)]`` address ranges of the loops: each backward branch, from its target to itself."""
    spans = []
    for address, op, rest in found:
        target = _BRANCH_TARGET.search(rest)
        if op.startswith("BRA") and target and labels.get(target.group(1)) is not None \
                and labels[target.group(1)] <= address:
            spans.append((labels[target.group(1)], address))
    return sorted(set(spans))


def profile(sass, fma="FFMA", per_stage=TILE_K * MICRO * MICRO):
    """The static figures of one tiled kernel: ``{inner_loop, inner_fma, inner_share, inner_trips_per_stage,
    stage_instructions, stages_per_pass, per_fma, loops}`` (``loops``: every loop's ``(instructions, fma
    share)``).  ``per_stage``: the multiply-adds one thread does per stage.  A stage loop may hold more than
    one stage (version 3 writes out two, one per shared buffer): ``stage_instructions`` and ``per_fma`` are
    then of one pass of it, ``stages_per_pass`` stages."""
    found, labels = instructions(sass)
    spans = loops(found, labels)

    def body(span):
        return [(a, op) for a, op, _ in found if span[0] <= a <= span[1]]

    def fmas(span):
        return sum(op.startswith(fma) for _, op in body(span))

    with_fma = [s for s in spans if fmas(s)]
    if not with_fma:
        raise ValueError(f"no loop holds a {fma}: is this a tiled kernel?")
    inner = min(with_fma, key=lambda s: s[1] - s[0])  # the innermost loop with multiply-adds
    outer = [s for s in spans if s[0] <= inner[0] and inner[1] <= s[1] and s != inner]
    stage = min(outer, key=lambda s: s[1] - s[0]) if outer and not _has_barrier(body(inner)) else inner
    trips = per_stage // fmas(inner) if stage != inner else 1
    stage_count = len(body(stage)) + (len(body(inner)) * (trips - 1) if stage != inner else 0)
    pass_fmas = fmas(stage) + (fmas(inner) * (trips - 1) if stage != inner else 0)
    return {"inner_loop": len(body(inner)), "inner_fma": fmas(inner), "inner_share": fmas(inner) / len(body(inner)),
            "inner_trips_per_stage": trips, "stage_instructions": stage_count,
            "stages_per_pass": pass_fmas / per_stage, "per_fma": stage_count / pass_fmas,
            "loops": [(len(body(s)), fmas(s) / len(body(s))) for s in spans]}


def _has_barrier(body):
    return any(op.startswith("BAR") for _, op in body)
