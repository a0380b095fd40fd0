"""The fused CPU kernels of the sparse normalizers (``fused_cpu.cpp``), built on first use.

``normalizers`` calls these for CPU tensors of float32/float64 whenever the kernels are
available, and its eager solvers otherwise (CUDA, no C++ compiler, or switched off). The kernels
compute the same mappings with the same solvers (see ``fused_cpu.cpp``); the tests hold them to
the eager path, to the ``entmax`` package and to brute force.

Build: ``$CXX`` (default ``g++``) compiles the source once per source text, flags and CPU into
``$LEARNABLE_SPARSITY_KERNEL_CACHE`` (default ``~/.cache/learnable-sparsity/kernels``), under a
file lock so that parallel workers build it once, and links it against torch's own libgomp so
that the kernels' threads are torch's (``torch.get_num_threads()``). It takes about 2 s. If it
fails, a warning says why and the eager solvers are used. ``LEARNABLE_SPARSITY_FUSED=0`` switches
the kernels off for a process; :func:`disabled` does so for a block (tests, benchmarks).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import Tensor

from learnable_sparsity.core.switch import Switch

SOURCE = Path(__file__).with_name("fused_cpu.cpp")
# -fassociative-math lets sums be reduced in a tree (the range reductions of exp and log keep
# their order with a barrier); no -ffast-math: the kernels rely on IEEE infinities and NaN for
# masks and NaN rows.
FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
)
# The instruction set: the machine's own (the library is built on the machine that runs it, the
# CPU is in its cache key), unless torch's kernels are pinned (ATEN_CPU_CAPABILITY=default, the
# portable mode of make repro): then the x86-64 baseline, whose 128-bit vectors give the tree
# reductions one order on every x86 machine (tests/test_portable_kernels.py).
NATIVE, PORTABLE = "-march=native", "-march=x86-64"


def instruction_set() -> str:
    """The ``-march`` the kernels are compiled with (see :data:`PORTABLE`)."""
    pinned = os.environ.get("ATEN_CPU_CAPABILITY") == "default"
    return PORTABLE if pinned and platform.machine() in ("x86_64", "AMD64") else NATIVE


_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
_enabled = Switch(os.environ.get("LEARNABLE_SPARSITY_FUSED", "1") != "0")


def _flags() -> tuple[str, ...]:
    return (*FLAGS, instruction_set())


def _cpu_signature() -> str:
    """The CPU model and flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = ("model name", "flags")
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(wanted)))


def _library_path(compiler: str) -> Path:
    cache = os.environ.get("LEARNABLE_SPARSITY_KERNEL_CACHE")
    root = Path(cache) if cache else Path.home() / ".cache/learnable-sparsity/kernels"
    key = "\n".join([SOURCE.read_text(), compiler, *_flags(), _cpu_signature(), torch.__version__])
    return root / f"fused_cpu-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _build(compiler: str, target: Path, defines: tuple[str, ...] = ()) -> None:
    """Compile ``SOURCE`` into ``target`` unless another process already has (atomic rename).

    ``defines`` (``NAME=VALUE``) are for the tests (``LS_EXACT_MAX_ITER``).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    torch_lib = Path(torch.__file__).parent / "lib"
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        command = [compiler, *_flags(), *(f"-D{d}" for d in defines), str(SOURCE)]
        command += ["-o", str(partial), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        partial.replace(target)


def _load(path: Path) -> dict[tuple[str, torch.dtype], ctypes._CFuncPtr]:
    """The built library's kernels by (name, dtype), their argument types declared."""
    library = ctypes.CDLL(str(path))
    pointer, size, threads = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {
        "sparsemax_forward": [pointer] * 2,
        "entmax15_forward": [pointer] * 2,
        "entmax_forward": [pointer] * 3,
        "sparsemax_backward": [pointer] * 3,
        "entmax15_backward": [pointer] * 3,
        "entmax_backward": [pointer] * 5,
        "topk_softmax_forward": [pointer] * 2 + [size],
        "softmax_backward": [pointer] * 3,
    }
    kernels = {}
    for name, arguments in signatures.items():
        for dtype, suffix in _DTYPES.items():
            function = getattr(library, f"{name}_{suffix}")
            function.argtypes = [*arguments, size, size, threads]
            function.restype = None
            kernels[name, dtype] = function
    return kernels


