"""Shared helpers of the benchmark scripts: median wall time, machine description, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from learnable_sparsity.files import atomic_write_text


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after one warm-up."""
    fn()  # warm-up: allocator, lazy init
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def machine() -> dict[str, object]:
    """What the timings were measured on."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
    }


def write_json(path: Path, results: list[dict]) -> None:
    """Write the machine description and ``results`` to ``path`` atomically."""
    atomic_write_text(path, json.dumps({**machine(), "results": results}, indent=2))
    print(f"wrote {path}")
