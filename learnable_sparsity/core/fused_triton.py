"""The Triton kernels of the sparse normalizers (``triton_kernels``), for CUDA tensors.

``normalizers`` calls these for CUDA tensors of float64, float32, float16 or bfloat16 (the
kernels load and store half precision and compute in float32: no cast kernels) with rows of at
most ``MAX_D`` entries, whenever Triton is importable; the eager solvers otherwise. Nothing here
waits for the device: α is not checked on the host (an invalid α gives NaN rows, see
``triton_kernels.forward``). Same functions and signatures as the C++ kernels of ``fused``; the
tests hold both to the eager path, to the ``entmax`` package and to brute force.

``LEARNABLE_SPARSITY_TRITON=0`` switches the kernels off for a process; :func:`disabled` does so
for a block (tests, benchmarks). Without a GPU, Triton's interpreter runs the same kernels on CPU
tensors: set ``TRITON_INTERPRET=1`` before the first call and route CPU tensors here inside
:func:`on_cpu` (the tests do; it is far too slow for anything else).
"""

from __future__ import annotations

import functools
import math
import os
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType

import torch
from torch import Tensor

from learnable_sparsity.core.switch import Switch

# A row lives in registers: 32K fp32 entries is 64 per thread at 16 warps; longer rows go to the
# eager solvers.
MAX_D = 32768
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# ``triton_kernels``' KIND values.
_SPARSEMAX, _ENTMAX15, _ENTMAX = 0, 1, 2
_enabled = Switch(os.environ.get("LEARNABLE_SPARSITY_TRITON", "1") != "0")
_on_cpu = Switch(False)  # CPU tensors too, to Triton's interpreter (on_cpu)


@functools.cache
def _kernels() -> ModuleType | None:
    """``triton_kernels``, or None where Triton is not installed (CPU-only torch builds)."""
    try:
        from learnable_sparsity.core import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def available() -> bool:
    """Whether the kernels are switched on and Triton is importable."""
    return bool(_enabled) and _kernels() is not None


def usable(x: Tensor) -> bool:
    """Whether ``x`` goes to these kernels: a CUDA (or, in :func:`on_cpu`, CPU) floating tensor
    with 1 to ``MAX_D`` entries per row, kernels available."""
    device = x.is_cuda or (bool(_on_cpu) and x.device.type == "cpu")
    return device and x.dtype in _DTYPES and 0 < x.shape[-1] <= MAX_D and available()


def disabled() -> AbstractContextManager[None]:
    """Use the eager solvers inside the block (for comparisons; not thread-safe)."""
    return _enabled.turned(False)


def on_cpu() -> AbstractContextManager[None]:
    """Send CPU tensors to the kernels inside the block, run by Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("on_cpu() needs TRITON_INTERPRET=1 set before the kernels are loaded")
    return _on_cpu.turned(True)


def _launch_options(d: int) -> dict[str, int]:
    block = 1 << max(d - 1, 0).bit_length()
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8 if block <= 8192 else 16}


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The kernels' compute dtype (and α's) for ``dtype``; not ``torch.promote_types``, which is
    a dispatched op: host time on every call."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _solver_constants(dtype: torch.dtype) -> dict[str, float]:
    """The compute dtype's epsilon, iteration cap (twice its mantissa bits) and ½ log(tiny)."""
    info = torch.finfo(_at_least_float32(dtype))
    return {
        "EPS": info.eps,
        "MAX_ITER": 2 * round(-math.log2(info.eps)),
        "HALF_LOG_TINY": 0.5 * math.log(info.tiny),
    }


def _forward(x: Tensor, kind: int, alpha: Tensor | None = None) -> Tensor:
    x = x.contiguous()
    p = torch.empty_like(x)
    d = x.shape[-1]
    rows = x.numel() // d
    if rows == 0:
        return p
    alpha_rows = x if alpha is None else _per_row(alpha, x)
    # α-entmax of rows narrower than float64: a second launch for the rows solved in float64.
    wide = (False, True) if kind == _ENTMAX and x.dtype != torch.float64 else (False,)
    constants = {**_solver_constants(x.dtype), **_launch_options(d)}
    with torch.cuda.device(x.device) if x.is_cuda else nullcontext():
        for launch in wide:
            _kernels().forward[(rows,)](
                x, alpha_rows, p, d, d.bit_length(), KIND=kind, WIDE=launch, **constants
            )
    return p


def _backward(
    p: Tensor, grad: Tensor, kind: int, alpha: Tensor | None = None, alpha_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    grad = grad.to(p.dtype).contiguous()
    grad_x = torch.empty_like(p)
    per_row = None
    if alpha_grad:
        per_row = p.new_empty(p[..., :1].shape, dtype=_at_least_float32(p.dtype))
    d = p.shape[-1]
    rows = p.numel() // d
    if rows == 0:
        return grad_x, per_row
    alpha_rows = p if alpha is None else _per_row(alpha, p)
    with torch.cuda.device(p.device) if p.is_cuda else nullcontext():
        _kernels().backward[(rows,)](
            p, alpha_rows, grad, grad_x, grad_x if per_row is None else per_row, d,
            KIND=kind, ALPHA_GRAD=alpha_grad, **_launch_options(d),
        )  # fmt: skip
    return grad_x, per_row


def _per_row(alpha: Tensor, x: Tensor) -> Tensor:
    """One α per row of x (α broadcastable to x[..., :1]), contiguous, in float32 or x's wider
    dtype: bf16 holds α = 1.01 as 1.0078, which puts β = α − 1 off by 22% (issue 37)."""
    return alpha.to(_at_least_float32(x.dtype)).expand(*x.shape[:-1], 1).contiguous()


def sparsemax(x: Tensor) -> Tensor:
    """sparsemax over the last dim."""
    return _forward(x, _SPARSEMAX)


def entmax15(x: Tensor) -> Tensor:
    """1.5-entmax over the last dim."""
    return _forward(x, _ENTMAX15)


def entmax(x: Tensor, alpha: Tensor) -> Tensor:
    """α-entmax over the last dim, α per row (broadcastable to ``x[..., :1]``)."""
    return _forward(x, _ENTMAX, alpha)


def sparsemax_backward(p: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x of sparsemax from its output p and ∂L/∂p."""
    return _backward(p, grad, _SPARSEMAX)[0]


def entmax15_backward(p: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x of 1.5-entmax from its output p and ∂L/∂p."""
    return _backward(p, grad, _ENTMAX15)[0]


def entmax_backward(
    p: Tensor, alpha: Tensor, grad: Tensor, alpha_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """∂L/∂x of α-entmax and, with ``alpha_grad``, Σ_i g_i ∂p_i/∂α per row ([..., 1])."""
    return _backward(p, grad, _ENTMAX, alpha, alpha_grad)
