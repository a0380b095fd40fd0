"""The core under ``torch.autocast(dtype=torch.bfloat16)``: ``learnable_sparsity.core.amp`` and
every autograd Function of the core (their decorators).

Tolerances come from bf16's 8-bit significand: one rounding to bf16 is off by at most
u = 2⁻⁸ relative. The mappings take bf16 scores and compute in float32, so given the same
(bf16-valued) scores their output is the float32 output rounded once (≤ u per entry) and their
gradient meets two roundings, of the incoming gradient and of the result (≤ 2u = 2⁻⁷ in norm).
Measured on the CPU (256 rows × 48, scores N(0, 4)): outputs ≤ 3.9e-3 per entry, gradients
1.9e-3–2.6e-3 in norm, α's gradient 1.9e-3.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import pytest
import torch
from torch import Tensor

from learnable_sparsity.core import fused
from learnable_sparsity.core.amp import autocast_off_backward, autocast_off_forward
from learnable_sparsity.core.fused_attention import entmax_attention
from learnable_sparsity.core.normalizers import entmax, entmax15, softmax, sparsemax, topk_softmax
from learnable_sparsity.core.sparsemap import sparsemap

BF16 = torch.bfloat16
U = 2.0**-8  # bf16's unit roundoff (8-bit significand, round to nearest)


def _probe(cast_inputs: torch.dtype | None) -> tuple[type[torch.autograd.Function], list]:
    """A Function that records whether autocast is on for its device, in forward (with its
    inputs' dtypes) and in backward."""
    seen: list[tuple[str, list[torch.dtype], bool]] = []

    class Probe(torch.autograd.Function):
        @staticmethod
        @autocast_off_forward(cast_inputs=cast_inputs)
        def forward(ctx, x: Tensor, y: Tensor) -> Tensor:
            seen.append(("forward", [x.dtype, y.dtype], torch.is_autocast_enabled(x.device.type)))
            return x * y

        @staticmethod
        @autocast_off_backward
        def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
            seen.append(("backward", [], torch.is_autocast_enabled(grad.device.type)))
            return grad, grad

    return Probe, seen


@pytest.mark.parametrize("cast_inputs", [None, torch.float32])
def test_forward_and_backward_run_in_the_state_the_decorators_define(
    device: torch.device, cast_inputs: torch.dtype | None
) -> None:
    """Forward and backward with autocast off, also when ``backward()`` is called inside the
    autocast block; the inputs cast to float32 with ``cast_inputs=float32``, as given with
    ``None``; a float64 input never cast; outside autocast the inputs as given."""
    probe, seen = _probe(cast_inputs)
    x = torch.ones(3, device=device, dtype=BF16, requires_grad=True)
    y = torch.ones(3, device=device, dtype=torch.float64, requires_grad=True)
    with torch.autocast(device.type, dtype=BF16):
        probe.apply(x, y).sum().backward()
    given = BF16 if cast_inputs is None else torch.float32
    assert seen == [("forward", [given, torch.float64], False), ("backward", [], False)]
    seen.clear()
    probe.apply(x, y).sum().backward()
    assert seen == [("forward", [BF16, torch.float64], False), ("backward", [], False)]


MAPPINGS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "softmax": lambda s, _: softmax(s),
    "sparsemax": lambda s, _: sparsemax(s),
    "entmax15": lambda s, _: entmax15(s),
    "entmax": entmax,
    "topk": lambda s, _: topk_softmax(s, 4),
}


def _run(mapping: str, scores: Tensor, alpha: Tensor, grad: Tensor, amp: bool) -> list[Tensor]:
    """(p, ∂/∂scores, ∂/∂α) of ⟨mapping(scores), grad⟩, under bf16 autocast or not."""
    scores, alpha = scores.clone().requires_grad_(), alpha.clone().requires_grad_()
    with torch.autocast(scores.device.type, dtype=BF16, enabled=amp):
        p = MAPPINGS[mapping](scores, alpha)
    (p.float() * grad).sum().backward()
    return [p, scores.grad, alpha.grad]


