"""SparseMAP over bit vectors against closed forms and finite differences.

Oracles: over the cube the SparseMAP marginals are the Euclidean projection clip(t, 0, 1); with a
budget Σz ≤ B they are clip(t − λ, 0, 1) with λ ≥ 0 found by bisection (λ = 0 when the budget
does not bind). Gradients are checked against central finite differences in float64, and for a
linear f(z) = ⟨w, z⟩ against the closed form ∂⟨w, μ⟩/∂t = w ⊙ [0 < t < 1].
"""

from __future__ import annotations

import itertools

import pytest
import torch

from components.core.marginalize import marginalize_bits
from components.core.sparsemap import bernoulli_map, budget_map, sparsemap

F64 = torch.float64


def budget_projection(t: torch.Tensor, budget: int) -> torch.Tensor:
    """Projection of t onto {μ ∈ [0,1]^D : Σμ ≤ budget} by bisection on λ."""
    inside = t.clamp(0, 1).sum(-1, keepdim=True) <= budget
    lo = torch.zeros_like(t[:, :1])
    hi = t.abs().amax(-1, keepdim=True) + 1
    for _ in range(200):
        mid = (lo + hi) / 2
        over = (t - mid).clamp(0, 1).sum(-1, keepdim=True) > budget
        lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
    return torch.where(inside, t.clamp(0, 1), (t - hi).clamp(0, 1))


