"""Sampling estimators: unbiasedness against exact gradients, decoder calls, schedules.

Each batch row is an independent copy of the same problem, so one backward pass gives N
independent gradient samples (the rows of ``scores.grad``). An unbiased estimator's mean lies
within 4 standard errors of the exact gradient (per coordinate; generators are seeded, so the
test is deterministic). Exact gradients come from autograd on Σ_z π(z) f(z) with every z
enumerated, on the CPU.

The estimators draw their noise on the scores' device, from a generator of that device: on CUDA
the samples are other draws than on the CPU, held to the same statistical bounds.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from learnable_sparsity.core import estimators
from learnable_sparsity.core.estimators import (
    GumbelTemperature,
    MovingAverageBaseline,
    NVILBaseline,
    gumbel,
    log_prob,
    nvil,
    sample,
    sfe,
    sfe_plus,
    sum_and_sample,
    unordered_set,
)

F64 = torch.float64
SCORES = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0], dtype=F64)
LOSSES = torch.tensor([1.0, 3.0, -2.0, 0.5, 2.0], dtype=F64)
BIT_SCORES = torch.tensor([0.4, -0.8, 1.1], dtype=F64)


def categorical_loss(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return z @ LOSSES.to(z.device)


def bit_loss(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """A non-linear function of the bits: f(z) = 2 z₀ − z₁ + 3 z₀ z₂ − z₁ z₂ + 0.5."""
    return 2 * z[:, 0] - z[:, 1] + 3 * z[:, 0] * z[:, 2] - z[:, 1] * z[:, 2] + 0.5


def exact_categorical_gradient() -> torch.Tensor:
    s = SCORES.clone().requires_grad_()
    (grad,) = torch.autograd.grad((torch.softmax(s, -1) * LOSSES).sum(), s)
    return grad


def exact_bit_gradient() -> torch.Tensor:
    t = BIT_SCORES.clone().requires_grad_()
    z = torch.tensor(list(itertools.product([0.0, 1.0], repeat=3)), dtype=F64)
    log_pi = log_prob(t.expand(8, 3), z, "bits")
    (grad,) = torch.autograd.grad((log_pi.exp() * bit_loss(None, z)).sum(), t)
    return grad


def gradient_samples(estimate, scores: torch.Tensor, n: int) -> torch.Tensor:
    batch = scores.expand(n, -1).clone().requires_grad_()
    estimate(batch).surrogate.sum().backward()
    return batch.grad


def assert_unbiased(samples: torch.Tensor, exact: torch.Tensor) -> None:
    mean = samples.mean(0)
    standard_error = samples.std(0) / math.sqrt(samples.shape[0])
    assert ((mean - exact).abs() <= 4 * standard_error + 1e-12).all(), (mean, exact, standard_error)


UNBIASED_CATEGORICAL = {
    "sfe": lambda g: lambda s: sfe(s, categorical_loss, "categorical", warm_baseline(), g),
    "sfe_plus": lambda g: lambda s: sfe_plus(s, categorical_loss, "categorical", g),
    "nvil": lambda g: lambda s: nvil(s, categorical_loss, "categorical", constant(s, 0.3), g),
    "sum_and_sample": lambda g: lambda s: sum_and_sample(s, categorical_loss, g),
    "unordered_set_k2": lambda g: lambda s: unordered_set(s, categorical_loss, 2, g),
    "unordered_set_k3": lambda g: lambda s: unordered_set(s, categorical_loss, 3, g),
    "unordered_set_k5": lambda g: lambda s: unordered_set(s, categorical_loss, 5, g),
}


def warm_baseline() -> MovingAverageBaseline:
    baseline = MovingAverageBaseline()
    baseline.update(torch.tensor([0.7, 1.1]))
    return baseline


def constant(scores: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full(
        scores.shape[:1], value, dtype=scores.dtype, device=scores.device, requires_grad=True
    )


@pytest.mark.parametrize("name", sorted(UNBIASED_CATEGORICAL))
def test_categorical_estimators_are_unbiased(name: str, device: torch.device) -> None:
    estimate = UNBIASED_CATEGORICAL[name](torch.Generator(device).manual_seed(1))
    samples = gradient_samples(estimate, SCORES.to(device), 20_000)
    assert_unbiased(samples, exact_categorical_gradient().to(device))


@pytest.mark.parametrize("name", ["sfe", "sfe_plus", "nvil"])
def test_bit_vector_estimators_are_unbiased(name: str, device: torch.device) -> None:
    g = torch.Generator(device).manual_seed(2)
    estimate = {
        "sfe": lambda s: sfe(s, bit_loss, "bits", warm_baseline(), g),
        "sfe_plus": lambda s: sfe_plus(s, bit_loss, "bits", g),
        "nvil": lambda s: nvil(s, bit_loss, "bits", constant(s, -0.4), g),
    }[name]
    samples = gradient_samples(estimate, BIT_SCORES.to(device), 20_000)
    assert_unbiased(samples, exact_bit_gradient().to(device))


def test_unordered_set_loss_estimate_is_unbiased(device: torch.device) -> None:
    g = torch.Generator(device).manual_seed(3)
    batch = SCORES.to(device).expand(20_000, -1)
    values = unordered_set(batch, categorical_loss, 3, g).loss
    exact = (torch.softmax(SCORES, -1) * LOSSES).sum().item()
    assert abs(values.mean() - exact) <= 4 * values.std() / math.sqrt(values.numel())


def test_unordered_set_probabilities_match_enumeration_of_orderings(device: torch.device) -> None:
    """P(S) for sampling without replacement: sum over all ordered draws of the set, = 1 over S."""
    p = torch.softmax(SCORES.to(device), -1)
    K, k = 5, 3
    total = 0.0
    for subset in itertools.combinations(range(K), k):
        brute = 0.0
        for order in itertools.permutations(subset):
            left, prob = 1.0, 1.0
            for item in order:
                prob *= float(p[item]) / left
                left -= float(p[item])
            brute += prob
        members = p[list(subset)][None]
        outside = 1 - members.sum(-1)
        ours = estimators._log_unordered_set_prob(members, outside).exp().item()
        assert ours == pytest.approx(brute, rel=1e-12)
        total += ours
    assert total == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("latent", ["categorical", "bits"])
@pytest.mark.parametrize("straight_through", [False, True])
def test_gumbel_bias_vanishes_as_temperature_decreases(
    latent: str, straight_through: bool, device: torch.device
) -> None:
    scores, loss, exact = (
        (SCORES, categorical_loss, exact_categorical_gradient())
        if latent == "categorical"
        else (BIT_SCORES, bit_loss, exact_bit_gradient())
    )
    scores, exact = scores.to(device), exact.to(device)
    errors = []
    for tau in (2.0, 0.5, 0.1):
        g = torch.Generator(device).manual_seed(4)
        samples = gradient_samples(
            lambda s, tau=tau, g=g: gumbel(s, loss, latent, tau, straight_through, g),
            scores,
            50_000,
        )
        errors.append(float((samples.mean(0) - exact).abs().max()))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.1 * errors[0], errors


def test_straight_through_forward_is_a_hard_sample(device: torch.device) -> None:
    g = torch.Generator(device).manual_seed(5)
    scores, bit_scores = SCORES.to(device), BIT_SCORES.to(device)
    seen: list[torch.Tensor] = []

    def record(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        seen.append(z.detach())
        return z.sum(-1)

    gumbel(scores.expand(100, -1), record, "categorical", 0.5, True, g)
    gumbel(bit_scores.expand(100, -1), record, "bits", 0.5, True, g)
    gumbel(scores.expand(100, -1), record, "categorical", 0.5, False, g)
    hard_categorical, hard_bits, relaxed = seen
    assert ((hard_categorical == 0) | (hard_categorical == 1)).all()
    assert (hard_categorical.sum(-1) == 1).all()
    assert ((hard_bits == 0) | (hard_bits == 1)).all()
    assert ((relaxed > 0) & (relaxed < 1)).any()


def test_samples_follow_the_distribution(device: torch.device) -> None:
    g = torch.Generator(device).manual_seed(6)
    scores, bit_scores = SCORES.to(device), BIT_SCORES.to(device)
    z = sample(scores.expand(40_000, -1), "categorical", g)
    freq = z.mean(0)
    p = torch.softmax(scores, -1)
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / 40_000).sqrt()).all()
    bits = sample(bit_scores.expand(40_000, -1), "bits", g)
    q = torch.sigmoid(bit_scores)
    assert ((bits.mean(0) - q).abs() <= 4 * (q * (1 - q) / 40_000).sqrt()).all()


@pytest.mark.parametrize(
    ("name", "calls"),
    [("sfe", 1), ("sfe_plus", 2), ("nvil", 1), ("gumbel", 1), ("sum_and_sample", 2), ("us", 4)],
)
def test_decoder_calls(name: str, calls: int, device: torch.device) -> None:
    scores = torch.randn(7, 6, device=device)
    evaluated: list[int] = []

    def loss(example: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        evaluated.append(example.numel())
        return z.sum(-1)

    run = {
        "sfe": lambda: sfe(scores, loss, "categorical"),
        "sfe_plus": lambda: sfe_plus(scores, loss, "categorical"),
        "nvil": lambda: nvil(scores, loss, "categorical", torch.zeros(7, device=device)),
        "gumbel": lambda: gumbel(scores, loss, "categorical", 1.0),
        "sum_and_sample": lambda: sum_and_sample(scores, loss),
        "us": lambda: unordered_set(scores, loss, 4),
    }[name]
    result = run()
    assert result.decoder_calls.tolist() == [calls] * 7
    assert sum(evaluated) == 7 * calls
    assert result.surrogate.shape == result.loss.shape == (7,)


def test_gumbel_temperature_schedule() -> None:
    schedule = GumbelTemperature(rate=1e-4, update_every=1000)
    assert schedule(0) == 1.0
    assert schedule(999) == 1.0
    assert schedule(1000) == pytest.approx(math.exp(-0.1))
    assert schedule(2500) == pytest.approx(math.exp(-0.2))
    assert schedule(10**6) == 0.5
    with pytest.raises(ValueError, match="update_every"):
        GumbelTemperature(rate=1e-4, update_every=0)


def test_moving_average_baseline_is_the_running_mean(device: torch.device) -> None:
    baseline = MovingAverageBaseline()
    baseline.update(torch.tensor([1.0, 2.0], device=device))
    baseline.update(torch.tensor([6.0], device=device))
    assert baseline.mean == pytest.approx(3.0)
    assert baseline.count == 3


def test_nvil_trains_its_baseline_towards_the_loss(device: torch.device) -> None:
    torch.manual_seed(0)
    net = NVILBaseline(4, hidden=16).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(32, 4).to(device)
    scores = torch.zeros(32, 3, device=device)
    for _ in range(300):
        result = nvil(scores, lambda e, z: 2.0 + z[:, 0] * 0, "categorical", net(x))
        optimizer.zero_grad()
        result.surrogate.mean().backward()
        optimizer.step()
    torch.testing.assert_close(net(x), torch.full((32,), 2.0, device=device), atol=0.05, rtol=0)


def test_estimators_reject_bad_arguments(device: torch.device) -> None:
    scores = torch.zeros(2, 4, device=device)
    with pytest.raises(ValueError, match="unknown latent 'gaussian'"):
        sfe(scores, lambda e, z: z.sum(-1), "gaussian")
    with pytest.raises(ValueError, match="temperature"):
        gumbel(scores, lambda e, z: z.sum(-1), "bits", 0.0)
    with pytest.raises(ValueError, match="k must be an integer in"):
        unordered_set(scores, lambda e, z: z.sum(-1), 1)
    with pytest.raises(ValueError, match="baseline must be"):
        nvil(scores, lambda e, z: z.sum(-1), "bits", torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="one loss per example"):
        sfe(scores, lambda e, z: z, "categorical")