@pytest.mark.parametrize("kernels", ["fused", "eager"])
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_mappings_under_bf16_autocast_match_float32(
    device: torch.device, mapping: str, kernels: str
) -> None:
    """bf16 scores under autocast against the same values in float32: outputs in bf16 within
    one rounding (u per entry), finite gradients within two (2u in norm), α and its gradient
    float32 (α-entmax with one α per row in (1.05, 1.95))."""
    g = torch.Generator().manual_seed(0)
    scores = (2 * torch.randn(256, 48, generator=g)).to(BF16).to(device)
    alpha = (1.05 + 0.9 * torch.rand(256, 1, generator=g)).to(device)
    grad = torch.randn(256, 48, generator=g).to(device)
    with fused.disabled() if kernels == "eager" else nullcontext():
        p, grad_scores, grad_alpha = _run(mapping, scores, alpha, grad, amp=True)
        reference = _run(mapping, scores.float(), alpha, grad, amp=False)
    assert p.dtype == BF16 and grad_scores.dtype == BF16
    assert bool(torch.isfinite(grad_scores).all())
    torch.testing.assert_close(p.float(), reference[0], rtol=U, atol=0)
    error = (grad_scores.float() - reference[1]).norm() / reference[1].norm()
    assert error <= 2 * U, f"gradient of the scores off by {error:.2e}"
    if mapping == "entmax":
        assert grad_alpha.dtype == torch.float32
        error = (grad_alpha - reference[2]).norm() / reference[2].norm()
        assert error <= 2 * U, f"gradient of α off by {error:.2e}"


def test_sparsemap_gives_float32_under_bf16_autocast(device: torch.device) -> None:
    """SparseMAP casts its scores to float32 under autocast: p and μ are float32 — the values
    of the float32 call from the same bf16-valued scores — and t's gradient is that call's,
    rounded once to t's bf16."""
    g = torch.Generator().manual_seed(0)
    t16 = torch.randn(16, 6, generator=g).to(BF16).to(device)
    weights = torch.randn(16, 6, generator=g).to(device)
    results = []
    for amp, t in ((True, t16), (False, t16.float())):
        t = t.clone().requires_grad_()
        with torch.autocast(device.type, dtype=BF16, enabled=amp):
            d = sparsemap(t)
        ((d.projection.float() * weights).sum() + d.probs.float().square().sum()).backward()
        results.append((d.probs, d.projection, t.grad))
    (probs, mu, grad), (probs32, mu32, grad32) = results
    assert probs.dtype == mu.dtype == torch.float32
    torch.testing.assert_close(probs, probs32, rtol=0, atol=0)
    torch.testing.assert_close(mu, mu32, rtol=0, atol=0)
    assert grad.dtype == BF16
    torch.testing.assert_close(grad.float(), grad32, rtol=U, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused attention kernels need CUDA")
def test_fused_attention_under_bf16_autocast_keeps_alpha_float32() -> None:
    """Entmax attention on CUDA from bf16 projections: a bf16 output, α's gradient float32 and
    within 2⁻⁶ of the float32 call's on the same bf16-valued inputs (the kernels' tile
    matmuls round bf16 products of the 64 terms of a head)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=g).to(BF16).cuda() for _ in range(3))
    alpha = (1.1 + 0.8 * torch.rand(4, generator=g)).cuda()
    grads = []
    for amp in (True, False):
        inputs = [t if amp else t.float() for t in (q, k, v)]
        a = alpha.clone().requires_grad_()
        with torch.autocast("cuda", dtype=BF16, enabled=amp):
            out = entmax_attention(*inputs, a)
        assert out.dtype == (BF16 if amp else torch.float32)
        out.float().sum().backward()
        grads.append(a.grad)
    assert grads[0].dtype == torch.float32
    torch.testing.assert_close(grads[0], grads[1], rtol=2.0**-6, atol=2.0**-6)
