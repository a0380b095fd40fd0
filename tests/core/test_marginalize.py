"""Categorical marginalization, top-k sparsemax over bit vectors and Fenchel–Young losses.

Oracles: brute-force enumeration of all 2^D bit vectors (D ≤ 12), dense evaluation of
Σ_z π(z) ℓ(z) over every z, central finite differences in float64, and the ``entmax`` package's
sparsemax / 1.5-entmax losses.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from entmax import Entmax15Loss, SparsemaxLoss

from learnable_sparsity.core.marginalize import (
    MAPPINGS,
    BitVectorDistribution,
    entmax15_loss,
    fenchel_young_loss,
    k_best_bit_vectors,
    marginalize,
    marginalize_bits,
    sparsemax_loss,
    topk_sparsemax,
)
from learnable_sparsity.core.normalizers import sparsemax

F64 = torch.float64


def all_bit_vectors(D: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=D)), dtype=F64, device=device)


class RecordingLoss:
    """ℓ(b, z) = ⟨f_b, z⟩ with a per-example table f, recording every evaluated pair."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.pairs: list[tuple[int, int]] = []

    def __call__(self, example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.pairs += list(zip(example.tolist(), z.argmax(-1).tolist(), strict=True))
        return (self.table[example] * z).sum(-1)


# --------------------------------------------------------------------------- categorical


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
def test_marginalize_is_the_exact_expectation_and_gradient(
    mapping: str, device: torch.device
) -> None:
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(6, 10, generator=g, dtype=F64) * 2).to(device).requires_grad_()
    table = torch.randn(6, 10, generator=g, dtype=F64).to(device).requires_grad_()
    loss = RecordingLoss(table)
    result = marginalize(scores, loss, mapping)
    grads = torch.autograd.grad(result.surrogate.sum(), (scores, table))

    probs = MAPPINGS[mapping](scores)
    dense = (probs * table).sum(-1)
    torch.testing.assert_close(result.loss, dense)
    for got, want in zip(grads, torch.autograd.grad(dense.sum(), (scores, table)), strict=True):
        torch.testing.assert_close(got, want)

    support = (probs > 0).sum(-1)
    expected_calls = torch.full((6,), 10, device=device) if mapping == "softmax" else support
    assert result.decoder_calls.tolist() == expected_calls.tolist()
    if mapping != "softmax":
        # Per example, only that example's support — not the union over the batch.
        assert sorted(loss.pairs) == sorted(map(tuple, (probs > 0).nonzero().tolist()))
        assert (support < 10).any()


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
def test_marginalize_keeps_nan_scores_nan(mapping: str, device: torch.device) -> None:
    """A NaN score makes that example's expectation and gradient NaN (not an empty sum 0); the
    other examples are those of the batch without it."""
    g = torch.Generator().manual_seed(6)
    scores = (torch.randn(4, 7, generator=g, dtype=F64) * 2).to(device)
    table = torch.randn(4, 7, generator=g, dtype=F64).to(device)
    scores[2, 3] = float("nan")
    results = []
    for s in (scores, scores.nan_to_num(0.0)):
        s = s.clone().requires_grad_()
        result = marginalize(s, RecordingLoss(table), mapping)
        (grad,) = torch.autograd.grad(result.surrogate.sum(), s)
        results.append((result.loss.detach(), grad))
    (loss, grad), (clean_loss, clean_grad) = results
    assert loss[2].isnan() and grad[2].isnan().all()
    keep = torch.tensor([True, True, False, True], device=device)
    assert torch.equal(loss[keep], clean_loss[keep]) and torch.equal(grad[keep], clean_grad[keep])


def test_sparse_marginalization_gradient_matches_finite_differences(device: torch.device) -> None:
    g = torch.Generator().manual_seed(1)
    f = torch.randn(1, 12, generator=g, dtype=F64).to(device)
    for _ in range(5):
        scores = (torch.randn(1, 12, generator=g, dtype=F64) * 1.5).to(device).requires_grad_()

        def expected(s: torch.Tensor) -> torch.Tensor:
            return marginalize(s, lambda ex, z: (f[ex] * z).sum(-1), "sparsemax").loss.sum()

        (grad,) = torch.autograd.grad(expected(scores), scores)
        eps = 1e-6
        numeric = torch.stack(
            [
                (expected(scores + eps * e) - expected(scores - eps * e)) / (2 * eps)
                for e in torch.eye(12, dtype=F64, device=device)[:, None]
            ]
        ).detach()
        torch.testing.assert_close(grad[0], numeric, atol=1e-6, rtol=1e-6)


