"""The method dispatcher: construction, decoder-call accounting, entropies, NVIL state."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from learnable_sparsity.core.normalizers import sparsemax
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm.methods import (
    METHODS,
    bernoulli_entropy,
    build_method,
    expectation_metrics,
    expected_loss,
    support_entropy,
)

B, K, D = 6, 7, 5


class CountingLoss:
    """ℓ(b, z) = ⟨w_b, z⟩, counting the evaluations made for each example."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights
        self.calls = torch.zeros(weights.shape[0], dtype=torch.long)

    def __call__(self, example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.calls.index_add_(0, example, torch.ones_like(example))
        return (self.weights[example] * z).sum(-1)


def _scores(dim: int) -> torch.Tensor:
    return torch.randn(B, dim, generator=torch.Generator().manual_seed(0)) * 2


def _evaluate(name: str, latent: str, dim: int, **options: int):
    method = build_method(name, latent, nvil_features=3, nvil_hidden=8, **options)
    scores = _scores(dim).requires_grad_()
    loss_fn = CountingLoss(torch.randn(B, dim, generator=torch.Generator().manual_seed(1)))
    expectation = expected_loss(
        method,
        scores,
        loss_fn,
        step=0,
        features=torch.ones(B, 3),
        generator=torch.Generator().manual_seed(2),
    )
    assert torch.equal(expectation.estimate.decoder_calls, loss_fn.calls)
    return method, scores, expectation


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("dense", K),
        ("sfe", 1),
        ("sfe_plus", 2),
        ("nvil", 1),
        ("gumbel", 1),
        ("st_gumbel", 1),
        ("sum_and_sample", 2),
        ("unordered_set", 3),
    ],
)
def test_categorical_decoder_calls_are_fixed(name: str, calls: int) -> None:
    _, _, expectation = _evaluate(name, "categorical", K, **({"k": 3} if calls == 3 else {}))
    assert (expectation.estimate.decoder_calls == calls).all()


def test_sparsemax_calls_the_decoder_on_each_examples_support() -> None:
    method, scores, expectation = _evaluate("sparsemax", "categorical", K)
    support = (sparsemax(scores.detach()) > 0).sum(-1)
    assert torch.equal(expectation.estimate.decoder_calls, support)
    assert (support < K).any()
    assert expectation_metrics(method, expectation)["support"] == float(support.float().mean())


@pytest.mark.parametrize("name", ["topk_sparsemax", "sparsemap", "sparsemap_budget"])
def test_sparse_bit_methods_call_the_decoder_on_the_support(name: str) -> None:
    method, scores, expectation = _evaluate(name, "bits", D, **({"k": 4} if "topk" in name else {}))
    support = method.bit_distribution(scores.detach()).support_size
    assert torch.equal(expectation.estimate.decoder_calls, support)
    if name == "topk_sparsemax":
        assert (support <= 4).all()


@pytest.mark.parametrize("name", ["sfe", "sfe_plus", "nvil", "gumbel", "st_gumbel"])
def test_sampling_bit_methods_call_the_decoder_once_or_twice(name: str) -> None:
    _, _, expectation = _evaluate(name, "bits", D)
    assert (expectation.estimate.decoder_calls == (2 if name == "sfe_plus" else 1)).all()


def test_sparsemap_budget_respects_the_budget() -> None:
    method = build_method("sparsemap_budget", "bits")
    distribution = method.bit_distribution(_scores(D).abs() + 1)
    active = distribution.configs.sum(-1)[distribution.probs > 0]
    assert (active <= D // 2).all()


def test_entropies_match_their_definitions() -> None:
    scores = _scores(K)
    p = sparsemax(scores)
    manual = torch.tensor([-sum(v * math.log(v) for v in row if v > 0) for row in p.tolist()])
    torch.testing.assert_close(support_entropy(p), manual)
    t = _scores(3)
    codes = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)))
    log_q = (codes[None] * torch.nn.functional.logsigmoid(t)[:, None]).sum(-1) + (
        (1 - codes[None]) * torch.nn.functional.logsigmoid(-t)[:, None]
    ).sum(-1)
    torch.testing.assert_close(bernoulli_entropy(t), -(log_q.exp() * log_q).sum(-1))


def test_entropy_gradient_is_finite_on_sparse_distributions() -> None:
    _, scores, expectation = _evaluate("sparsemax", "categorical", K)
    expectation.entropy.sum().backward()
    assert torch.isfinite(scores.grad).all()


def test_nvil_baseline_is_trained_through_the_surrogate() -> None:
    method, _, expectation = _evaluate("nvil", "categorical", K)
    assert method.parameters()
    expectation.estimate.surrogate.mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in method.parameters())


def test_nvil_needs_features() -> None:
    with pytest.raises(LearnableSparsityError, match="nvil_features"):
        build_method("nvil", "bits")
    method = build_method("nvil", "bits", nvil_features=3, nvil_hidden=8)
    with pytest.raises(LearnableSparsityError, match="features"):
        expected_loss(method, _scores(D), CountingLoss(torch.ones(B, D)), step=0)


def test_gumbel_temperature_follows_the_step() -> None:
    method = build_method("gumbel", "categorical", gumbel_rate=1e-3, gumbel_update_every=100)
    assert method.temperature(99) == 1.0
    assert method.temperature(100) == pytest.approx(math.exp(-0.1))


@pytest.mark.parametrize(
    ("name", "latent", "bad"),
    [
        ("sparsemap", "categorical", "sparsemap"),
        ("dense", "bits", "dense"),
        ("sfe", "graph", "graph"),
    ],
)
def test_unknown_methods_are_named(name: str, latent: str, bad: str) -> None:
    with pytest.raises(LearnableSparsityError, match=bad):
        build_method(name, latent)


def test_every_listed_method_builds() -> None:
    for latent, names in METHODS.items():
        for name in names:
            assert build_method(name, latent, nvil_features=2).latent == latent
