"""The tables of the compile proof (``refconv.kernels.resources``, which checks the kernels against them):
the ceilings and floors every kernel keeps, the SM limits that decide occupancy, the roofline of the
convolutions on the six ResNet-50 shapes, and the tables it writes into docs/kernels.md.
"""

import dataclasses
import math

from refconv.reference.shapes import SHAPES as RESNET50_SHAPES

from . import tiles_v3
from .tiles_v2 import MICRO, TILE_K, TILE_M, TILE_N

# The ceilings every kernel keeps (issue 34): integer divides in its PTX (a 64-bit divide is a long
# sequence; the 3-D loaders that divided per load had 58 to 68) and registers (128 leave room for 2 blocks of 256).
MAX_DIVIDES = 16
MAX_REGISTERS = 128
# The floors of the static performance table (kernels/sass.py), float32, sm_80 and sm_90: the share of
# FFMAs in each tiled kernel's inner loop, and the most instructions issued per FFMA in a pass of its stage
# loop.  They are what the kernels reach now, so a change that makes the machine code worse fails the proof.
# Version 3, the fast kernels, reaches 78-80% on both targets, above issue 34's floors (75% forward, 60%
# every kernel); version 2 stays as the teaching step before it, held to what it reaches (22-28%).
FFMA_SHARE_FLOORS = {"conv_forward.forward_tiled": 0.25, "conv_backward_data.backward_data_tiled": 0.22,
                     "conv_backward_filter.backward_filter_tiled": 0.20,
                     "conv_forward.forward_register_tiled": 0.78, "conv_backward_data.backward_data_register_tiled": 0.78,
                     "conv_backward_filter.backward_filter_register_tiled": 0.78}
MAX_INSTRUCTIONS_PER_FFMA = {"conv_forward.forward_tiled": 4.0, "conv_backward_data.backward_data_tiled": 4.5,
                             "conv_backward_filter.backward_filter_tiled": 5.0,
                             "conv_forward.forward_register_tiled": 1.28,
                             "conv_backward_data.backward_data_register_tiled": 1.28,
                             "conv_backward_filter.backward_filter_register_tiled": 1.28}
# Issue 34's floors, which each pass's fast kernel (version 3) must meet: the forward's inner loop and every pass's.
ISSUE_FLOORS = {"conv_forward": 0.75, "conv_backward_data": 0.60, "conv_backward_filter": 0.60}


# ------------------------------------------------------------------ occupancy
@dataclasses.dataclass(frozen=True)
class SM:
    """Per-SM limits that decide occupancy (CUDA C Programming Guide, compute capabilities table)."""

    name: str
    registers: int = 65536
    register_unit: int = 256      # registers are given to a warp in units of this many
    max_warps: int = 64
    max_blocks: int = 32
    shared_bytes: int = 228 * 1024
    shared_per_block_reserved: int = 1024
    shared_unit: int = 128


SMS = {(8, 0): SM("A100 (sm_80)", shared_bytes=164 * 1024), (9, 0): SM("H200 (sm_90)")}


