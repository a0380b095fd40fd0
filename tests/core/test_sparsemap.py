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

from learnable_sparsity.core.marginalize import marginalize_bits
from learnable_sparsity.core.sparsemap import bernoulli_map, budget_map, sparsemap

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
    torch.testing.assert_close(
        p.sum(-1), torch.ones(B, dtype=p.dtype, device=p.device), atol=1e-6, rtol=0
    )
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
def test_cube_marginals_are_the_projection(
    D: int, scale: float, dtype: torch.dtype, device: torch.device
) -> None:
    g = torch.Generator().manual_seed(D * 100 + int(scale * 10))
    t = (torch.randn(8, D, generator=g, dtype=F64) * scale + 0.5).to(device, dtype)
    dist = sparsemap(t)
    assert dist.probs.dtype == dtype
    torch.testing.assert_close(dist.marginals, t.clamp(0, 1), atol=1e-5, rtol=0)
    check_distribution(dist, t)


@pytest.mark.parametrize("D", [2, 6, 16, 48])
@pytest.mark.parametrize("budget_fraction", [0.0, 0.25, 0.5, 1.0])
def test_budget_marginals_are_the_projection(
    D: int, budget_fraction: float, device: torch.device
) -> None:
    budget = int(D * budget_fraction)
    g = torch.Generator().manual_seed(D + int(budget_fraction * 1000))
    # Shifted up so that the budget binds in most rows (and not in a few).
    t = (
        torch.randn(10, D, generator=g, dtype=F64)
        + torch.linspace(-0.5, 1.5, 10, dtype=F64)[:, None]
    ).to(device)
    dist = sparsemap(t, budget_map(budget))
    torch.testing.assert_close(dist.marginals, budget_projection(t, budget), atol=1e-5, rtol=0)
    check_distribution(dist, t, budget)


# CPU only: it checks the other test's inputs, not the code.
def test_budget_binds_in_the_budget_test() -> None:
    """Guard for the test above: the shifted inputs do exercise λ > 0 and λ = 0."""
    g = torch.Generator().manual_seed(16 + 500)
    t = (
        torch.randn(10, 16, generator=g, dtype=F64)
        + torch.linspace(-0.5, 1.5, 10, dtype=F64)[:, None]
    )
    binds = t.clamp(0, 1).sum(-1) > 8
    assert binds.any() and (~binds).any()


def test_maps_of_the_oracles(device: torch.device) -> None:
    t = torch.tensor([[0.5, -1.0, 2.0, 0.1, -0.2]], device=device)
    assert bernoulli_map(t).tolist() == [[1.0, 0.0, 1.0, 1.0, 0.0]]
    assert budget_map(2)(t).tolist() == [[1.0, 0.0, 1.0, 0.0, 0.0]]
    assert budget_map(0)(t).tolist() == [[0.0] * 5]
    assert budget_map(9)(t).tolist() == bernoulli_map(t).tolist()
    with pytest.raises(ValueError, match="budget"):
        budget_map(-1)


def test_map_scores_give_a_single_structure(device: torch.device) -> None:
    """Scores far outside [0, 1] project onto a vertex: the MAP structure with p = 1."""
    t = torch.tensor([[3.0, -2.0, 5.0], [-4.0, -1.5, 2.5]], device=device)
    dist = sparsemap(t)
    assert dist.support_size.tolist() == [1, 1]
    torch.testing.assert_close(dist.marginals, bernoulli_map(t))
    assert dist.iterations.tolist() == [1, 1]


def test_rows_are_solved_independently(device: torch.device) -> None:
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(6, 12, generator=g, dtype=F64) * 2).to(device)
    batch = sparsemap(t, budget_map(4))
    for b in range(6):
        single = sparsemap(t[b : b + 1], budget_map(4))
        torch.testing.assert_close(single.marginals[0], batch.marginals[b], atol=1e-9, rtol=0)


