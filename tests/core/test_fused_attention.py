"""Fused α-entmax attention (``learnable_sparsity.core.fused_attention``) against the materialised
path.

The oracle is the same function computed from the stored scores by ``normalizers.entmax`` (itself
held to the ``entmax`` package and finite differences in ``test_normalizers``). With a GPU the
fused kernels run compiled; without one, in Triton's interpreter on the CPU (the root conftest
sets ``TRITON_INTERPRET=1``). Tolerances: float32 rounding near the support's edge, where
p^{2−α} has an unbounded slope, moves gradients by ~1e-5 of their scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import torch

from learnable_sparsity.core import fused, fused_attention, fused_triton
from learnable_sparsity.core.fused_attention import entmax_attention

pytest.importorskip("triton", reason="Triton is not installed (a test-only dependency on CPU)")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
BFLOAT16_TOLERANCE = 2e-2


@pytest.fixture(scope="module", autouse=True)
def kernels() -> Iterator[None]:
    with ExitStack() as stack:
        assert fused_triton.available(), "Triton is installed but the kernels did not load"
        if not CUDA:
            stack.enter_context(fused_triton.on_cpu())
            stack.enter_context(fused.disabled())
        yield


def _inputs(b: int, h: int, length: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (2 * torch.randn(b, h, length, d, generator=g) for _ in range(3))
    return [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]


def _run(inputs, alpha, grad, **options) -> list[torch.Tensor]:
    """The output and the gradients of ⟨output, grad⟩ in q, k, v and α."""
    alpha = alpha.detach().clone().requires_grad_()
    copies = [t.detach().clone().requires_grad_() for t in inputs]
    out = entmax_attention(*copies, alpha, **options)
    return [out.detach(), *torch.autograd.grad((out * grad).sum(), [*copies, alpha])]


def _assert_close_to_reference(inputs, alpha, grad, tolerance: float, **options) -> None:
    """Ours within ``tolerance`` × scale of the materialised path computed in float32 from the
    same inputs (a bfloat16 reference is no oracle: its rounded scores move dQ by half its
    scale)."""
    assert fused_attention.usable(inputs[0])
    ours = _run(inputs, alpha, grad, **options)
    with fused_attention.disabled():
        reference = _run([t.float() for t in inputs], alpha, grad.float(), **options)
    for name, got, expected in zip(["out", "dq", "dk", "dv", "dalpha"], ours, reference,
                                   strict=True):  # fmt: skip
        scale = expected.abs().max().item()
        error = (got.float() - expected.float()).abs().max().item()
        assert error <= tolerance * max(scale, 1.0), f"{name}: {error:.2e} (scale {scale:.2e})"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [None, [40, 23]], ids=["full", "key_lengths"])
def test_float32_matches_the_materialised_scores(causal: bool, lengths) -> None:
    inputs = _inputs(2, 2, 40, 16, torch.float32, seed=0)
    alpha = torch.tensor([1.3, 1.8], device=DEVICE)  # both α-gradient forms (β < and > 0.5)
    grad = torch.randn(2, 2, 40, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    key_lengths = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    _assert_close_to_reference(inputs, alpha, grad, 1e-4, causal=causal, key_lengths=key_lengths)


@pytest.mark.parametrize("causal", [False, True])
def test_keys_past_the_length_get_no_weight_in_dense_rows(causal: bool) -> None:
    """Small scores: every visible key is in the support, and so would be a padding key (its
    zero-loaded score sits among them) if a tile straddling the key length or the diagonal went
    unmasked; the key lengths end inside a tile (16 keys per tile in the interpreter)."""
    inputs = [(0.05 * t).detach().requires_grad_() for t in _inputs(2, 1, 40, 16, torch.float32, 6)]
    alpha = torch.tensor([1.5], device=DEVICE)
    grad = torch.randn(2, 1, 40, 16, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    key_lengths = torch.tensor([37, 23], device=DEVICE)
    _assert_close_to_reference(inputs, alpha, grad, 1e-4, causal=causal, key_lengths=key_lengths)


def test_queries_and_keys_of_different_lengths_and_alpha_per_batch_and_head() -> None:
    g = torch.Generator().manual_seed(2)
    q = (2 * torch.randn(2, 2, 20, 32, generator=g)).to(DEVICE).requires_grad_()
    k, v = ((2 * torch.randn(2, 2, 37, 32, generator=g)).to(DEVICE) for _ in range(2))
    alpha = torch.tensor([[1.05, 2.0], [1.5, 1.2]], device=DEVICE)
    grad = torch.randn(2, 2, 20, 32, generator=g).to(DEVICE)
    _assert_close_to_reference([q, k, v], alpha, grad, 1e-4)


def test_a_batch_with_no_visible_key_gives_zeros() -> None:
    inputs = _inputs(2, 1, 24, 16, torch.float32, seed=3)
    alpha = torch.tensor([1.5], device=DEVICE)
    out = entmax_attention(*inputs, alpha, key_lengths=torch.tensor([0, 24], device=DEVICE))
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    out.sum().backward()
    assert bool(torch.isfinite(inputs[0].grad).all())
    assert torch.equal(inputs[0].grad[0], torch.zeros_like(inputs[0].grad[0]))


@pytest.mark.skipif(not CUDA, reason="Triton's interpreter (3.6, 3.7) mishandles bfloat16 tensors")
@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_on_the_gpu(causal: bool) -> None:
    """bf16 in and out, products accumulated in float32; P and dS are rounded to bf16 before
    their products (0.4% each), far below what a bf16 reference's rounded scores cost.

    Interpreted, the same call is off by 8e8 (float32 by 2e-5): the interpreter, not the kernel.
    """
    length = 300  # five 64-key tiles
    inputs = _inputs(2, 4, length, 64, torch.bfloat16, seed=4)
    alpha = torch.linspace(1.1, 1.9, 4, device=DEVICE)
    grad = torch.randn(2, 4, length, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    _assert_close_to_reference(inputs, alpha, grad.bfloat16(), BFLOAT16_TOLERANCE, causal=causal)


def test_other_inputs_go_to_the_materialised_scores() -> None:
    q = torch.zeros(1, 1, 4, 24, device=DEVICE)
    assert not fused_attention.usable(q), "a head size tl.dot cannot take"
    with fused_attention.disabled():
        assert not fused_attention.usable(torch.zeros(1, 1, 4, 16, device=DEVICE))
    with pytest.raises(ValueError, match="causal attention needs L_q = L_k"):
        entmax_attention(q, q[:, :, :3], q[:, :, :3], torch.ones(1) * 1.5, causal=True)
    for lengths in (torch.tensor([2, 3]), torch.tensor([-1]), torch.tensor([2.0])):
        with pytest.raises(ValueError, match=r"key_lengths must be \[1\] non-negative integers"):
            entmax_attention(q, q, q, torch.ones(1) * 1.5, key_lengths=lengths.to(DEVICE))
