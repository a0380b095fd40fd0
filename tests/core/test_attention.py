"""Tests for ``learnable_sparsity.core.attention.MultiHeadAttention``.

Shapes: batch B = 3, model width D = 16, H = 4 heads. For "entmax_alpha" the heads get different
α (1.1, 1.4, 1.6, 1.9) so that per-head broadcasting is exercised; "topk" uses k = 3.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from learnable_sparsity.core.attention import (
    ALPHA_MAX,
    ALPHA_MIN,
    NORMALIZERS,
    KVCache,
    MultiHeadAttention,
    alpha_of_logit,
    logit_of_alpha,
    random_alpha_logit,
)

B, D, H = 3, 16, 4
HEAD_ALPHAS = (1.1, 1.4, 1.6, 1.9)
SPARSE = ("sparsemax", "entmax15", "entmax_alpha")
TOL = 1e-5


def _make(normalizer: str, seed: int = 0, *, device: torch.device, **kwargs) -> MultiHeadAttention:
    """The module initialised on the CPU from ``seed`` and then moved: the same on every device."""
    torch.manual_seed(seed)
    kwargs.setdefault("k", 3)
    module = MultiHeadAttention(D, H, normalizer, **kwargs)
    if module.alpha_logit is not None and "alpha_init" not in kwargs:
        with torch.no_grad():
            module.alpha_logit.copy_(logit_of_alpha(torch.tensor(HEAD_ALPHAS)))
    return module.to(device).eval()


def _randn(
    shape: tuple[int, ...], seed: int, scale: float = 1.0, *, device: torch.device
) -> torch.Tensor:
    """Drawn on the CPU and then moved, so that every device sees the same numbers."""
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g)).to(device)


def _lengths_mask(
    lengths: list[int], total: int, left: bool = False, *, device: torch.device
) -> torch.Tensor:
    """[len(lengths), total] boolean mask, True on the real tokens (right- or left-aligned)."""
    positions = torch.arange(total, device=device)
    lengths_t = torch.tensor(lengths, device=device)[:, None]
    return positions >= total - lengths_t if left else positions < lengths_t


def _visible(key_padding_mask: torch.Tensor, causal: bool, q_len: int) -> torch.Tensor:
    """Expected visibility [B, 1, q, k] of each key from each query."""
    k_len = key_padding_mask.shape[1]
    visible = key_padding_mask[:, None, None, :].expand(-1, 1, q_len, k_len)
    if causal:
        ones = torch.ones(q_len, k_len, dtype=torch.bool, device=key_padding_mask.device)
        visible = visible & ones.tril(k_len - q_len)
    return visible


# --------------------------------------------------------------------------- reference behaviour


def test_softmax_matches_scaled_dot_product_attention(device: torch.device) -> None:
    module = _make("softmax", device=device)
    x = _randn((B, 6, D), seed=1, device=device)
    key_padding_mask = _lengths_mask([6, 4, 2], 6, device=device)
    visible = _visible(key_padding_mask, causal=True, q_len=6)
    result = module(x, key_padding_mask=key_padding_mask, causal=True, return_probs=True)

    def heads(proj: torch.nn.Linear) -> torch.Tensor:
        return proj(x).view(B, 6, H, D // H).transpose(1, 2)

    ref = F.scaled_dot_product_attention(
        heads(module.q_proj), heads(module.k_proj), heads(module.v_proj), attn_mask=visible
    )
    ref = module.out_proj(ref.transpose(1, 2).reshape(B, 6, D))
    assert torch.allclose(result.output, ref, atol=TOL)
    scores = heads(module.q_proj) @ heads(module.k_proj).transpose(-2, -1) / (D // H) ** 0.5
    ref_probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    assert torch.allclose(result.probs, ref_probs, atol=TOL)


def test_entmax_alpha_at_one_point_five_matches_entmax15(device: torch.device) -> None:
    x = _randn((B, 5, D), seed=2, scale=3, device=device)
    learned = _make("entmax_alpha", alpha_init=1.5, device=device)(
        x, causal=True, return_probs=True
    )
    fixed = _make("entmax15", device=device)(x, causal=True, return_probs=True)
    assert torch.allclose(learned.probs, fixed.probs, atol=TOL)
    assert torch.allclose(learned.output, fixed.output, atol=TOL)


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_causal_mask_blocks_information_from_the_future(
    normalizer: str, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    T, t = 7, 3
    x = _randn((B, T, D), seed=3, scale=2, device=device)
    perturbed = x.clone()
    perturbed[:, t + 1 :] += _randn((B, T - t - 1, D), seed=4, scale=5, device=device)
    out = module(x, causal=True).output
    out_perturbed = module(perturbed, causal=True).output
    assert torch.equal(out[:, : t + 1], out_perturbed[:, : t + 1])
    assert not torch.allclose(out[:, t + 1 :], out_perturbed[:, t + 1 :])

    x = x.clone().requires_grad_(True)
    module(x, causal=True).output[:, t].square().sum().backward()
    assert torch.all(x.grad[:, t + 1 :] == 0)
    assert torch.all(x.grad[:, t].abs().sum(dim=-1) > 0)  # (sparse: earlier keys may get 0)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_masked_keys_get_exactly_zero_probability(
    normalizer: str, cross: bool, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    x = _randn((B, 6, D), seed=5, scale=3, device=device)
    memory = _randn((B, 8, D), seed=6, scale=3, device=device) if cross else None
    lengths, total = ([8, 5, 2], 8) if cross else ([6, 4, 3], 6)
    key_padding_mask = _lengths_mask(lengths, total, device=device)
    probs = module(
        x, memory, key_padding_mask=key_padding_mask, causal=not cross, return_probs=True
    ).probs
    visible = _visible(key_padding_mask, causal=not cross, q_len=6).expand_as(probs)
    assert probs.shape == (B, H, 6, key_padding_mask.shape[1])
    assert torch.all(probs[~visible] == 0)
    assert torch.allclose(probs.sum(dim=-1), torch.ones((), device=device), atol=TOL)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_rows_without_visible_keys_are_zero(normalizer: str, device: torch.device) -> None:
    module = _make(normalizer, device=device)
    x = _randn((B, 5, D), seed=7, scale=2, device=device)
    # Left padding: the first queries of short sequences see no real key under the causal mask.
    key_padding_mask = _lengths_mask([5, 3, 1], 5, left=True, device=device)
    result = module(x, key_padding_mask=key_padding_mask, causal=True, return_probs=True)
    has_key = _visible(key_padding_mask, causal=True, q_len=5).any(dim=-1)  # [B, 1, q]
    row_sums = result.probs.sum(dim=-1)
    assert torch.allclose(
        row_sums[has_key.expand_as(row_sums)], torch.ones((), device=device), atol=TOL
    )
    assert torch.all(row_sums[~has_key.expand_as(row_sums)] == 0)
    assert torch.isfinite(result.output).all()
    # Queries 0 and 1 of sequence 1 see nothing: every head outputs 0, so out = out_proj bias.
    assert torch.allclose(result.output[1, :2], module.out_proj.bias.expand(2, D))


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_sparse_normalizers_give_exact_zeros(normalizer: str, device: torch.device) -> None:
    module = _make(normalizer, device=device)
    x = _randn((B, 12, D), seed=8, scale=3, device=device)
    probs = module(x, return_probs=True).probs
    zero_fraction = (probs == 0).float().mean().item()
    if normalizer == "softmax":
        assert zero_fraction == 0
    elif normalizer == "topk":
        assert zero_fraction == pytest.approx(1 - 3 / 12)
    else:
        assert 0 < zero_fraction < 1


@pytest.mark.parametrize("k", [1, 2, 5])
def test_topk_keeps_k_keys_per_row(k: int, device: torch.device) -> None:
    module = _make("topk", k=k, device=device)
    x = _randn((B, 8, D), seed=9, scale=2, device=device)
    key_padding_mask = _lengths_mask([8, 6, 3], 8, device=device)
    probs = module(x, key_padding_mask=key_padding_mask, causal=True, return_probs=True).probs
    n_visible = _visible(key_padding_mask, causal=True, q_len=8).sum(dim=-1)  # [B, 1, q]
    # Random scores have no ties, so exactly min(k, visible keys) keys survive.
    assert torch.equal((probs > 0).sum(dim=-1), n_visible.clamp(max=k).expand(-1, H, -1))


def test_key_padding_mask_is_validated(device: torch.device) -> None:
    module = _make("softmax", device=device)
    x = _randn((B, 4, D), seed=10, device=device)
    with pytest.raises(ValueError, match=r"key_padding_mask .*\[3, 4\]"):
        module(x, key_padding_mask=torch.ones(B, 5, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="boolean"):
        module(x, key_padding_mask=torch.ones(B, 4, device=device))


# --------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_incremental_self_attention_matches_full_decoding(
    normalizer: str, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    T, prefix = 7, 3
    x = _randn((B, T, D), seed=11, scale=2, device=device)
    key_padding_mask = _lengths_mask([7, 6, 4], T, left=True, device=device)
    full = module(x, key_padding_mask=key_padding_mask, causal=True, return_probs=True)

    # A prefix of several queries at once, then one query per step.
    cache = None
    for start, stop in [(0, prefix), *((t, t + 1) for t in range(prefix, T))]:
        step = module(
            x[:, start:stop],
            key_padding_mask=key_padding_mask[:, :stop],
            causal=True,
            cache=cache,
            use_cache=True,
            return_probs=True,
        )
        cache = step.cache
        assert cache.key.shape == (B, H, stop, D // H) and not cache.static
        assert torch.allclose(step.output, full.output[:, start:stop], atol=TOL)
        assert torch.allclose(step.probs, full.probs[:, :, start:stop, :stop], atol=TOL)
    assert torch.all(full.probs.triu(diagonal=1) == 0)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_incremental_cross_attention_matches_full_and_projects_memory_once(
    normalizer: str, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    T, S = 5, 6
    y = _randn((B, T, D), seed=12, scale=2, device=device)
    memory = _randn((B, S, D), seed=13, scale=2, device=device)
    memory_mask = _lengths_mask([6, 4, 2], S, device=device)
    full = module(y, memory, key_padding_mask=memory_mask, return_probs=True)

    calls = []
    for proj in (module.k_proj, module.v_proj):
        proj.register_forward_hook(lambda *_: calls.append(1))
    cache = None
    for t in range(T):
        step = module(
            y[:, t : t + 1],
            memory if cache is None else None,
            key_padding_mask=memory_mask,
            cache=cache,
            use_cache=True,
            return_probs=True,
        )
        cache = step.cache
        assert cache.static and cache.key.shape == (B, H, S, D // H)
        assert torch.allclose(step.output, full.output[:, t : t + 1], atol=TOL)
        assert torch.allclose(step.probs, full.probs[:, :, t : t + 1], atol=TOL)
    assert len(calls) == 2  # k_proj and v_proj once each


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_self_attention_cache_reorder_matches_reordered_inputs(
    normalizer: str, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    T, t = 6, 3
    x = _randn((B, T, D), seed=14, scale=2, device=device)
    beams = torch.tensor([2, 2, 0], device=device)
    cache = module(x[:, :t], causal=True, use_cache=True).cache.reorder(beams)
    step = module(x[beams, t:], causal=True, cache=cache, return_probs=True)
    ref = module(x[beams], causal=True, return_probs=True)
    assert torch.allclose(step.output, ref.output[:, t:], atol=TOL)
    assert torch.allclose(step.probs, ref.probs[:, :, t:], atol=TOL)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_cross_attention_cache_reorder_matches_reordered_inputs(
    normalizer: str, device: torch.device
) -> None:
    module = _make(normalizer, device=device)
    y = _randn((B, 4, D), seed=15, scale=2, device=device)
    memory = _randn((B, 5, D), seed=16, scale=2, device=device)
    memory_mask = _lengths_mask([5, 3, 4], 5, device=device)
    beams = torch.tensor([1, 0, 1], device=device)
    cache = module(y[:, :1], memory, key_padding_mask=memory_mask, use_cache=True).cache
    step = module(y[beams, 1:], key_padding_mask=memory_mask[beams], cache=cache.reorder(beams))
    ref = module(y[beams], memory[beams], key_padding_mask=memory_mask[beams])
    assert torch.allclose(step.output, ref.output[:, 1:], atol=TOL)


def test_cache_misuse_is_rejected(device: torch.device) -> None:
    module = _make("softmax", device=device)
    x = _randn((B, 2, D), seed=17, device=device)
    memory = _randn((B, 3, D), seed=18, device=device)
    self_cache = module(x, causal=True, use_cache=True).cache
    with pytest.raises(ValueError, match="self-attention cache"):
        module(x, memory, cache=self_cache)
    with pytest.raises(ValueError, match="causal"):
        module(x, memory, causal=True)
    static = KVCache(self_cache.key, self_cache.value, static=True)
    with pytest.raises(ValueError, match="causal"):
        module(x, cache=static, causal=True)
    # A batch-1 cache or memory would otherwise broadcast silently over the beams.
    with pytest.raises(ValueError, match="cache has batch size 1 but x has 3"):
        module(x, causal=True, cache=self_cache.reorder(torch.tensor([0], device=device)))
    with pytest.raises(ValueError, match="memory has batch size 1 but x has 3"):
        module(x, memory[:1])


# --------------------------------------------------------------------------- learned α


def test_alpha_is_exposed_per_head(device: torch.device) -> None:
    module = MultiHeadAttention(D, H, "entmax_alpha", alpha_init=1.3).to(device)
    assert module.alpha.shape == (H,) and not module.alpha.requires_grad
    assert torch.allclose(module.alpha, torch.full((H,), 1.3, device=device))
    assert [name for name, _ in module.named_parameters()].count("alpha_logit") == 1
    for normalizer in ("softmax", "sparsemax", "entmax15", "topk"):
        other = MultiHeadAttention(D, H, normalizer)
        assert other.alpha is None
        assert "alpha_logit" not in dict(other.named_parameters())


def test_alpha_receives_finite_nonzero_gradients(device: torch.device) -> None:
    module = _make("entmax_alpha", device=device)
    x = _randn((B, 6, D), seed=19, scale=2, device=device)
    target = _randn((B, 6, D), seed=20, device=device)
    (module(x, causal=True).output * target).sum().backward()
    grad = module.alpha_logit.grad
    assert torch.isfinite(grad).all() and torch.all(grad != 0)


def test_alpha_near_its_lower_bound_still_moves(device: torch.device) -> None:
    """No dead zone: a clamp of 1 + sigmoid(w) at 1.01 had zero gradient for w < logit(0.01)."""
    module = _make("entmax_alpha", device=device)
    with torch.no_grad():
        module.alpha_logit.fill_(-6.0)  # α ≈ 1.0125
    x = _randn((B, 6, D), seed=19, scale=2, device=device)
    (module(x, causal=True).output * _randn((B, 6, D), seed=20, device=device)).sum().backward()
    assert torch.all(module.alpha_logit.grad != 0)


def test_alpha_logit_round_trips(device: torch.device) -> None:
    alpha = torch.tensor([1.0101, 1.2, 1.5, 1.999], dtype=torch.float64, device=device)
    assert torch.allclose(alpha_of_logit(logit_of_alpha(alpha)), alpha, rtol=0, atol=1e-12)


# CPU only: the seeded draw is that of a CPU generator.
def test_random_alpha_init_is_asts_truncated_draw() -> None:
    """α = 1 + sigmoid(a), a ~ N(0, 1) truncated to ±3: α ∈ [1.047, 1.953], seeded, spread."""
    like = torch.empty(4000)
    alpha = alpha_of_logit(random_alpha_logit(like, torch.Generator().manual_seed(0)))
    again = alpha_of_logit(random_alpha_logit(like, torch.Generator().manual_seed(0)))
    assert torch.equal(alpha, again)
    bound = 1 / (1 + math.exp(-3))
    assert float(alpha.min()) >= 2 - bound - 1e-6 and float(alpha.max()) <= 1 + bound + 1e-6
    # 1 + sigmoid(a) with a symmetric about 0: mean 1.5; std of sigmoid(N(0, 1)) ≈ 0.21.
    assert abs(float(alpha.mean()) - 1.5) < 0.02
    assert 0.18 < float(alpha.std()) < 0.23


def test_alpha_gradient_matches_finite_differences(device: torch.device) -> None:
    module = _make("entmax_alpha", device=device).double()
    x = _randn((1, 4, D), seed=21, scale=2, device=device).double()
    target = _randn((1, 4, D), seed=22, device=device).double()

    def loss(alpha_logit: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            module.alpha_logit.copy_(alpha_logit)
        return (module(x, causal=True).output * target).sum()

    start = module.alpha_logit.detach().clone()
    loss(start).backward()
    grad, eps = module.alpha_logit.grad.clone(), 1e-6
    for h in range(H):
        step = torch.zeros(H, dtype=torch.float64, device=device)
        step[h] = eps
        with torch.no_grad():
            numeric = (loss(start + step) - loss(start - step)) / (2 * eps)
        assert grad[h].item() == pytest.approx(numeric.item(), rel=1e-4, abs=1e-8)


@pytest.mark.parametrize("direction", [1.0, -1.0], ids=["towards_softmax", "towards_sparsemax"])
def test_alpha_stays_in_bounds_under_large_steps(direction: float, device: torch.device) -> None:
    module = _make("entmax_alpha", device=device)
    x = _randn((B, 8, D), seed=23, scale=2, device=device)
    optimizer = torch.optim.SGD([module.alpha_logit], lr=100.0)
    for _ in range(20):
        probs = module(x, return_probs=True).probs
        optimizer.zero_grad()
        # Σp² (finite gradient at p = 0, unlike Σ p log p) is larger for sparser rows: direction
        # +1 spreads the probability out (α decreases), −1 concentrates it (α increases).
        (direction * probs.square().sum()).backward()
        optimizer.step()
        alpha = module.alpha
        assert torch.isfinite(alpha).all()
        assert torch.all((alpha >= ALPHA_MIN) & (alpha <= ALPHA_MAX))
    if direction > 0:
        assert torch.allclose(module.alpha, torch.full((H,), ALPHA_MIN, device=device))
    else:
        assert torch.all(module.alpha > 1.99)


# --------------------------------------------------------------------------- misc


def test_dropout_acts_on_probabilities_in_training_only(device: torch.device) -> None:
    assert MultiHeadAttention(D, H).dropout.p == 0
    module = _make("sparsemax", dropout=0.5, device=device)
    x = _randn((B, 6, D), seed=24, scale=2, device=device)
    module.train()
    first, second = module(x, return_probs=True), module(x, return_probs=True)
    assert not torch.allclose(first.output, second.output)
    assert torch.allclose(
        first.probs.sum(dim=-1), torch.ones((), device=device), atol=TOL
    )  # before dropout
    module.eval()
    assert torch.equal(module(x).output, module(x).output)


def test_outputs_and_optional_returns(device: torch.device) -> None:
    module = _make("entmax15", device=device)
    x = _randn((B, 5, D), seed=25, device=device)
    result = module(x)
    assert result.output.shape == (B, 5, D)
    assert result.probs is None and result.cache is None
    with pytest.raises(ValueError, match=r"x must have shape \[batch, length, 16\]"):
        module(_randn((B, 5, D + 1), seed=26, device=device))
    with pytest.raises(ValueError, match=r"memory must have shape \[batch, length, 16\]"):
        module(x, _randn((B, D), seed=27, device=device))


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_bfloat16_inputs(normalizer: str, device: torch.device) -> None:
    module = _make(normalizer, device=device).to(torch.bfloat16)
    x = _randn((B, 6, D), seed=27, scale=2, device=device).to(torch.bfloat16)
    result = module(x, causal=True, return_probs=True)
    assert result.output.dtype == torch.bfloat16 and torch.isfinite(result.output).all()
    assert torch.allclose(
        result.probs.float().sum(dim=-1), torch.ones((), device=device), atol=2e-2
    )


# CPU only: rejected by the constructor, before any tensor exists.
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 10, "n_heads": 4}, "d_model=10 is not divisible by n_heads=4"),
        ({"n_heads": 0}, "n_heads must be a positive integer, got 0"),
        ({"normalizer": "relu"}, "softmax, sparsemax, entmax15, entmax_alpha, topk; got 'relu'"),
        ({"normalizer": "topk", "k": 0}, "k must be a positive integer, got 0"),
        ({"k": 2.5}, "k must be a positive integer, got 2.5"),
        ({"alpha_init": 1.0}, r"alpha_init must lie in \(1.01, 2.0\), got 1.0"),
        ({"alpha_init": 1.01}, "alpha_init .* got 1.01"),
        ({"alpha_init": 2.0}, "alpha_init .* got 2.0"),
        ({"alpha_init": float("nan")}, "alpha_init .* got nan"),
        ({"dropout": 1.0}, r"dropout must lie in \[0, 1\), got 1.0"),
    ],
)
def test_constructor_validation(kwargs: dict, message: str) -> None:
    args = {"d_model": D, "n_heads": H, "normalizer": "entmax_alpha"} | kwargs
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**args)
