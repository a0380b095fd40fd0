"""What a kernel compiled for sm_90a (an H100) costs, read on a CPU with the tools Triton ships:
``ptxas -v`` (registers, spills) and ``nvdisasm`` (SASS instructions). Used by the
``proxy_*.py`` sections of ``benchmarks/gpu_proxies.py``."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path


def tool(name: str) -> str:
    """The path of one of the CUDA tools in Triton's NVIDIA backend (``ptxas``, ``nvdisasm``)."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def ptxas_usage(ptx: str) -> dict[str, int]:
    """Registers and spilled bytes (stores + loads) per thread of ``ptx`` assembled for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        info = subprocess.run(
            [tool("ptxas"), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    return {
        "registers": int(re.search(r"Used (\d+) registers", info).group(1)),
        "spill_bytes": sum(int(n) for n in re.findall(r"(\d+) bytes spill", info)),
    }


def sass_counts(cubin: bytes) -> dict[str, int]:
    """Instructions of the whole kernel and of its loops (backward branches) in the SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(
            [tool("nvdisasm"), "-hex", f.name], capture_output=True, text=True, check=True
        ).stdout
    address = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
    instructions: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        label = re.match(r"^\s*\.?(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instructions)
        m = address.search(line)
        if m:
            instructions.append((int(m.group(1), 16), m.group(2)))
    loops = 0
    for index, (_, text) in enumerate(instructions):
        branch = re.search(r"\bBRA\b.*?`?\(?\.?(L_x_\d+)", text)
        if branch and labels.get(branch.group(1), index + 1) <= index:
            loops += index - labels[branch.group(1)] + 1
    real = sum(1 for _, text in instructions if not text.strip().startswith("NOP"))
    return {"sass_instructions": real, "loop_sass_instructions": loops}