def occupancy(registers, shared_bytes, threads, sm):
    """``(resident blocks per SM, fraction of the SM's warps they fill, the limiting resource)``."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(registers * 32 / sm.register_unit) * sm.register_unit
    shared = math.ceil((shared_bytes + sm.shared_per_block_reserved) / sm.shared_unit) * sm.shared_unit
    limits = {
        "registers": (sm.registers // per_warp) // warps if per_warp else sm.max_blocks,
        "shared memory": sm.shared_bytes // shared,
        "warps": sm.max_warps // warps,
        "blocks": sm.max_blocks,
    }
    blocks = min(limits.values())
    return blocks, blocks * warps / sm.max_warps, min(limits, key=limits.get)


# ------------------------------------------------------------------ roofline
H200_FP32_FLOPS = 67e12   # FP32, no tensor cores (H200 SXM datasheet)
H200_BYTES_PER_S = 4.8e12  # HBM3e


def six_shapes():
    """The six ResNet-50 shapes of ``refconv bench`` (``refconv.reference.shapes.SHAPES``): name -> (C, F, H, K, stride, padding)."""
    return RESNET50_SHAPES


def gemm_dims(pass_, N, C, F, H, K, stride, padding, dims=2):
    """The implicit GEMM ``(M, N_gemm, depth)`` that the tiled kernel of ``pass_`` runs, on square images
    (``dims=2``) or cubic volumes (``dims=3``) of side ``H`` and kernels of side ``K``."""
    Ho = (H + 2 * padding - K) // stride + 1
    return {"forward": (N * Ho ** dims, F, C * K ** dims),
            "backward-data": (N * H ** dims, C, F * K ** dims),
            "backward-filter": (F, C * K ** dims, N * Ho ** dims)}[pass_]


def intensity(version, M, Ng, depth, itemsize=4):
    """FLOP per byte of DRAM traffic as the loads are written, with no reuse through caches.

    Version 1 (direct) loads one input and one weight per multiply-add.  Version 2
    (tiled) loads a ``TILE_M x depth`` and a ``depth x TILE_N`` panel per output
    tile, and writes each output once; version 3 the same with ``tiles_v3.BLOCK x tiles_v3.BLOCK`` tiles (its padded
    copy of the B operand is not counted).
    """
    flops = 2.0 * M * Ng * depth
    if version == 1:
        return flops / (2 * itemsize * M * Ng * depth + itemsize * M * Ng)
    tile_m, tile_n = (tiles_v3.BLOCK, tiles_v3.BLOCK) if version == 3 else (TILE_M, TILE_N)
    tiles = math.ceil(M / tile_m) * math.ceil(Ng / tile_n)
    return flops / (itemsize * (tiles * depth * (tile_m + tile_n) + M * Ng))


def roofline(batch=32):
    """Per (shape, pass, version): intensity, the bound and the best fraction of FP32 peak on H200."""
    ridge = H200_FP32_FLOPS / H200_BYTES_PER_S
    rows = []
    for name, (C, F, H, K, stride, padding) in six_shapes().items():
        for pass_ in ("forward", "backward-data", "backward-filter"):
            M, Ng, depth = gemm_dims(pass_, batch, C, F, H, K, stride, padding)
            for version in (1, 2, 3):
                ai = intensity(version, M, Ng, depth)
                rows.append({"shape": name, "pass": pass_, "version": version, "flop_per_byte": ai,
                             "bound": "compute" if ai >= ridge else "memory",
                             "peak_fraction": min(1.0, ai / ridge)})
    return rows


# ------------------------------------------------------------------ the docs' tables
BEGIN, END = "<!-- kernel-resources:begin -->", "<!-- kernel-resources:end -->"


def markdown(result):
    """The tables of docs/kernels.md (between the BEGIN and END markers)."""
    lines = [BEGIN, "",
             f"Generated by `python -m refconv.kernels.resources --write docs/kernels.md` (ptxas {result['ptxas']}, "
             "`-O3`); CI regenerates it and fails if it differs. Occupancy is on an H200 SM (sm_90), "
             "float32 and float64; a tiled kernel that spills or has a stack frame fails the proof, and so does "
             "an atomic instruction in any kernel. Divides: integer `div`/`rem` instructions in the PTX (each "
             "64-bit one comes with a 32-bit fast path, so one surviving `//` or `%` counts two).", "",
             "| kernel | version | dtype | registers | stack (B) | spills (B) | shared (B) | divides | blocks/SM | occupancy | limited by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["kernels"]:
        if row["cc"] != "sm_90":
            continue
        lines.append(f"| `{row['kernel']}` | {row['version'] or '-'} | {row['dtype']} | {row['registers']} | "
                     f"{row['stack_bytes']} | {row['spill_bytes']} | {row['shared_bytes']} | {row['divides']} | {row['blocks_per_sm']} | "
                     f"{row['occupancy']:.0%} | {row['limited_by']} |")
    lines += ["", "The static performance table (`kernels/sass.py`): the tiled kernels' SASS for float32, from ptxas "
              "and nvdisasm. Inner loop: the innermost loop holding the FFMAs (the `kk` loop is written out, so it "
              "is the stage loop, with the loaders); per FFMA: instructions issued in one pass of the stage loop "
              f"over the FFMAs a thread does in it ({TILE_K * MICRO * MICRO} in version 2's one stage, "
              f"{2 * tiles_v3.TILE_K * tiles_v3.MICRO ** 2} in version 3's two). CI fails below the floors "
              "(FFMA share) or above the ceilings (instructions per FFMA) of `refconv.kernels.resources`, and if a "
              "pass's version 3 kernel "
              "is below issue 34's floors (75% forward, 60% every pass).", "",
              "| kernel | version | target | inner loop (instructions) | FFMA share | instructions per FFMA | "
              "divides | registers | occupancy |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["kernels"]:
        if "sass" in row:
            s = row["sass"]
            lines.append(f"| `{row['kernel']}` | {row['version']} | {row['cc']} | {s['inner_loop']} | "
                         f"{s['inner_share']:.1%} | {s['per_fma']:.2f} | {row['divides']} | {row['registers']} | "
                         f"{row['occupancy']:.0%} |")
    lines += ["", "Roofline on H200 figures (67 TFLOP/s FP32 without tensor cores, 4.8 TB/s HBM3e; ridge "
              f"{H200_FP32_FLOPS / H200_BYTES_PER_S:.1f} FLOP/B), float32, batch 32. Intensity counts the loads "
              "as each kernel writes them, with no reuse through L1/L2 (a lower bound); the best fraction of peak "
              "is min(1, intensity / ridge).", "",
              "| shape | pass | v1 FLOP/B | v1 bound, best % of peak | v2 FLOP/B | v2 bound, best % of peak | "
              "v3 FLOP/B | v3 bound, best % of peak |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    by_key = {(r["shape"], r["pass"], r["version"]): r for r in roofline()}
    for name in six_shapes():
        for pass_ in ("forward", "backward-data", "backward-filter"):
            v1, v2, v3 = (by_key[name, pass_, v] for v in (1, 2, 3))
            lines.append(f"| {name} | {pass_} | {v1['flop_per_byte']:.2f} | {v1['bound']}, "
                         f"{v1['peak_fraction']:.1%} | {v2['flop_per_byte']:.1f} | {v2['bound']}, "
                         f"{v2['peak_fraction']:.0%} | {v3['flop_per_byte']:.1f} | {v3['bound']}, "
                         f"{v3['peak_fraction']:.0%} |")
    lines += ["", END]
    return "\n".join(lines)


def replace_block(text, block):
    """``text`` with the part from BEGIN to END replaced by ``block``."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]
