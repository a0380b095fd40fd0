"""Bit-vector VAE: every method trains, exact rate, NLL estimates against enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import bitvector_vae
from learnable_sparsity.lvm.methods import METHODS, build_method

P, LEVELS, D = 16, 4, 6


def _model(rank: int | None = None) -> bitvector_vae.BitVectorVAE:
    torch.manual_seed(0)
    return bitvector_vae.BitVectorVAE(P, D, LEVELS, hidden=32, rank=rank)


def _images(generator: torch.Generator, n: int = 32) -> torch.Tensor:
    """Copies of 5 fixed random grey-level images."""
    prototypes = torch.randint(LEVELS, (5, P), generator=torch.Generator().manual_seed(5))
    return prototypes[torch.randint(5, (n,), generator=generator)]


def _step(model, method, step, generator):
    return bitvector_vae.loss(model, method, _images(generator), step, generator)


def _method(name: str):
    return build_method(
        name, "bits", k=4 if name == "topk_sparsemax" else None, nvil_features=P, nvil_hidden=32
    )


@pytest.mark.parametrize("name", METHODS["bits"])
def test_every_method_decreases_the_loss(name, train, decreases) -> None:
    decreases(train(_model(rank=2 if name == "sfe" else None), _method(name), _step))


@pytest.mark.parametrize("name", ["sparsemap", "sfe"])
def test_rate_is_the_kl_to_the_uniform_prior(name) -> None:
    model, method = _model(), _method(name)
    x = _images(torch.Generator().manual_seed(0), 4)
    _, metrics = bitvector_vae.loss(model, method, x, 0, torch.Generator().manual_seed(0))
    with torch.no_grad():
        t = model.scores(x)
        if method.sparse:
            p = method.bit_distribution(t).probs
            neg_entropy = torch.where(p > 0, p * p.log(), 0.0).sum(-1)
        else:
            q = torch.sigmoid(t)
            neg_entropy = (q * q.log() + (1 - q) * (1 - q).log()).sum(-1)
    # rate = D log 2 − H(q) cancels: float32 rounding of the two ~D log 2 terms (≈ 1e-6 absolute)
    # exceeds 1e-5 of a small rate.
    expected = float((neg_entropy + D * math.log(2)).mean())
    assert metrics["rate"] == pytest.approx(expected, rel=1e-5, abs=D * math.log(2) * 1e-6)
    assert metrics["loss"] == pytest.approx(metrics["distortion"] + metrics["rate"])


@pytest.mark.parametrize("name", ["sparsemap", "topk_sparsemax", "sfe"])
def test_posterior_kl_is_the_training_rate(name) -> None:
    model, method = _model(), _method(name)
    x = _images(torch.Generator().manual_seed(0), 4)
    _, metrics = bitvector_vae.loss(model, method, x, 0, torch.Generator().manual_seed(0))
    kl = bitvector_vae.posterior_kl(model, method, x)
    assert kl.shape == (4,) and bool((kl >= -1e-5).all())
    assert float(kl.mean()) == pytest.approx(metrics["rate"], rel=1e-5, abs=1e-5)


def test_posterior_kl_is_zero_for_a_uniform_posterior_and_d_log_2_for_a_point_mass() -> None:
    model, method = _model(), _method("sfe")
    x = _images(torch.Generator().manual_seed(0), 3)
    with torch.no_grad():
        model.encoder[-1].weight.zero_()
        model.encoder[-1].bias.zero_()
    torch.testing.assert_close(bitvector_vae.posterior_kl(model, method, x), torch.zeros(3))
    with torch.no_grad():
        model.encoder[-1].bias.fill_(50.0)
    kl = bitvector_vae.posterior_kl(model, method, x)
    torch.testing.assert_close(kl, torch.full((3,), D * math.log(2)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["sfe", "topk_sparsemax", "sparsemap"])
def test_importance_sampled_nll_matches_enumeration(name) -> None:
    model = _model()
    with torch.no_grad():  # a decoder that depends strongly on z
        model.decoder[-1].weight.mul_(8)
    x = _images(torch.Generator().manual_seed(0), 5)
    exact = bitvector_vae.exact_nll_bits_per_dim(model, x)
    estimate = bitvector_vae.nll_bits_per_dim(
        model, _method(name), x, n_samples=4096, generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(estimate.bits_per_dim, exact, atol=0.03, rtol=0)
    # a quarter of the same draws: also an estimate of p(x), never closer on average (Jensen)
    torch.testing.assert_close(estimate.quarter_samples, exact, atol=0.06, rtol=0)


def test_an_estimate_from_fewer_draws_overstates_the_nll() -> None:
    """log of a mean of draws is biased low (Jensen): from a quarter of the draws the NLL estimate
    of a sparse q, which leans on prior draws outside its support, is higher. With one
    draw the quarter is that draw."""
    model = _model()
    with torch.no_grad():  # a decoder that depends strongly on z
        model.decoder[-1].weight.mul_(8)
    x = _images(torch.Generator().manual_seed(1), 5)
    draws = torch.Generator().manual_seed(2)
    estimate = bitvector_vae.nll_bits_per_dim(model, _method("topk_sparsemax"), x, 256, draws)
    assert float((estimate.quarter_samples - estimate.bits_per_dim).mean()) > 0
    for name in ("sfe", "topk_sparsemax"):
        one = bitvector_vae.nll_bits_per_dim(model, _method(name), x, 1, draws)
        torch.testing.assert_close(one.bits_per_dim, one.quarter_samples)


def test_rank_factorised_decoder_is_normalised() -> None:
    model = bitvector_vae.BitVectorVAE(2, D, 3, hidden=8, rank=2)
    every_x = torch.cartesian_prod(torch.arange(3), torch.arange(3))
    z = torch.randint(2, (1, D)).float().expand(len(every_x), -1)
    total = model.log_likelihood(every_x, z).logsumexp(0)
    torch.testing.assert_close(total, torch.tensor(0.0), atol=1e-5, rtol=0)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(LearnableSparsityError, match="n_bits=20"):
        bitvector_vae.exact_nll_bits_per_dim(
            bitvector_vae.BitVectorVAE(P, 20, LEVELS, hidden=4), torch.zeros(1, P, dtype=torch.long)
        )
    with pytest.raises(LearnableSparsityError, match=r"\[0, 4\)"):
        _model().scores(torch.full((1, P), LEVELS))
