"""CPU proxies of the fused attention kernels' GPU cost (issue 37), for ``gpu_proxies.py``.

Run as ``python benchmarks/gpu/proxy_attention.py [--quick]`` with ``PYTHONPATH`` naming the root
of the ``learnable_sparsity`` to measure (the working tree's or a baseline's export; the kernels
are found by name and their arguments read from the kernels themselves, so an older tree is
measured the same way). Prints one JSON object:

* ``compiled``: per kernel of ``triton_attention``, causal and not, compiled by ``triton.compile``
  for sm_90a on the CPU with the tree's GPU launch (``fused_attention.launch``; a tree without it
  launched 64 × 64 tiles on 4 warps) at head dimension 64: bf16 Q/K/V (keys ``<kernel>/causal=…``)
  and float32 ones (``fp32/<kernel>/causal=…``): registers and spilled bytes per thread
  (``ptxas -v``), SASS instructions of the whole kernel and of its loops (``nvdisasm``), and the
  tile matmuls (``wgmma``/``mma`` instructions in the PTX). ``launch``: (BM, BN, warps) per dtype.
  ``backward_kernels``: how many kernels the backward launches.
* ``causal_schedule``: the forward's causal and non-causal makespans in a model of the launch:
  query tiles of 64 rows at L = 16,384 (and 4,096), 2 batch·heads (the benchmark's shapes), each
  program's work the key tiles it visits (causal: tile m visits m + 1; the tile skipping of the
  sparse rows is left out), programs handed in launch order to the first free slot of 132 SMs ×
  the programs one SM holds at the kernel's registers (65,536 per SM). The launch order is the
  tree's: the grid's first axis varies fastest, and a tree whose kernels pick their tile with
  ``_program`` runs causal query tiles last-first. ``ratio``: causal ÷ non-causal makespan (the
  work alone would give 0.50).
* ``masked_tiles``: the share of the causal key tiles the forward visits (in each of its passes)
  at L = 16,384 whose scores go through the mask (a compare and a select per score): every tile
  where the tree's kernels mask unconditionally, the diagonal tiles only where they skip the mask
  off the diagonal (``_unmasked_keys``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compiled, not interpreted

import torch
from sm90 import ptxas_usage, sass_counts

from learnable_sparsity.core import fused_attention, triton_attention

SMS = 132  # an H100 SXM
REGISTERS_PER_SM = 65536
D = 64
# The launch of a tree before ``fused_attention.launch``: 64 × 64 tiles, 4 warps, any dtype.
OLD_LAUNCH = (64, 64, 4)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TENSORS = {"q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr"}
KERNELS = ("forward", "backward_rows", "backward_dq", "backward_dkdv")


def _launch(dtype: str) -> tuple[int, int, int]:
    """(BM, BN, warps) of the tree's GPU launch for ``dtype`` Q/K/V at head size ``D``."""
    if not hasattr(fused_attention, "launch"):
        return OLD_LAUNCH
    options = fused_attention.launch(DTYPES[dtype], D)
    return options["BM"], options["BN"], options["num_warps"]


def _signature(kernel, causal: bool, dtype: str) -> tuple[dict[str, str], dict[str, object]]:
    bm, bn, _ = _launch(dtype)
    constants: dict[str, object] = {
        "D": D, "BM": bm, "BN": bn, "CAUSAL": causal, "HAS_LENGTHS": True,
        "PRECISION": "ieee" if dtype == "fp32" else "tf32", "ALPHA_GRAD": True,
    }  # fmt: skip
    constants = {k: v for k, v in constants.items() if k in kernel.arg_names}
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in TENSORS:
            signature[name] = f"*{dtype}"
        elif name == "lengths_ptr":
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
        elif name == "scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature, constants


def _compile(kernel, causal: bool, dtype: str) -> dict[str, object]:
    import triton
    from triton.backends.compiler import GPUTarget

    signature, constants = _signature(kernel, causal, dtype)
    compiled = triton.compile(
        triton.compiler.ASTSource(kernel, signature, constants),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": _launch(dtype)[2]},
    )
    ptx = compiled.asm["ptx"]
    return {
        **ptxas_usage(ptx),
        "tile_matmuls": len(re.findall(r"^\s*(?:wgmma\.mma_async|mma)\.", ptx, re.MULTILINE)),
        **sass_counts(compiled.asm["cubin"]),
    }


def _makespan(work: list[int], slots: int) -> int:
    """Greedy list scheduling: each program, in launch order, on the first slot to free up."""
    free = [0] * slots
    for units in work:
        heapq.heappush(free, heapq.heappop(free) + units)
    return max(free)


def causal_schedule(registers: int, lengths: tuple[int, ...], heads: int) -> dict[str, object]:
    bm, bn, warps = _launch("bf16")
    per_sm = max(1, REGISTERS_PER_SM // (registers * 32 * warps))
    last_first = hasattr(triton_attention, "_program")
    out: dict[str, object] = {"programs_per_sm": per_sm, "causal_tiles_last_first": last_first}
    for length in lengths:
        tiles = math.ceil(length / bm)
        key_tiles = math.ceil(length / bn)
        # grid (tiles, batch·head): every tile of one head, then the next head's
        tile_order = list(reversed(range(tiles))) if last_first else list(range(tiles))
        order = [m for _ in range(heads) for m in tile_order]
        causal = _makespan([min(key_tiles, m + 1) for m in order], SMS * per_sm)
        full = _makespan([key_tiles] * len(order), SMS * per_sm)
        out[f"L={length}"] = {
            "causal_makespan": causal,
            "non_causal_makespan": full,
            "ratio": round(causal / full, 3),
        }
    return out


def masked_tiles(length: int) -> dict[str, object]:
    tiles = math.ceil(length / _launch("bf16")[0])
    visited = sum(m + 1 for m in range(tiles))
    masked = tiles if hasattr(triton_attention, "_unmasked_keys") else visited
    return {"L": length, "visited": visited, "masked": masked, "share": round(masked / visited, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="the forward kernel, causal only (both dtypes)"
    )
    args = parser.parse_args()
    names = [name for name in KERNELS if hasattr(triton_attention, name)]
    compiled = {}
    for dtype in DTYPES:
        prefix = "" if dtype == "bf16" else f"{dtype}/"
        for name in names[:1] if args.quick else names:
            for causal in (True,) if args.quick else (False, True):
                kernel = getattr(triton_attention, name)
                compiled[f"{prefix}{name}/causal={causal}"] = _compile(kernel, causal, dtype)
    result = {
        "compiled": compiled,
        "launch": {dtype: list(_launch(dtype)) for dtype in DTYPES},
        "backward_kernels": sum(name.startswith("backward") for name in names),
        "causal_schedule": causal_schedule(
            compiled["forward/causal=True"]["registers"], (4096, 16384), heads=2
        ),
        "masked_tiles": masked_tiles(16384),
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
