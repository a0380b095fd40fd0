r"""Semi-supervised VAE M2 (Kingma et al. 2014) with a categorical class latent z.

Generative model p(z) p(h) p(x|z, h): z ∈ {1..K} uniform, h ∈ R^H standard normal, x ∈ {0,1}^P
with independent Bernoulli pixels whose logits an MLP computes from [h, one_hot(z)].
Posterior π(z|x) q(h|x, z): π from a classifier MLP (softmax, or sparsemax for the proposed
method), q(h|x, z) = N(μ, diag σ²) from an MLP on [x, one_hot(z)], sampled by
reparameterization h = μ + σ ε.

Per (x, z) pair, with one h ∼ q(h|x, z) (the decoder call):

    ℓ(x, z) = −log p(x|z, h) + KL(q(h|x, z) ‖ N(0, I)),   −ELBO(x, z) = ℓ(x, z) + log K.

Unlabelled x:  −ELBO(x) = E_{π(z|x)}[ℓ(x, z)] + KL(π ‖ U_K),  KL(π ‖ U_K) = log K − H(π);
E_π[ℓ] goes through :func:`learnable_sparsity.lvm.methods.expected_loss` and H(π) is that of the
method's discrete π (for Gumbel methods: of Cat(softmax(s)), as in Jang et al. 2017).

Labelled (x, y):  −ELBO(x, y) + w · c(s, y), the classifier term c being the sparsemax loss for
the ``sparsemax`` method and −log softmax(s)_y otherwise. The loss of a step is the labelled
batch's mean plus u times the unlabelled batch's mean (``unlabelled_weight`` u: 1, or the
released code's 45,000 / 5,000 = 9, the ratio of unlabelled to labelled images).

The experiment (:func:`setup`, settings :class:`SsvaeSettings`): a ``labelled_fraction`` of the
training images keep their labels; each step draws a labelled and an unlabelled batch (after the
first ``pretrain_steps``, which see the labelled batch only), binarised afresh. The test metrics
are the accuracy of argmax π(z|x) and −ELBO, on one fixed binarisation of the test images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from learnable_sparsity.core.marginalize import marginalize, sparsemax_loss
from learnable_sparsity.data.images import ImageSplits, binarize
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import mlp
from learnable_sparsity.lvm.methods import (
    METHODS,
    Method,
    build_method,
    expectation_metrics,
    expected_loss,
    support_entropy,
)
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.lvm.training import Setup, WarmStart, evaluation_generator, sample_batch
from learnable_sparsity.settings import Settings, SettingsError, setting


class SSVAE(nn.Module):
    """M2: classifier π(z|x), inference network q(h|x, z), generator p(x|z, h).

    ``classifier_hidden``: hidden sizes of the classifier (paper: 256, 256, 256); ``hidden``:
    hidden sizes of the inference and generative networks (authors' code: 128, 128).
    """

    def __init__(
        self,
        input_dim: int,
        n_classes: int = 10,
        latent_dim: int = 8,
        classifier_hidden: Sequence[int] = (256, 256, 256),
        hidden: Sequence[int] = (128, 128),
    ) -> None:
        super().__init__()
        if n_classes < 2:
            raise LearnableSparsityError(f"n_classes must be >= 2, got {n_classes}")
        self.n_classes, self.latent_dim = n_classes, latent_dim
        self.classifier = mlp([input_dim, *classifier_hidden, n_classes])
        self.inference = mlp([input_dim + n_classes, *hidden, 2 * latent_dim])
        self.generator = mlp([latent_dim + n_classes, *hidden, input_dim])

    def scores(self, x: Tensor) -> Tensor:
        """Classifier scores s [B, K] of π(z|x) = softmax(s) or sparsemax(s)."""
        return self.classifier(x)

    def pair_loss(self, x: Tensor, z: Tensor, generator: torch.Generator | None = None) -> Tensor:
        r"""ℓ(x, z) = −log p(x|z, h) + KL(q(h|x,z) ‖ N(0, I)), h = μ + σε, per row; x [N, P]
        binary, z [N, K] one-hot (or relaxed)."""
        mu, log_var = self.inference(torch.cat([x, z], -1)).chunk(2, -1)
        # ε is drawn in float32 (or wider) under any autocast: the sample is then the same in
        # every precision and torch version (torch 2.11's bf16 normal sampler on the CPU draws
        # other numbers from the same generator than its float32 one does).
        noise_dtype = torch.promote_types(mu.dtype, torch.float32)
        eps = torch.randn(mu.shape, dtype=noise_dtype, device=mu.device, generator=generator)
        h = mu + (0.5 * log_var).exp() * eps
        logits = self.generator(torch.cat([h, z], -1))
        reconstruction = nn.functional.binary_cross_entropy_with_logits(
            logits, x, reduction="none"
        ).sum(-1)
        kl = 0.5 * (mu.pow(2) + log_var.exp() - 1 - log_var).sum(-1)
        return reconstruction + kl


def _check_binary(x: Tensor, input_dim: int) -> None:
    if x.dim() != 2 or x.shape[1] != input_dim:
        raise LearnableSparsityError(f"x must be [batch, {input_dim}], got {tuple(x.shape)}")
    if not bool(((x == 0) | (x == 1)).all()):
        raise LearnableSparsityError("x must be binarised (values 0 or 1)")


def _input_dim(model: SSVAE) -> int:
    return model.classifier[0].in_features


def classifier_loss(model: SSVAE, method: Method, x: Tensor, y: Tensor) -> Tensor:
    """c(s, y) per example: sparsemax loss for ``sparsemax``, −log softmax(s)_y otherwise."""
    scores = model.scores(x)
    if method.name == "sparsemax":
        return sparsemax_loss(scores, y)
    return nn.functional.cross_entropy(scores, y, reduction="none")


def loss(
    model: SSVAE,
    method: Method,
    batch_unlabelled: Tensor | None,
    batch_labelled: tuple[Tensor, Tensor] | None,
    step: int,
    *,
    classifier_weight: float = 1.0,
    unlabelled_weight: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, float]]:
    r"""Training loss: u · mean unlabelled −ELBO(x) + mean labelled [−ELBO(x, y) + w·c(s, y)].

    ``batch_unlabelled`` [B, P] binary; ``batch_labelled`` = (x [B', P] binary, y [B'] long);
    either may be None (not both; labelled only = pre-training). Returns the loss to
    backpropagate and batch-mean metrics: ``loss`` (its value, the estimate of E_π[ℓ] in place of
    the surrogate), ``unlabelled_nelbo``, ``labelled_nelbo``, ``classifier``, and for the
    unlabelled part ``decoder_calls``, ``entropy`` (and ``support`` for sparsemax).
    """
    if batch_unlabelled is None and batch_labelled is None:
        raise LearnableSparsityError(
            "ssvae.loss needs an unlabelled or a labelled batch (both None)"
        )
    log_k = math.log(model.n_classes)
    terms: list[Tensor] = []
    value = 0.0
    metrics: dict[str, float] = {}
    if batch_unlabelled is not None:
        x = batch_unlabelled
        _check_binary(x, _input_dim(model))
        expectation = expected_loss(
            method,
            model.scores(x),
            lambda example, z: model.pair_loss(x[example], z, generator),
            step,
            features=x,
            generator=generator,
        )
        kl = log_k - expectation.entropy
        terms.append(unlabelled_weight * (expectation.estimate.surrogate + kl).mean())
        metrics["unlabelled_nelbo"] = float((expectation.estimate.loss + kl).detach().mean())
        value += unlabelled_weight * metrics["unlabelled_nelbo"]
        metrics |= expectation_metrics(method, expectation)
    if batch_labelled is not None:
        x, y = batch_labelled
        _check_binary(x, _input_dim(model))
        if y.shape != x.shape[:1]:
            raise LearnableSparsityError(f"labels must be [{x.shape[0]}], got {tuple(y.shape)}")
        one_hot = nn.functional.one_hot(y, model.n_classes).to(x.dtype)
        nelbo = model.pair_loss(x, one_hot, generator) + log_k
        classifier = classifier_loss(model, method, x, y)
        labelled = (nelbo + classifier_weight * classifier).mean()
        terms.append(labelled)
        metrics["labelled_nelbo"] = float(nelbo.detach().mean())
        metrics["classifier"] = float(classifier.detach().mean())
        value += float(labelled.detach())
    metrics["loss"] = value
    return torch.stack(terms).sum(), metrics


@torch.no_grad()
def accuracy(model: SSVAE, x: Tensor, y: Tensor) -> float:
    """Fraction of x whose most probable class argmax_z π(z|x) (= argmax of the scores for
    softmax and sparsemax alike) equals y."""
    return float((model.scores(x).argmax(-1) == y).float().mean())


@torch.no_grad()
def elbo(
    model: SSVAE, method: Method, x: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    r"""ELBO(x) = −Σ_z π(z|x) ℓ(x, z) − log K + H(π), per example [B], the sum over z exact
    (π = sparsemax for ``sparsemax``, softmax otherwise) and one h ∼ q(h|x, z) per pair."""
    _check_binary(x, _input_dim(model))
    scores = model.scores(x)
    expected = marginalize(
        scores, lambda example, z: model.pair_loss(x[example], z, generator), method.mapping
    ).loss
    return -expected - math.log(model.n_classes) + support_entropy(method.probabilities(scores))


@dataclass(frozen=True, kw_only=True)
class WarmStartSettings(Settings):
    """Params ``lvm.ssvae.warm_start``: the released code's warm start (a separate run on the
    labelled images at rate ``lr``, its best checkpoint by validation loss loaded with a fresh
    optimizer), the validation −ELBO taken every ``validate_every`` steps."""

    lr: float = setting(above=0)
    validate_every: int = setting(at_least=1)


@dataclass(frozen=True, kw_only=True)
class SsvaeSettings(LvmSettings):
    """Params ``lvm.ssvae``: the shared keys (:class:`LvmSettings`) and the M2 model and data.

    ``labelled_fraction`` of the training images labelled; ``latent_dim`` (H of h),
    ``classifier_hidden`` and ``hidden`` layer sizes of :class:`SSVAE`; ``classifier_weight`` w
    of the labelled classifier term; ``unlabelled_weight`` u of the unlabelled term; the first
    ``pretrain_steps`` steps train on labelled batches only (fewer than ``steps``, or the
    unlabelled data would never be seen). Without ``warm_start`` they are the first steps of
    one run (one optimizer, the method's rate); with it they are the released code's warm start
    (:class:`WarmStartSettings`, :class:`~learnable_sparsity.lvm.training.WarmStart`): the main
    phase starts from the weights of the lowest validation −ELBO (exact, under the method's
    normaliser family: sparsemax for ``sparsemax``, softmax otherwise), with a fresh Adam and its
    Gumbel temperature schedule starting afresh.
    """

    KNOWN_METHODS: ClassVar[tuple[str, ...]] = METHODS["categorical"]
    HEADLINE: ClassVar[tuple[str, str]] = ("accuracy", "test accuracy")

    labelled_fraction: float = setting(above=0, below=1)
    latent_dim: int = setting(at_least=1)
    classifier_hidden: tuple[int, ...] = setting(at_least=1)
    hidden: tuple[int, ...] = setting(at_least=1)
    classifier_weight: float = setting(at_least=0)
    unlabelled_weight: float = setting(1.0, above=0)
    pretrain_steps: int = setting(at_least=0)
    warm_start: WarmStartSettings | None = None

    def validate(self) -> None:
        super().validate()
        if self.pretrain_steps >= self.steps:
            raise SettingsError(
                "pretrain_steps",
                f"must be < steps ({self.steps}), or no step sees the unlabelled images; "
                f"got {self.pretrain_steps}",
            )
        if self.warm_start is not None and self.pretrain_steps == 0:
            raise SettingsError("warm_start", "needs pretrain_steps > 0 (its length)")


def setup(
    settings: SsvaeSettings, data: ImageSplits, cell: LvmCell, generator: torch.Generator
) -> Setup:
    """The semi-supervised VAE of ``cell`` on ``data`` (the labelled part chosen by its seed)."""
    device = generator.device
    labelled, unlabelled = data.semi_supervised(settings.labelled_fraction, cell.seed)
    labelled, unlabelled = labelled.to(device), unlabelled.to(device)
    valid, test = data.valid.to(device), data.test.to(device)
    model = SSVAE(
        data.pixels,
        latent_dim=settings.latent_dim,
        classifier_hidden=settings.classifier_hidden,
        hidden=settings.hidden,
    )
    method = build_method(
        cell.method, "categorical", gumbel_rate=settings.gumbel_rate, nvil_features=data.pixels
    )
    size = settings.batch_size
    # a warm-started run's main phase starts its temperature schedule at 0, as a new run would
    schedule_start = 0 if settings.warm_start is None else settings.pretrain_steps

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        picked = sample_batch(len(labelled), size, generator)
        batch_labelled = (binarize(labelled.images[picked], generator), labelled.labels[picked])
        batch_unlabelled = None
        if step >= settings.pretrain_steps:
            x = unlabelled.images[sample_batch(len(unlabelled), size, generator)]
            batch_unlabelled = binarize(x, generator)
        return loss(
            model,
            method,
            batch_unlabelled,
            batch_labelled,
            max(step - schedule_start, 0),
            classifier_weight=settings.classifier_weight,
            unlabelled_weight=settings.unlabelled_weight,
            generator=generator,
        )

    def evaluate() -> dict[str, float]:
        fixed = evaluation_generator(device)
        x = binarize(test.images, fixed)
        nelbo = -elbo(model, method, x, fixed).mean()
        return {"accuracy": accuracy(model, x, test.labels), "test_nelbo": float(nelbo)}

    warm_start = None
    if settings.warm_start is not None:

        def validation_nelbo() -> float:
            fixed = evaluation_generator(device)
            return float(-elbo(model, method, binarize(valid.images, fixed), fixed).mean())

        warm_start = WarmStart(
            settings.pretrain_steps,
            settings.warm_start.lr,
            settings.warm_start.validate_every,
            validation_nelbo,
        )
    return Setup(model, method, step_fn, evaluate, warm_start)
