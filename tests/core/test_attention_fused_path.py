"""``MultiHeadAttention`` on the fused α-entmax attention (``implementation``) against its
materialised scores: the same module weights, forward and backward (the α-gradient included).

Without a GPU the fused kernels run in Triton's interpreter on the CPU, as in
``test_fused_attention`` (the root conftest sets ``TRITON_INTERPRET=1``); with one, compiled.
Tolerance: that test's, ~1e-5 of the scale from float32 rounding at the support's edge.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import torch

from learnable_sparsity.core import fused, fused_attention, fused_triton
from learnable_sparsity.core.attention import KVCache, MultiHeadAttention

pytest.importorskip("triton", reason="Triton is not installed (a test-only dependency on CPU)")

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TOLERANCE = 1e-4
D_MODEL, HEADS = 32, 2  # head size 16: one the kernels take


@pytest.fixture(scope="module", autouse=True)
def kernels() -> Iterator[None]:
    with ExitStack() as stack:
        assert fused_triton.available(), "Triton is installed but the kernels did not load"
        if not CUDA:
            stack.enter_context(fused_triton.on_cpu())
            stack.enter_context(fused.disabled())
        yield


def _pair(seed: int = 0, **options) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """The same α-entmax block twice: fused and materialized (different α per head)."""
    torch.manual_seed(seed)
    block = MultiHeadAttention(D_MODEL, HEADS, "entmax_alpha", alpha_init=1.5, **options)
    with torch.no_grad():
        block.alpha_logit.copy_(torch.tensor([-1.5, 1.0]))  # α ≈ 1.18 and 1.72
    block = block.to(DEVICE).eval()
    fused_block = copy.deepcopy(block)
    fused_block.implementation = "fused"
    block.implementation = "materialized"
    return fused_block, block


def _outputs_and_grads(block: MultiHeadAttention, x, memory, grad, **kwargs) -> dict:
    block.zero_grad()
    x = x.detach().clone().requires_grad_()
    out = block(x, memory, **kwargs).output
    (out * grad).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in block.named_parameters()}
    return {"output": out.detach(), "x": x.grad.detach(), **grads}


def _assert_close(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        scale = expected[name].abs().max().item()
        error = (got[name] - expected[name]).abs().max().item()
        assert error <= TOLERANCE * max(scale, 1.0), f"{name}: {error:.2e} (scale {scale:.2e})"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_self_attention_fused_matches_materialized(causal: bool, padded: bool) -> None:
    fused_block, block = _pair()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 21, D_MODEL, generator=g).to(DEVICE)
    grad = torch.randn(2, 21, D_MODEL, generator=g).to(DEVICE)
    mask = None
    if padded:  # right padding: the second sentence has 13 real keys
        mask = (torch.arange(21)[None, :] < torch.tensor([21, 13])[:, None]).to(DEVICE)
    kwargs = {"causal": causal, "key_padding_mask": mask}
    assert fused_block.fused_unavailable(torch.zeros(2, HEADS, 21, 16, device=DEVICE), mask) is None
    got = _outputs_and_grads(fused_block, x, None, grad, **kwargs)
    expected = _outputs_and_grads(block, x, None, grad, **kwargs)
    _assert_close(got, expected)
    assert got["alpha_logit"].abs().max() > 0, "α gets a gradient"


def test_cross_attention_fused_matches_materialized() -> None:
    fused_block, block = _pair(seed=2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, D_MODEL, generator=g).to(DEVICE)
    memory = torch.randn(2, 26, D_MODEL, generator=g).to(DEVICE)
    grad = torch.randn(2, 9, D_MODEL, generator=g).to(DEVICE)
    mask = (torch.arange(26)[None, :] < torch.tensor([17, 26])[:, None]).to(DEVICE)
    got = _outputs_and_grads(fused_block, x, memory, grad, key_padding_mask=mask)
    expected = _outputs_and_grads(block, x, memory, grad, key_padding_mask=mask)
    _assert_close(got, expected)


def test_auto_runs_the_kernel_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    apply = fused_attention._FusedEntmaxAttention.apply

    def counted(*args):
        calls.append(args[0].shape)
        return apply(*args)

    monkeypatch.setattr(fused_attention._FusedEntmaxAttention, "apply", counted)
    fused_block, block = _pair()
    block.implementation = "auto"
    x = torch.randn(2, 5, D_MODEL, device=DEVICE)
    expected = fused_block(x, causal=True).output
    assert len(calls) == 1
    assert torch.equal(block(x, causal=True).output, expected)
    assert len(calls) == 2
    # where it does not apply, auto computes from the scores and fused refuses, saying why
    first = block(x[:, :3], causal=True, use_cache=True)
    assert len(calls) == 3, "the first step of a cache has no cached keys: fused"
    block(x[:, 3:4], causal=True, cache=first.cache)
    probs = block(x, return_probs=True).probs
    assert len(calls) == 3 and probs is not None
    with pytest.raises(ValueError, match="KV-cache step"):
        fused_block(x[:, 3:4], causal=True, cache=first.cache)
    with pytest.raises(ValueError, match="return_probs=True"):
        fused_block(x, return_probs=True)


def test_what_keeps_a_call_off_the_kernel() -> None:
    fused_block, _ = _pair(dropout=0.1)
    q = torch.zeros(2, HEADS, 5, 16, device=DEVICE)
    left_padded = torch.tensor([[True] * 5, [False, True, True, True, True]], device=DEVICE)
    assert "right padding" in fused_block.fused_unavailable(q, left_padded)
    cache = KVCache(q, q)
    assert "KV-cache" in fused_block.fused_unavailable(q, cache=cache)
    assert fused_block.fused_unavailable(q) is None  # eval mode: no dropout
    assert "dropout" in fused_block.train().fused_unavailable(q)
    assert "head sizes" in fused_block.eval().fused_unavailable(q[..., :8])
    softmax = MultiHeadAttention(D_MODEL, HEADS, "softmax", implementation="fused")
    assert "no fused kernel" in softmax.fused_unavailable(q)
    with pytest.raises(ValueError, match="implementation must be one of"):
        MultiHeadAttention(D_MODEL, HEADS, implementation="flash")
    with fused_attention.disabled():
        assert "does not take" in fused_block.fused_unavailable(q)
    x = torch.randn(2, 5, D_MODEL, device=DEVICE)
    fused_block.implementation = "fused"
    for wrong in (torch.ones(2, 6, dtype=torch.bool), torch.ones(2, 5)):
        with pytest.raises(ValueError, match=r"key_padding_mask must be a boolean tensor"):
            fused_block(x, key_padding_mask=wrong.to(DEVICE))