@functools.cache
def _library() -> dict[tuple[str, torch.dtype], ctypes._CFuncPtr] | None:
    compiler = os.environ.get("CXX", "g++")
    try:
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler {compiler!r} on PATH (set CXX)")
        path = _library_path(compiler)
        _build(compiler, path)
        library = _load(path)
    except (OSError, RuntimeError) as error:
        warnings.warn(
            f"the fused CPU normalizers are unavailable, using the eager solvers: {error}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return library


def available() -> bool:
    """Whether the kernels are switched on and built (builds them on the first call)."""
    return bool(_enabled) and _library() is not None


def usable(x: Tensor) -> bool:
    """Whether ``x`` goes to the fused kernels: a CPU float32/float64 tensor, kernels available."""
    return x.device.type == "cpu" and x.dtype in _DTYPES and available()


def disabled() -> AbstractContextManager[None]:
    """Use the eager solvers inside the block (for comparisons; not thread-safe)."""
    return _enabled.turned(False)


def _call(name: str, inputs: list[Tensor], outputs: list[Tensor | None], *extra: int) -> None:
    """Run kernel ``name`` on the rows (last dim) of the contiguous ``inputs``; a None output is
    a null pointer (a result the kernel then skips)."""
    d = inputs[0].shape[-1]
    rows = inputs[0].numel() // max(d, 1)
    if rows == 0 or d == 0:
        return
    function = _library()[name, inputs[0].dtype]
    pointers = [t.data_ptr() for t in inputs]
    pointers += [None if t is None else t.data_ptr() for t in outputs]
    function(*pointers, *extra, rows, d, torch.get_num_threads())


def _per_row(alpha: Tensor, x: Tensor) -> Tensor:
    """One α per row of x (α broadcastable to x[..., :1]), contiguous, x's dtype."""
    return alpha.to(x.dtype).expand(*x.shape[:-1], 1).contiguous()


def sparsemax(x: Tensor) -> Tensor:
    """sparsemax over the last dim."""
    x = x.contiguous()
    p = torch.empty_like(x)
    _call("sparsemax_forward", [x], [p])
    return p


def entmax15(x: Tensor) -> Tensor:
    """1.5-entmax over the last dim."""
    x = x.contiguous()
    p = torch.empty_like(x)
    _call("entmax15_forward", [x], [p])
    return p


def entmax(x: Tensor, alpha: Tensor) -> Tensor:
    """α-entmax over the last dim, α per row (broadcastable to ``x[..., :1]``)."""
    x = x.contiguous()
    p = torch.empty_like(x)
    _call("entmax_forward", [x, _per_row(alpha, x)], [p])
    return p


def topk_softmax(x: Tensor, k: int) -> Tensor:
    """Softmax over the entries ≥ the k-th largest of each row (last dim), zeros elsewhere."""
    x = x.contiguous()
    p = torch.empty_like(x)
    _call("topk_softmax_forward", [x], [p], k)
    return p


def sparsemax_backward(p: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x of sparsemax from its output p and ∂L/∂p."""
    grad_x = torch.empty_like(p)
    _call("sparsemax_backward", [p, grad.to(p.dtype).contiguous()], [grad_x])
    return grad_x


def entmax15_backward(p: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x of 1.5-entmax from its output p and ∂L/∂p."""
    grad_x = torch.empty_like(p)
    _call("entmax15_backward", [p, grad.to(p.dtype).contiguous()], [grad_x])
    return grad_x


def entmax_backward(
    p: Tensor, alpha: Tensor, grad: Tensor, alpha_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """∂L/∂x of α-entmax and, with ``alpha_grad``, Σ_i g_i ∂p_i/∂α per row ([..., 1])."""
    grad_x = torch.empty_like(p)
    per_row = torch.empty_like(p[..., :1]) if alpha_grad else None
    inputs = [p, _per_row(alpha, p), grad.to(p.dtype).contiguous()]
    _call("entmax_backward", inputs, [grad_x, per_row])
    return grad_x, per_row


def softmax_backward(p: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x of (top-k) softmax from its output p and ∂L/∂p: p ⊙ (g − ⟨p, g⟩)."""
    grad_x = torch.empty_like(p)
    _call("softmax_backward", [p, grad.to(p.dtype).contiguous()], [grad_x])
    return grad_x
