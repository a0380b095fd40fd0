r"""The arithmetic of a training run: float32, TF32 or bf16 autocast (params ``*.precision``).

* ``float32``: every operation in IEEE float32 (TF32 switched off on CUDA for the step).
* ``tf32``: float32 tensors, but CUDA matmuls and convolutions on the tensor cores in TF32
  (10-bit mantissa inputs, float32 accumulation): ``torch.backends.cuda.matmul.allow_tf32`` and
  ``torch.backends.cudnn.allow_tf32`` are set for the step and restored after it. CUDA only.
* ``bf16``: ``torch.autocast(device_type, dtype=torch.bfloat16)`` around the forward pass and
  the loss: matmuls (and, on CUDA, the ops of autocast's lower-precision list) take bf16 inputs,
  the parameters, their gradients and the optimizer stay float32, the loss is float32. No
  ``GradScaler``: bf16 has float32's 8-bit exponent (normal numbers down to 1.2e-38), so the
  small gradients that underflow float16's 5-bit exponent (below 6e-5, subnormals to 6e-8) and
  that loss scaling exists to rescue are representable; what bf16 loses is mantissa (8 bits:
  relative rounding error 2⁻⁸ = 0.4%), which no scale factor recovers.

The core's autograd Functions define what they do under autocast
(:mod:`learnable_sparsity.core.amp`): α, row sums and gradient accumulations stay float32.
Validation and evaluation run in float32 whatever the setting, so the numbers a run reports
depend on its precision only through what it learned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Literal, get_args

import torch

from learnable_sparsity.settings import SettingsError

Precision = Literal["float32", "tf32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
# TF32 tensor cores arrived with Ampere (compute capability 8.0); earlier GPUs ignore the flags.
TF32_MIN_CAPABILITY = (8, 0)


def unsupported(precision: str, device: torch.device | str) -> str | None:
    """Why ``precision`` cannot run on ``device`` (a sentence), or None where it can."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        return f"is not one of {list(PRECISIONS)}"
    if precision == "tf32":
        if device.type != "cuda":
            return (
                f"needs a CUDA device (TF32 is a mode of its tensor cores), but the run is on "
                f"{device.type}: on this device 'float32' is the same arithmetic"
            )
        if torch.cuda.get_device_capability(device) < TF32_MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            return f"needs TF32 tensor cores (compute capability >= 8.0), which {name} lacks"
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name(device)
            return f"needs bf16 arithmetic, which {name} lacks (compute capability < 8.0)"
        if not torch.amp.is_autocast_available(device.type):
            return f"needs torch.autocast, which torch does not offer on {device.type}"
    return None


def check_precision(precision: str, device: torch.device | str, key: str = "precision") -> None:
    """Raise :class:`SettingsError` naming ``key`` unless ``precision`` runs on ``device``."""
    reason = unsupported(precision, device)
    if reason is not None:
        raise SettingsError(key, f"is {precision!r}, which {reason}")


@contextmanager
def matmul_precision(precision: Precision, device: torch.device) -> Iterator[None]:
    """On CUDA, TF32 matmuls and convolutions inside the block under ``tf32`` and IEEE float32
    ones otherwise, the process's flags restored afterwards; nothing on other devices."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager:
    """``torch.autocast`` to bf16 on ``device`` under ``bf16`` (wrap the forward pass and the
    loss, not the backward pass or the optimizer step); a block without effect otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
