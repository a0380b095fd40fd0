r"""The core's autograd Functions under ``torch.autocast``: they never run under it.

Under autocast a Function's ``forward`` would see the autocast state of its caller and its
``backward`` (run later by the autograd engine, after the autocast block) none. Neither suits a
solver: autocast narrows the ops of its lower-precision lists to bf16 — ``torch.linalg.vecdot``,
a row sum of 1.5-entmax's Newton step, is one on the CPU, and computing it in bf16 moved the
support of 5.5% of the entries of a 256 × 48 test. So :func:`autocast_off_forward` and
:func:`autocast_off_backward` run both with autocast off for the device of the call, and each
Function states what its inputs are there:

* ``cast_inputs=torch.float32`` (``torch.amp.custom_fwd``'s cast): floating inputs, float64 ones
  excepted, become float32, so the outputs are float32 (SparseMAP);
* ``cast_inputs=None``: the inputs as given (the normalizers' and the fused attention's kernels
  load bf16 and compute in float32; α is float32 whatever the scores' dtype), the outputs in the
  dtype the Function gives them.

``torch.amp.custom_fwd`` takes one ``device_type``, but a core Function runs on CPU tensors (the
C++ kernels) and CUDA tensors (Triton) alike: the device is that of the first argument (a tensor
in every core Function). Outside autocast both decorators are plain calls (torch's cost a few
microseconds of host time each, and the normalizers are called per attention block).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Method = Callable[..., Any]


def autocast_off_forward(*, cast_inputs: torch.dtype | None) -> Callable[[Method], Method]:
    """Decorate a Function's ``forward``: with autocast on for the device of its first argument,
    run it with autocast off, its floating inputs cast to ``cast_inputs`` first (float64 ones
    excepted; None: no cast). Pair it with :func:`autocast_off_backward`."""

    def decorate(forward: Method) -> Method:
        @functools.cache
        def casting(device_type: str) -> Method:
            return torch.amp.custom_fwd(forward, device_type=device_type, cast_inputs=cast_inputs)

        @functools.wraps(forward)
        def run(ctx: Any, first: Tensor, *args: Any) -> Any:
            device_type = ctx.autocast_device_type = first.device.type
            if not torch.is_autocast_enabled(device_type):
                return forward(ctx, first, *args)
            if cast_inputs is not None:  # torch's custom_fwd: cast, then autocast off
                return casting(device_type)(ctx, first, *args)
            with torch.autocast(device_type, enabled=False):
                return forward(ctx, first, *args)

        return run

    return decorate


def autocast_off_backward(backward: Method) -> Method:
    """Decorate a Function's ``backward``: run it with autocast off for the device its
    :func:`autocast_off_forward` ``forward`` ran on (``torch.amp.custom_bwd`` after a forward
    that ran with autocast off), also when ``backward()`` is called inside an autocast block."""

    @functools.wraps(backward)
    def run(ctx: Any, *grads: Any) -> Any:
        device_type = ctx.autocast_device_type
        if not torch.is_autocast_enabled(device_type):
            return backward(ctx, *grads)
        with torch.autocast(device_type, enabled=False):
            return backward(ctx, *grads)

    return run