def random_structured_loss(D: int, seed: int, device: torch.device):
    """f(z) = ⟨w, z⟩ + zᵀ A z: a non-linear function of the configuration."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=g, dtype=F64).to(device)
    A = torch.randn(D, D, generator=g, dtype=F64).to(device)

    def f(configs: torch.Tensor) -> torch.Tensor:
        return configs @ w + torch.einsum("...i,ij,...j->...", configs, A, configs)

    return f


def expected_f(t: torch.Tensor, f, oracle) -> torch.Tensor:
    dist = sparsemap(t, oracle)
    return (dist.probs * f(dist.configs)).sum()


@pytest.mark.parametrize("D", [3, 6, 10])
@pytest.mark.parametrize("oracle_name", ["bernoulli", "budget"])
def test_gradient_matches_finite_differences(
    D: int, oracle_name: str, device: torch.device
) -> None:
    oracle = bernoulli_map if oracle_name == "bernoulli" else budget_map(D // 2)
    f = random_structured_loss(D, seed=D, device=device)
    g = torch.Generator().manual_seed(10 + D)
    for _ in range(3):
        t = (torch.rand(1, D, generator=g, dtype=F64) * 1.6 - 0.3).to(device).requires_grad_()
        (grad,) = torch.autograd.grad(expected_f(t, f, oracle), t)
        eps = 1e-6
        numeric = torch.zeros(D, dtype=F64, device=device)
        for i in range(D):
            step = torch.zeros_like(t)
            step[0, i] = eps
            with torch.no_grad():
                numeric[i] = (expected_f(t + step, f, oracle) - expected_f(t - step, f, oracle)) / (
                    2 * eps
                )
        torch.testing.assert_close(grad[0], numeric, atol=1e-5, rtol=1e-5)


def test_gradient_of_a_linear_loss_is_the_projection_jacobian(device: torch.device) -> None:
    g = torch.Generator().manual_seed(7)
    t = (torch.randn(16, 24, generator=g, dtype=F64) + 0.5).to(device).requires_grad_()
    w = torch.randn(24, generator=g, dtype=F64).to(device)
    dist = sparsemap(t)
    (grad,) = torch.autograd.grad((dist.marginals @ w).sum(), t)
    inside = ((t > 0) & (t < 1)).to(F64)
    torch.testing.assert_close(grad, w * inside, atol=1e-8, rtol=0)


def test_marginalize_bits_evaluates_the_support_only(device: torch.device) -> None:
    g = torch.Generator().manual_seed(11)
    t = (torch.randn(5, 6, generator=g, dtype=F64) + 0.5).to(device)
    dist = sparsemap(t)
    f = random_structured_loss(6, seed=1, device=device)
    seen: list[int] = []

    def loss_fn(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        seen.append(example.numel())
        return f(z) + example.to(F64)

    result = marginalize_bits(dist, loss_fn)
    assert result.decoder_calls.tolist() == dist.support_size.tolist()
    assert seen == [int(dist.support_size.sum())]
    expected = (
        dist.probs * (f(dist.configs) + torch.arange(5, dtype=F64, device=device)[:, None])
    ).sum(-1)
    torch.testing.assert_close(result.loss, expected)


def test_exhaustive_small_cube_against_enumerated_projection(device: torch.device) -> None:
    """D = 3: the returned distribution is a valid decomposition of μ over the 8 vertices."""
    vertices = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=F64, device=device)
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(50, 3, generator=g, dtype=F64) + 0.5).to(device)
    dist = sparsemap(t)
    for b in range(50):
        support = dist.configs[b][dist.probs[b] > 0]
        assert all((vertices == row).all(-1).any() for row in support)
    torch.testing.assert_close(dist.marginals, t.clamp(0, 1), atol=1e-9, rtol=0)


def test_errors_name_the_problem(device: torch.device) -> None:
    with pytest.raises(ValueError, match="batch, D"):
        sparsemap(torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="NaN or Inf"):
        sparsemap(torch.tensor([[0.5, float("nan")]], device=device))
    with pytest.raises(RuntimeError, match="max_iter=1"):
        t = torch.full((2, 8), 0.5, device=device) + torch.arange(8, device=device) * 0.01
        sparsemap(t, max_iter=1)


# Tied fractional scores (symmetric initialisation, fp16 scores): the active set can stop on a
# support that spans less than the face containing μ (t = ½·1 on the cube: S = {0, 1}, a segment
# of the 3-cube), where the support-only backward gives 11ᵀ/D instead of the projection's
# Jacobian. Every point below is one where the projection is differentiable (no t_i at 0 or 1,
# the budget either binding with λ > 0 or slack), so finite differences are the reference.
TIED = {
    "bernoulli": (
        bernoulli_map,
        [
            [0.5, 0.5, 0.5, 0.5],
            [0.3, 0.3, 0.3, 0.3],
            [0.5, 0.5, 0.2, 0.2],
            [0.5, 0.5, 1.5, -1.0],
            [0.7, 0.7, 0.7, 2.0],
            [0.25, 0.25, 0.75, 0.75],
        ],
    ),
    "budget": (
        budget_map(2),
        [
            [0.8, 0.8, 0.8, 0.8],  # λ = 0.3, μ = ½·1 on the face Σμ = 2
            [1.2, 1.2, 1.2, 1.2],
            [0.9, 0.9, 0.2, 0.2],
            [0.8, 0.8, 0.8, 2.5],  # one bit at 1, three tied on Σ = 1
            [0.6, 0.6, -1.0, 0.6],  # the budget does not bind: a face of the cube
            [0.5, 0.5, 0.25, -0.5],
        ],
    ),
}


def _marginals_jacobian(t: torch.Tensor, oracle) -> torch.Tensor:
    """J[b, i, j] = ∂μ_bi/∂t_bj by backpropagation through ``marginals`` (rows independent)."""
    t = t.clone().requires_grad_()
    mu = sparsemap(t, oracle).marginals
    rows = [torch.autograd.grad(mu[:, i].sum(), t, retain_graph=True)[0] for i in range(t.shape[1])]
    return torch.stack(rows, dim=1)


def _finite_difference_jacobian(fn, t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    columns = []
    for j in range(t.shape[1]):
        step = torch.zeros_like(t)
        step[:, j] = eps
        columns.append((fn(t + step) - fn(t - step)) / (2 * eps))
    return torch.stack(columns, dim=-1)


@pytest.mark.parametrize("oracle_name", ["bernoulli", "budget"])
def test_marginals_jacobian_at_tied_scores_matches_finite_differences(
    oracle_name: str, device: torch.device
) -> None:
    oracle, rows = TIED[oracle_name]
    t = torch.tensor(rows, dtype=F64, device=device)
    jacobian = _marginals_jacobian(t, oracle)
    with torch.no_grad():
        numeric = _finite_difference_jacobian(lambda s: sparsemap(s, oracle).marginals, t)
    if oracle_name == "bernoulli":
        reference = _finite_difference_jacobian(lambda s: s.clamp(0, 1), t)
    else:
        reference = _finite_difference_jacobian(lambda s: budget_projection(s, 2), t)
    torch.testing.assert_close(numeric, reference, atol=1e-6, rtol=0)  # the forward, as a guard
    torch.testing.assert_close(jacobian, reference, atol=1e-6, rtol=0)
    jacobian32 = _marginals_jacobian(t.float(), oracle)
    assert jacobian32.dtype == torch.float32
    torch.testing.assert_close(jacobian32.double(), jacobian, atol=1e-6, rtol=0)
    # Jacobian-vector products along random directions, against finite differences along them.
    g = torch.Generator().manual_seed(21)
    for _ in range(3):
        v = torch.randn(t.shape, generator=g, dtype=F64).to(device)
        with torch.no_grad():
            eps = 1e-6
            plus, minus = sparsemap(t + eps * v, oracle), sparsemap(t - eps * v, oracle)
            directional = (plus.marginals - minus.marginals) / (2 * eps)
        torch.testing.assert_close(
            torch.einsum("bij,bj->bi", jacobian, v), directional, atol=1e-6, rtol=0
        )
    # Closed forms: diag[0 < t < 1] on the cube; under a binding budget, the projector
    # I − 11ᵀ/|F| on the fractional coordinates F.
    inside = (t > 0) & (t < 1) if oracle_name == "bernoulli" else None
    if inside is not None:
        torch.testing.assert_close(jacobian, torch.diag_embed(inside.to(F64)), atol=1e-9, rtol=0)
    else:
        mu = budget_projection(t, 2)
        frac = ((mu > 1e-9) & (mu < 1 - 1e-9)).to(F64)
        binds = (mu.sum(-1, keepdim=True) > 2 - 1e-9).to(F64)[..., None]
        outer = frac[:, :, None] * frac[:, None, :] / frac.sum(-1)[:, None, None]
        torch.testing.assert_close(
            jacobian, torch.diag_embed(frac) - binds * outer, atol=1e-9, rtol=0
        )


def test_marginals_backward_keeps_the_support_backward_of_the_probabilities(
    device: torch.device,
) -> None:
    """At ties the probabilities' backward stays on the support (invariant to f + c, no f off
    the support); at generic scores both backwards give the same Jacobian of μ."""
    t = torch.tensor(
        [[0.5, 0.5, 0.5], [0.2, 0.9, 0.4]], dtype=F64, device=device, requires_grad=True
    )
    dist = sparsemap(t)
    f = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=F64, device=device)[: dist.probs.shape[1]]
    (grad,) = torch.autograd.grad((dist.probs * f).sum(), t, retain_graph=True)
    (shifted,) = torch.autograd.grad((dist.probs * (f + 100.0)).sum(), t, retain_graph=True)
    torch.testing.assert_close(grad, shifted, atol=1e-9, rtol=0)
    w = torch.tensor([0.3, -1.0, 2.0], dtype=F64, device=device)
    (via_mu,) = torch.autograd.grad((dist.marginals @ w).sum(), t, retain_graph=True)
    (via_p,) = torch.autograd.grad(
        (torch.einsum("bs,bsd->bd", dist.probs, dist.configs) @ w).sum(), t
    )
    torch.testing.assert_close(via_mu[1], via_p[1], atol=1e-9, rtol=0)
    torch.testing.assert_close(via_mu[0], w, atol=1e-9, rtol=0)


@pytest.mark.parametrize("oracle_name", ["bernoulli", "budget"])
def test_marginals_jacobian_for_long_generic_scores(oracle_name: str, device: torch.device) -> None:
    """D = 128, no ties: the active set stops within its tolerance, often on a support that
    spans less than the face containing μ (here 27–40 configurations for 30–56 fractional
    coordinates, independent bits); the backward of μ must still be the projection's Jacobian."""
    g = torch.Generator().manual_seed(128)
    shift = torch.linspace(-0.6, 1.0, 8, dtype=F64)[:, None]  # the budget binds in some rows
    t = (torch.randn(8, 128, generator=g, dtype=F64) + shift).to(device).requires_grad_()
    w = torch.randn(8, 128, generator=g, dtype=F64).to(device)
    budget = 40
    oracle = bernoulli_map if oracle_name == "bernoulli" else budget_map(budget)
    (grad,) = torch.autograd.grad((sparsemap(t, oracle).marginals * w).sum(), t)
    mu = budget_projection(t.detach(), budget if oracle_name == "budget" else 128)
    frac = ((mu > 1e-6) & (mu < 1 - 1e-6)).to(F64)
    binds = mu.sum(-1, keepdim=True) > (budget if oracle_name == "budget" else 128) - 1e-6
    if oracle_name == "budget":
        assert binds.any() and (~binds).any()
    # The projector onto the fractional coordinates, minus their mean where the budget binds.
    w_frac = w * frac
    expected = w_frac - binds * frac * w_frac.sum(-1, keepdim=True) / frac.sum(-1, keepdim=True)
    torch.testing.assert_close(grad, expected, atol=1e-8, rtol=0)


@pytest.mark.parametrize("seed", [9, 14, 17])
def test_long_rows_converge_without_cycling(seed: int, device: torch.device) -> None:
    """Batches where the solve's round-off (~2e-9 on a weight, 36 structures at D = 128) used to
    count as a negative weight: the method dropped and re-added one structure until max_iter."""
    torch.manual_seed(seed)
    t = torch.randn(64, 128).to(device)
    distribution = sparsemap(t)
    torch.testing.assert_close(distribution.marginals, t.clamp(0, 1), atol=1e-6, rtol=0)
    ones = torch.ones(64, device=device)
    torch.testing.assert_close(distribution.probs.sum(-1), ones, atol=1e-6, rtol=0)