def test_marginalize_rejects_bad_input(device: torch.device) -> None:
    with pytest.raises(ValueError, match="unknown mapping 'gumbel'"):
        marginalize(torch.zeros(2, 3, device=device), lambda e, z: z.sum(-1), "gumbel")
    with pytest.raises(ValueError, match="batch, K"):
        marginalize(torch.zeros(3, device=device), lambda e, z: z.sum(-1))
    with pytest.raises(ValueError, match="one loss per"):
        marginalize(torch.zeros(2, 3, device=device), lambda e, z: z)


# --------------------------------------------------------------------------- top-k sparsemax


@pytest.mark.parametrize("D", [1, 2, 3, 5, 8, 12])
@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_k_best_configurations_match_enumeration(D: int, k: int, device: torch.device) -> None:
    g = torch.Generator().manual_seed(D * 7 + k)
    t = torch.randn(4, D, generator=g, dtype=F64).to(device)
    configs, valid = k_best_bit_vectors(t, k)
    everything = all_bit_vectors(D, device)
    n = min(k, 2**D)
    assert valid.sum(-1).tolist() == [n] * 4
    for b in range(4):
        scores = everything @ t[b]
        order = scores.argsort(descending=True)[:n]
        torch.testing.assert_close(configs[b, :n] @ t[b], scores[order])
        assert {tuple(r) for r in configs[b, :n].tolist()} == {
            tuple(r) for r in everything[order].tolist()
        }


