"""Shared helpers of the benchmark scripts: median wall time, JSON output with the machine."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from learnable_sparsity.files import atomic_write_text
from learnable_sparsity.timing import machine


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after one warm-up."""
    fn()  # warm-up: allocator, lazy init
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def write_json(path: Path, results: list[dict]) -> None:
    """Write the machine description and ``results`` to ``path`` atomically."""
    atomic_write_text(path, json.dumps({**machine(), "results": results}, indent=2))
    print(f"wrote {path}")
