"""Shared pieces of the GPU benchmarks: the repository on ``sys.path``, the device, a clock that
waits for the GPU, timing of a callable's forward and forward+backward, errors kept as strings,
and JSON output that is rewritten after every configuration (a step killed by its timeout still
leaves the configurations it finished).

Importing this module puts the repository root first on ``sys.path``, so that ``learnable_sparsity``
is this checkout's (not another one installed in the environment), whatever the working directory.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from learnable_sparsity.files import atomic_write_text  # noqa: E402
from learnable_sparsity.timing import calls_for, timed  # noqa: E402

QUANTITIES = ("forward", "forward_backward")
# A sample lasts at least 10 ms (a fast function is called several times per sample): far above
# the clock's resolution and a kernel launch's latency, and long enough that one hiccup of the
# host (a preemption between launches) is a fraction of the sample.
MIN_SAMPLE_SECONDS = 0.010


def device_of(name: str) -> torch.device:
    """``cuda`` (which must be there: the GPU run must not silently measure the CPU) or ``cpu``."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch.cuda.is_available() is False")
    return torch.device(name)


def clock_for(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter``, preceded on CUDA by ``torch.cuda.synchronize``: with it as the
    clock of :func:`learnable_sparsity.timing.timed`, the work queued before the start is finished
    before the clock starts, and the timed work is finished before it stops."""
    if device.type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return clock


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measures(
    forward: Callable[[], object],
    forward_backward: Callable[[], object],
    device: torch.device,
    min_seconds: float = MIN_SAMPLE_SECONDS,
) -> dict[str, Callable[[], float]]:
    """Measurement callables (:func:`learnable_sparsity.timing.timed`, GPU-synchronising clock) of
    one forward and one forward+backward, each averaged over as many calls as make a sample last
    ``min_seconds`` (:func:`learnable_sparsity.timing.calls_for`, which also warms up)."""
    clock = clock_for(device)
    once = {"forward": forward, "forward_backward": forward_backward}
    return {
        quantity: timed(run, number=calls_for(timed(run, clock=clock), min_seconds), clock=clock)
        for quantity, run in once.items()
    }


def error_text(error: BaseException) -> str:
    """The exception as one short string for the JSON (type, message, innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    message = " ".join(str(error).split())[:600]
    return f"{type(error).__name__}: {message}{where}"


def free_memory(device: torch.device) -> None:
    """Drop cached blocks after an out-of-memory error or between configurations."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()


def peak_memory(device: torch.device, fn: Callable[[], object]) -> int | None:
    """Peak bytes allocated on ``device`` during ``fn()`` (None on the CPU)."""
    if device.type != "cuda":
        fn()
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def optional_module(name: str) -> tuple[Any, str | None]:
    """(module, None), or (None, why it could not be imported)."""
    try:
        return importlib.import_module(name), None
    except Exception as error:  # ImportError, or a broken install
        return None, error_text(error)


fused_triton, FUSED_TRITON_IMPORT_ERROR = optional_module("learnable_sparsity.core.fused_triton")


def eager() -> contextlib.AbstractContextManager[object]:
    """``fused_triton.disabled()``: CUDA tensors go to the eager PyTorch solvers (a no-op for CPU
    tensors, which run the C++ kernels either way); a null context while the module is absent
    (then "ours" is the eager path too, and the JSON says ``fused_triton_module: false``)."""
    if fused_triton is None:
        return contextlib.nullcontext()
    return fused_triton.disabled()


def ours_path(x: torch.Tensor) -> str:
    """Which code "ours" runs on ``x``: the Triton kernels, the C++ CPU kernels or the eager
    PyTorch solvers."""
    # The normalizers compute fp16/bf16 in fp32: the kernels may be asked about either tensor.
    probes = (x, x.float())
    if x.device.type == "cuda":
        on = fused_triton is not None and fused_triton.available()
        return "triton" if on and any(fused_triton.usable(p) for p in probes) else "eager"
    from learnable_sparsity.core import fused

    return "cpu-kernels" if any(fused.usable(p) for p in probes) else "eager"


def package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device) -> dict[str, object]:
    """What the timings were measured on, and which ``learnable_sparsity`` was imported."""
    import learnable_sparsity

    info: dict[str, object] = {
        "device": str(device),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "learnable_sparsity": str(Path(learnable_sparsity.__file__).parent),
        "fused_triton_module": fused_triton is not None,
        "fused_triton_import_error": FUSED_TRITON_IMPORT_ERROR,
        "fused_triton_available": bool(fused_triton is not None and fused_triton.available()),
        "triton": package_version("triton"),
        "adasplash": package_version("adasplash"),
        "entmax": package_version("entmax"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = props.total_memory
        info["compute_capability"] = f"{props.major}.{props.minor}"
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (a temporary file renamed over it)."""
    atomic_write_text(path, json.dumps(payload, indent=2, default=str))


def log(message: str) -> None:
    """A progress line with the wall-clock time (the run script's log is read live)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Logs the start and the seconds of a block."""
    start = time.perf_counter()
    log(f"{name} ...")
    yield
    log(f"{name} done in {time.perf_counter() - start:.1f} s")