def full_sparsemax(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    everything = all_bit_vectors(t.shape[-1], t.device)
    return everything, sparsemax(t @ everything.T)


@pytest.mark.parametrize("D", [3, 6, 10, 12])
@pytest.mark.parametrize("k", [2, 5, 10])
def test_topk_sparsemax_and_its_certificate_match_enumeration(
    D: int, k: int, device: torch.device
) -> None:
    g = torch.Generator().manual_seed(D + 100 * k)
    # Scales from peaked (support 1) to flat (support ≫ k) exercise both certificate outcomes.
    scales = torch.logspace(-1.5, 2, 24, dtype=F64)[:, None]
    t = (torch.randn(24, D, generator=g, dtype=F64) * scales).to(device)
    dist = topk_sparsemax(t, k)
    everything, full = full_sparsemax(t)
    full_support = (full > 0).sum(-1)
    assert dist.certified.tolist() == (full_support < k).tolist()
    if k < 2**D:  # otherwise all configurations fit in k and every row is certified
        assert dist.certified.any() and (~dist.certified).any()
    else:
        assert dist.certified.all()
    for b in range(24):
        support = dist.probs[b] > 0
        configs, probs = dist.configs[b][support].tolist(), dist.probs[b][support].tolist()
        ours = dict(zip(map(tuple, configs), probs, strict=True))
        if dist.certified[b]:
            for z, p in zip(map(tuple, everything.tolist()), full[b].tolist(), strict=True):
                assert ours.get(z, 0.0) == pytest.approx(p, abs=1e-12)
        else:
            assert int(dist.support_size[b]) == k
            # Sparsemax over the k best: the threshold of the restricted problem.
            top = (dist.configs[b] @ t[b]).sort(descending=True).values
            torch.testing.assert_close(dist.probs[b].sort(descending=True).values, sparsemax(top))


def _equals_full_sparsemax(dist, b: int, everything: torch.Tensor, full: torch.Tensor) -> bool:
    ours = dict(zip(map(tuple, dist.configs[b].tolist()), dist.probs[b].tolist(), strict=True))
    return all(
        abs(ours.get(z, 0.0) - p) <= 1e-12
        for z, p in zip(map(tuple, everything.tolist()), full[b].tolist(), strict=True)
    )


def test_topk_sparsemax_certificate_is_sufficient_not_necessary(device: torch.device) -> None:
    """``certified`` ⇒ equal to the full sparsemax (brute force over 2^D); not conversely: with
    exactly k configurations in the full support the result is exact yet not certified."""
    # D = 2, k = 2: scores ⟨t, z⟩ = 1.2, 1.0, 0.2, 0 and τ = 0.6: the full support is the k best.
    t = torch.tensor([[1.0, 0.2]], dtype=F64, device=device)
    dist = topk_sparsemax(t, 2)
    everything, full = full_sparsemax(t)
    assert int((full > 0).sum()) == 2 and not bool(dist.certified[0])
    assert _equals_full_sparsemax(dist, 0, everything, full)
    # A sweep over scales and k: certified ⇒ exact; exact ⇔ full support ≤ k (certified: < k).
    g = torch.Generator().manual_seed(4)
    D = 6
    scales = torch.logspace(-1, 1.5, 64, dtype=F64)[:, None]
    t = (torch.randn(64, D, generator=g, dtype=F64) * scales).to(device)
    everything, full = full_sparsemax(t)
    full_support = (full > 0).sum(-1)
    for k in (2, 3, 5, 8):
        dist = topk_sparsemax(t, k)
        exact = torch.tensor(
            [_equals_full_sparsemax(dist, b, everything, full) for b in range(64)], device=device
        )
        assert (exact | ~dist.certified).all(), "certified but not the full sparsemax"
        assert exact.tolist() == (full_support <= k).tolist()
        assert (exact & ~dist.certified).any(), "no exact-but-uncertified case in the sweep"
    # A NaN score gives NaN probabilities, which are not certified.
    nan = topk_sparsemax(
        torch.tensor([[0.3, float("nan"), -0.2], [0.3, 0.1, -0.2]], device=device), 3
    )
    assert nan.probs[0].isnan().all() and nan.certified.tolist() == [False, False]


def test_topk_sparsemax_gradient_matches_finite_differences(device: torch.device) -> None:
    D = 8
    g = torch.Generator().manual_seed(5)
    table = torch.randn(2**D, generator=g, dtype=F64).to(device)
    weights = 2 ** torch.arange(D - 1, -1, -1, dtype=F64, device=device)

    def expected(t: torch.Tensor) -> torch.Tensor:
        dist = topk_sparsemax(t, 10)
        index = (dist.configs @ weights).long()
        return (dist.probs * table[index]).sum()

    for scale in (0.3, 1.0, 3.0):
        t = (torch.randn(1, D, generator=g, dtype=F64) * scale).to(device).requires_grad_()
        (grad,) = torch.autograd.grad(expected(t), t)
        eps = 1e-6
        numeric = torch.stack(
            [
                (expected(t + eps * e) - expected(t - eps * e)) / (2 * eps)
                for e in torch.eye(D, dtype=F64, device=device)[:, None]
            ]
        ).detach()
        torch.testing.assert_close(grad[0], numeric, atol=1e-6, rtol=1e-6)


def test_topk_sparsemax_with_fewer_configurations_than_k(device: torch.device) -> None:
    t = torch.tensor([[0.2, -0.1]], dtype=F64, device=device)
    dist = topk_sparsemax(t, 10)
    assert dist.configs.shape == (1, 10, 2)
    assert int(dist.support_size[0]) <= 4 and bool(dist.certified[0])
    everything, full = full_sparsemax(t)
    torch.testing.assert_close(dist.marginals, full @ everything)


def test_marginalize_bits_counts_support_per_example(device: torch.device) -> None:
    configs = torch.tensor(
        [[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 0.0], [0, 1]]], device=device
    )
    probs = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], device=device)
    dist = BitVectorDistribution(configs, probs)
    calls: list[torch.Tensor] = []

    def loss_fn(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        calls.append(example)
        return z.sum(-1) + 10 * example

    result = marginalize_bits(dist, loss_fn)
    assert result.decoder_calls.tolist() == [2, 1]
    assert calls[0].tolist() == [0, 0, 1]
    torch.testing.assert_close(result.loss, torch.tensor([1.0, 10.0], device=device))


# --------------------------------------------------------------------------- Fenchel–Young losses


def test_fenchel_young_losses_match_the_entmax_package(device: torch.device) -> None:
    g = torch.Generator().manual_seed(2)
    scores = (torch.randn(16, 7, generator=g, dtype=F64) * 3).to(device)
    target = torch.randint(0, 7, (16,), generator=g).to(device)
    for ours, reference in ((sparsemax_loss, SparsemaxLoss), (entmax15_loss, Entmax15Loss)):
        s1 = scores.clone().requires_grad_()
        s2 = scores.clone().requires_grad_()
        mine = ours(s1, target)
        theirs = reference(reduction="none")(s2, target)
        torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=1e-8)
        mine.sum().backward()
        theirs.sum().backward()
        torch.testing.assert_close(s1.grad, s2.grad, atol=1e-10, rtol=1e-8)


def test_fenchel_young_loss_properties(device: torch.device) -> None:
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(8, 5, generator=g, dtype=F64).to(device)
    target = torch.randint(0, 5, (8,), generator=g).to(device)
    torch.testing.assert_close(
        fenchel_young_loss(scores, target, 1.0),
        torch.nn.functional.cross_entropy(scores, target, reduction="none"),
    )
    for alpha in (1.25, 1.5, 2.0):
        assert (fenchel_young_loss(scores, target, alpha) >= -1e-12).all()
        confident = torch.nn.functional.one_hot(target, 5).to(F64) * 10
        torch.testing.assert_close(
            fenchel_young_loss(confident, target, alpha), torch.zeros(8, dtype=F64, device=device)
        )
        soft = torch.softmax(scores, -1)
        assert fenchel_young_loss(scores, soft, alpha).shape == (8,)
    with pytest.raises(ValueError, match="alpha must be >= 1"):
        fenchel_young_loss(scores, target, 0.5)
    with pytest.raises(ValueError, match="class indices"):
        fenchel_young_loss(scores, torch.zeros(8, 4, device=device), 2.0)
