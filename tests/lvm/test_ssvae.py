"""Semi-supervised VAE: every method trains, exact ELBO, labelled-only pre-training."""

from __future__ import annotations

import math

import pytest
import torch

from learnable_sparsity.core.marginalize import sparsemax_loss
from learnable_sparsity.core.normalizers import softmax
from learnable_sparsity.lvm import ssvae
from learnable_sparsity.lvm.methods import METHODS, build_method

K, P = 4, 16


def _batch(generator: torch.Generator, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy copies (10% flipped pixels) of K fixed binary prototypes, with their class."""
    prototypes = (torch.rand(K, P, generator=torch.Generator().manual_seed(5)) < 0.5).float()
    y = torch.randint(K, (n,), generator=generator)
    flips = (torch.rand(n, P, generator=generator) < 0.1).float()
    return (prototypes[y] + flips) % 2, y


def _model() -> ssvae.SSVAE:
    torch.manual_seed(0)
    return ssvae.SSVAE(P, K, latent_dim=2, classifier_hidden=(32,), hidden=(32,))


def _step(model, method, step, generator):
    x_unlabelled, _ = _batch(generator)
    x_labelled, y = _batch(generator, 8)
    return ssvae.loss(model, method, x_unlabelled, (x_labelled, y), step, generator=generator)


@pytest.mark.parametrize("name", METHODS["categorical"])
def test_every_method_decreases_the_loss(name, train, decreases) -> None:
    method = build_method(
        name,
        "categorical",
        k=3 if name == "unordered_set" else None,
        nvil_features=P,
        nvil_hidden=32,
    )
    decreases(train(_model(), method, _step))


def test_unlabelled_metrics_report_decoder_calls() -> None:
    model, generator = _model(), torch.Generator().manual_seed(0)
    x, _ = _batch(generator)
    _, dense = ssvae.loss(model, build_method("dense", "categorical"), x, None, 0)
    _, sparse = ssvae.loss(model, build_method("sparsemax", "categorical"), x, None, 0)
    assert dense["decoder_calls"] == K
    assert 1 <= sparse["support"] == sparse["decoder_calls"] <= K


def test_elbo_sums_over_all_classes_exactly() -> None:
    model, method = _model(), build_method("dense", "categorical")
    x, _ = _batch(torch.Generator().manual_seed(0), 5)
    elbo = ssvae.elbo(model, method, x, torch.Generator().manual_seed(3))
    with torch.no_grad():
        pair = model.pair_loss(
            x.repeat_interleave(K, 0), torch.eye(K).repeat(5, 1), torch.Generator().manual_seed(3)
        ).reshape(5, K)
        pi = softmax(model.scores(x))
        manual = -(pi * pair).sum(-1) - (pi * (pi * K).log()).sum(-1)
    torch.testing.assert_close(elbo, manual)


def test_labelled_only_loss_uses_the_sparsemax_loss_for_sparsemax() -> None:
    model, method = _model(), build_method("sparsemax", "categorical")
    x, y = _batch(torch.Generator().manual_seed(0), 8)
    total, metrics = ssvae.loss(model, method, None, (x, y), 0, classifier_weight=2.0)
    expected = float(sparsemax_loss(model.scores(x), y).detach().mean())
    assert metrics["classifier"] == pytest.approx(expected)
    assert "decoder_calls" not in metrics
    assert float(total.detach()) == pytest.approx(
        metrics["labelled_nelbo"] + 2 * expected, rel=1e-5
    )
    assert metrics["labelled_nelbo"] > math.log(K)


def test_accuracy_counts_argmax_matches() -> None:
    model = _model()
    x, _ = _batch(torch.Generator().manual_seed(0), 10)
    predicted = model.scores(x).argmax(-1)
    assert ssvae.accuracy(model, x, predicted) == 1.0
    assert ssvae.accuracy(model, x, (predicted + 1) % K) == 0.0


def test_the_unlabelled_term_is_weighted_as_the_released_code_weighs_it() -> None:
    """loss = labelled mean + u · unlabelled mean (the released code: u = 45,000 / 5,000)."""
    model, method = _model(), build_method("dense", "categorical")
    x, y = _batch(torch.Generator().manual_seed(0), 8)
    u, _ = _batch(torch.Generator().manual_seed(1), 8)
    parts = {}
    for weight in (1.0, 9.0):
        total, metrics = ssvae.loss(
            model,
            method,
            u,
            (x, y),
            0,
            unlabelled_weight=weight,
            generator=torch.Generator().manual_seed(2),
        )
        parts[weight] = (float(total.detach()), metrics)
    (one, m1), (nine, m9) = parts[1.0], parts[9.0]
    assert m1["unlabelled_nelbo"] == pytest.approx(m9["unlabelled_nelbo"])
    assert nine - one == pytest.approx(8 * m1["unlabelled_nelbo"], rel=1e-5)
    assert m9["loss"] == pytest.approx(nine, rel=1e-5)