def check_distribution(dist, t: torch.Tensor, budget: int | None = None) -> None:
    """p ≥ 0, Σp = 1, support ≤ D + 1, binary distinct configurations, Σ_z p(z) z = μ."""
    B, D = t.shape
    p, configs = dist.probs.detach(), dist.configs
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(B, dtype=p.dtype), atol=1e-6, rtol=0)
    assert int(dist.support_size.max()) <= D + 1
    assert ((configs == 0) | (configs == 1)).all()
    if budget is not None:
        assert (configs.sum(-1)[p > 0] <= budget).all()
    for b in range(B):
        support = configs[b][p[b] > 0]
        assert torch.unique(support, dim=0).shape[0] == support.shape[0], "repeated structure"
    mu = (p[..., None] * configs).sum(1)
    torch.testing.assert_close(mu, dist.marginals.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("D", [1, 2, 5, 16, 48])
@pytest.mark.parametrize("scale", [0.3, 1.0, 5.0])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_cube_marginals_are_the_projection(D: int, scale: float, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(D * 100 + int(scale * 10))
    t = (torch.randn(8, D, generator=g, dtype=F64) * scale + 0.5).to(dtype)
    dist = sparsemap(t)
    assert dist.probs.dtype == dtype
    torch.testing.assert_close(dist.marginals, t.clamp(0, 1), atol=1e-5, rtol=0)
    check_distribution(dist, t)


@pytest.mark.parametrize("D", [2, 6, 16, 48])
@pytest.mark.parametrize("budget_fraction", [0.0, 0.25, 0.5, 1.0])
def test_budget_marginals_are_the_projection(D: int, budget_fraction: float) -> None:
    budget = int(D * budget_fraction)
    g = torch.Generator().manual_seed(D + int(budget_fraction * 1000))
    # Shifted up so that the budget binds in most rows (and not in a few).
    t = (
        torch.randn(10, D, generator=g, dtype=F64)
        + torch.linspace(-0.5, 1.5, 10, dtype=F64)[:, None]
    )
    dist = sparsemap(t, budget_map(budget))
    torch.testing.assert_close(dist.marginals, budget_projection(t, budget), atol=1e-5, rtol=0)
    check_distribution(dist, t, budget)


def test_budget_binds_in_the_budget_test() -> None:
    """Guard for the test above: the shifted inputs do exercise λ > 0 and λ = 0."""
    g = torch.Generator().manual_seed(16 + 500)
    t = (
        torch.randn(10, 16, generator=g, dtype=F64)
        + torch.linspace(-0.5, 1.5, 10, dtype=F64)[:, None]
    )
    binds = t.clamp(0, 1).sum(-1) > 8
    assert binds.any() and (~binds).any()


def test_maps_of_the_oracles() -> None:
    t = torch.tensor([[0.5, -1.0, 2.0, 0.1, -0.2]])
    assert bernoulli_map(t).tolist() == [[1.0, 0.0, 1.0, 1.0, 0.0]]
    assert budget_map(2)(t).tolist() == [[1.0, 0.0, 1.0, 0.0, 0.0]]
    assert budget_map(0)(t).tolist() == [[0.0] * 5]
    assert budget_map(9)(t).tolist() == bernoulli_map(t).tolist()
    with pytest.raises(ValueError, match="budget"):
        budget_map(-1)


def test_map_scores_give_a_single_structure() -> None:
    """Scores far outside [0, 1] project onto a vertex: the MAP structure with p = 1."""
    t = torch.tensor([[3.0, -2.0, 5.0], [-4.0, -1.5, 2.5]])
    dist = sparsemap(t)
    assert dist.support_size.tolist() == [1, 1]
    torch.testing.assert_close(dist.marginals, bernoulli_map(t))
    assert dist.iterations.tolist() == [1, 1]


def test_rows_are_solved_independently() -> None:
    g = torch.Generator().manual_seed(3)
    t = torch.randn(6, 12, generator=g, dtype=F64) * 2
    batch = sparsemap(t, budget_map(4))
    for b in range(6):
        single = sparsemap(t[b : b + 1], budget_map(4))
        torch.testing.assert_close(single.marginals[0], batch.marginals[b], atol=1e-9, rtol=0)


def random_structured_loss(D: int, seed: int):
    """f(z) = ⟨w, z⟩ + zᵀ A z: a non-linear function of the configuration."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=g, dtype=F64)
    A = torch.randn(D, D, generator=g, dtype=F64)

    def f(configs: torch.Tensor) -> torch.Tensor:
        return configs @ w + torch.einsum("...i,ij,...j->...", configs, A, configs)

    return f


def expected_f(t: torch.Tensor, f, oracle) -> torch.Tensor:
    dist = sparsemap(t, oracle)
    return (dist.probs * f(dist.configs)).sum()


@pytest.mark.parametrize("D", [3, 6, 10])
@pytest.mark.parametrize("oracle_name", ["bernoulli", "budget"])
def test_gradient_matches_finite_differences(D: int, oracle_name: str) -> None:
    oracle = bernoulli_map if oracle_name == "bernoulli" else budget_map(D // 2)
    f = random_structured_loss(D, seed=D)
    g = torch.Generator().manual_seed(10 + D)
    for _ in range(3):
        t = (torch.rand(1, D, generator=g, dtype=F64) * 1.6 - 0.3).requires_grad_()
        (grad,) = torch.autograd.grad(expected_f(t, f, oracle), t)
        eps = 1e-6
        numeric = torch.zeros(D, dtype=F64)
        for i in range(D):
            step = torch.zeros_like(t)
            step[0, i] = eps
            with torch.no_grad():
                numeric[i] = (expected_f(t + step, f, oracle) - expected_f(t - step, f, oracle)) / (
                    2 * eps
                )
        torch.testing.assert_close(grad[0], numeric, atol=1e-5, rtol=1e-5)


def test_gradient_of_a_linear_loss_is_the_projection_jacobian() -> None:
    g = torch.Generator().manual_seed(7)
    t = (torch.randn(16, 24, generator=g, dtype=F64) + 0.5).requires_grad_()
    w = torch.randn(24, generator=g, dtype=F64)
    dist = sparsemap(t)
    (grad,) = torch.autograd.grad((dist.marginals @ w).sum(), t)
    inside = ((t > 0) & (t < 1)).to(F64)
    torch.testing.assert_close(grad, w * inside, atol=1e-8, rtol=0)


def test_marginalize_bits_evaluates_the_support_only() -> None:
    g = torch.Generator().manual_seed(11)
    t = torch.randn(5, 6, generator=g, dtype=F64) + 0.5
    dist = sparsemap(t)
    f = random_structured_loss(6, seed=1)
    seen: list[int] = []

    def loss_fn(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        seen.append(example.numel())
        return f(z) + example.to(F64)

    result = marginalize_bits(dist, loss_fn)
    assert result.decoder_calls.tolist() == dist.support_size.tolist()
    assert seen == [int(dist.support_size.sum())]
    expected = (dist.probs * (f(dist.configs) + torch.arange(5, dtype=F64)[:, None])).sum(-1)
    torch.testing.assert_close(result.loss, expected)


def test_exhaustive_small_cube_against_enumerated_projection() -> None:
    """D = 3: the returned distribution is a valid decomposition of μ over the 8 vertices."""
    vertices = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=F64)
    g = torch.Generator().manual_seed(0)
    t = torch.randn(50, 3, generator=g, dtype=F64) + 0.5
    dist = sparsemap(t)
    for b in range(50):
        support = dist.configs[b][dist.probs[b] > 0]
        assert all((vertices == row).all(-1).any() for row in support)
    torch.testing.assert_close(dist.marginals, t.clamp(0, 1), atol=1e-9, rtol=0)


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="batch, D"):
        sparsemap(torch.zeros(3))
    with pytest.raises(ValueError, match="NaN or Inf"):
        sparsemap(torch.tensor([[0.5, float("nan")]]))
    with pytest.raises(RuntimeError, match="max_iter=1"):
        sparsemap(torch.full((2, 8), 0.5) + torch.arange(8) * 0.01, max_iter=1)
