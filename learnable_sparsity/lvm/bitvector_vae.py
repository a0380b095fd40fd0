r"""Bit-vector VAE: z ∈ {0,1}^D with a uniform prior p(z) = 2^{−D} (Correia et al. 2020, §5.3).

Encoder: x → hidden → t ∈ R^D (scores s_z = ⟨t, z⟩). Decoder: z → hidden → for each of the P
pixels an independent categorical over ``levels`` grey levels, its logits either a full linear
head or, with ``rank`` r, a rank-r factorisation logits_p = W a_p(z) + c with a_p ∈ R^r per pixel
and W ∈ R^{levels×r} shared (the authors' code uses r = 5, 256 levels).

Loss (negative ELBO) per example:

    E_{q(z|x)}[−log p(x|z)] + KL(q ‖ p),   KL(q ‖ p) = Σ_z q(z) log q(z) + D log 2 = D log 2 − H(q),

with the expectation from :func:`learnable_sparsity.lvm.methods.expected_loss`: exact over the
support for sparse q (top-k sparsemax, SparseMAP), so the KL is exact over the support too; for the
factorised Bernoulli q of the Monte Carlo methods H(q) = Σ_i H(σ(t_i)) is analytic.

The experiment (:func:`setup`, settings :class:`BitVectorVaeSettings`): one model per D in
``bits``, trained on batches of training images as grey levels; the test metric is
:func:`nll_bits_per_dim` on the first ``test_examples`` test images with fixed draws, with how
far that estimate still fell from a quarter of the samples to all of them (a sparse q's estimate
leans on prior samples outside its support, and converges far more slowly than a Bernoulli
q's; the report flags such NLLs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from learnable_sparsity.core.estimators import log_prob, sample
from learnable_sparsity.data.images import ImageSplits, quantize
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.lvm import mlp
from learnable_sparsity.lvm.methods import (
    METHODS,
    Method,
    bernoulli_entropy,
    build_method,
    expectation_metrics,
    expected_loss,
    support_entropy,
)
from learnable_sparsity.lvm.settings import LvmCell, LvmSettings
from learnable_sparsity.lvm.training import Setup, evaluation_generator, sample_batch
from learnable_sparsity.settings import setting

# Largest D whose 2^D codes exact_nll_bits_per_dim enumerates.
MAX_ENUMERATED_BITS = 16


class BitVectorVAE(nn.Module):
    """Encoder x → ``hidden`` → t [D]; decoder z → ``hidden`` → P categoricals over ``levels``."""

    def __init__(
        self,
        n_pixels: int,
        n_bits: int,
        levels: int = 256,
        hidden: int = 128,
        rank: int | None = None,
    ) -> None:
        super().__init__()
        if levels < 2 or (rank is not None and rank < 1):
            raise LearnableSparsityError(
                f"need levels >= 2 and rank None or >= 1, got levels={levels}, rank={rank}"
            )
        self.n_pixels, self.n_bits, self.levels = n_pixels, n_bits, levels
        self.encoder = mlp([n_pixels, hidden, n_bits])
        width = levels if rank is None else rank
        self.decoder = mlp([n_bits, hidden, n_pixels * width])
        self.level_map = None if rank is None else nn.Linear(rank, levels)

    def inputs(self, x: Tensor) -> Tensor:
        """Grey levels [B, P] (long, 0..levels−1) scaled to [0, 1] floats."""
        if x.dim() != 2 or x.shape[1] != self.n_pixels:
            raise LearnableSparsityError(
                f"x must be [batch, {self.n_pixels}], got {tuple(x.shape)}"
            )
        if x.dtype != torch.long or not bool(((x >= 0) & (x < self.levels)).all()):
            raise LearnableSparsityError(f"x must hold long grey levels in [0, {self.levels})")
        return x.float() / (self.levels - 1)

    def scores(self, x: Tensor) -> Tensor:
        """Encoder scores t [B, D] of q(z|x)."""
        return self.encoder(self.inputs(x))

    def log_likelihood(self, x: Tensor, z: Tensor) -> Tensor:
        """log p(x|z) = Σ_p log softmax(logits_p(z))[x_p], per row; x [N, P] long, z [N, D]."""
        out = self.decoder(z).unflatten(-1, (self.n_pixels, -1))
        logits = out if self.level_map is None else self.level_map(out)
        return logits.log_softmax(-1).gather(-1, x[..., None]).squeeze(-1).sum(-1)


def loss(
    model: BitVectorVAE,
    method: Method,
    x: Tensor,
    step: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, float]]:
    r"""Negative ELBO mean_b E_q[−log p(x|z)] + KL(q ‖ p) for grey levels x [B, P] (long).

    Metrics (batch means): ``loss`` (the estimate of −ELBO), ``distortion`` (E_q[−log p(x|z)]),
    ``rate`` (KL(q ‖ p)), ``decoder_calls``, ``entropy`` (and ``support`` for sparse q).
    """
    inputs = model.inputs(x)
    expectation = expected_loss(
        method,
        model.encoder(inputs),
        lambda example, z: -model.log_likelihood(x[example], z),
        step,
        features=inputs,
        generator=generator,
    )
    rate = model.n_bits * math.log(2) - expectation.entropy
    total = (expectation.estimate.surrogate + rate).mean()
    distortion = float(expectation.estimate.loss.detach().mean())
    metrics = {
        "loss": distortion + float(rate.detach().mean()),
        "distortion": distortion,
        "rate": float(rate.detach().mean()),
    }
    return total, metrics | expectation_metrics(method, expectation)


def _log_likelihood(model: BitVectorVAE, x: Tensor, z: Tensor, chunk_pairs: int) -> Tensor:
    """log p(x_b | z_{b,s}) [B, S] for codes z [B, S, D], ``chunk_pairs`` pairs decoded at once."""
    B, S, D = z.shape
    example = torch.arange(B, device=z.device).repeat_interleave(S)
    flat = z.reshape(B * S, D)
    parts = [
        model.log_likelihood(x[example[i : i + chunk_pairs]], flat[i : i + chunk_pairs])
        for i in range(0, B * S, chunk_pairs)
    ]
    return torch.cat(parts).reshape(B, S)


def _bits_per_dim(model: BitVectorVAE, log_px: Tensor) -> Tensor:
    return -log_px / (model.n_pixels * math.log(2))


def _log_mean_exp(values: Tensor) -> Tensor:
    return values.logsumexp(-1) - math.log(values.shape[-1])


def _first_quarter(values: Tensor) -> Tensor:
    """The first quarter (at least one) of the samples along the last dimension."""
    return values[..., : max(1, values.shape[-1] // 4)]


class NllEstimate(NamedTuple):
    """Importance-sampled −log₂ p(x)/P per example [B]: ``bits_per_dim`` from all N samples and
    ``quarter_samples`` from the first N/4 of the same draws. log of a mean of draws is biased
    low (Jensen), so the NLL estimate falls as samples are added until it has converged;
    ``quarter_samples − bits_per_dim`` well above 0 says N is still too small."""

    bits_per_dim: Tensor
    quarter_samples: Tensor


@torch.no_grad()
def nll_bits_per_dim(
    model: BitVectorVAE,
    method: Method,
    x: Tensor,
    n_samples: int = 1024,
    generator: torch.Generator | None = None,
    chunk_pairs: int = 4096,
) -> NllEstimate:
    r"""Estimate of −log₂ p(x) / P per example [B], P the number of pixels, p(x) = Σ_z p(z) p(x|z),
    from N and from N/4 of the samples (:class:`NllEstimate`).

    Factorised Bernoulli q (Monte Carlo methods): importance sampling with q as proposal,
    log p(x) ≈ log (1/N) Σ_n p(x|z_n) p(z_n) / q(z_n|x), z_n ∼ q (N = ``n_samples``).

    Sparse q with support S (top-k sparsemax, SparseMAP): the support is summed exactly and the
    rest estimated by rejection sampling from the prior (the prior restricted to z ∉ S):

        p(x) = Σ_{z∈S} 2^{−D} p(x|z) + (1 − |S|/2^D) · E_{z∼p(z), z∉S}[p(x|z)],

    the expectation averaged over N accepted prior samples (0 when S is all of {0,1}^D).
    """
    if n_samples < 1:
        raise LearnableSparsityError(f"n_samples must be >= 1, got {n_samples}")
    t = model.scores(x)
    B, D = t.shape
    log_prior = -D * math.log(2)
    if not method.sparse:
        t_rep = t.repeat_interleave(n_samples, 0)
        z = sample(t_rep, "bits", generator)
        log_q = log_prob(t_rep, z, "bits").reshape(B, n_samples)
        log_px_z = _log_likelihood(model, x, z.reshape(B, n_samples, D), chunk_pairs)
        weights = log_px_z + log_prior - log_q
        return NllEstimate(
            _bits_per_dim(model, _log_mean_exp(weights)),
            _bits_per_dim(model, _log_mean_exp(_first_quarter(weights))),
        )

    distribution = method.bit_distribution(t)
    configs, in_support = distribution.configs, distribution.probs > 0
    on_support = _log_likelihood(model, x, configs, chunk_pairs).masked_fill(~in_support, -math.inf)
    log_px = on_support.logsumexp(-1) + log_prior
    log_rest_mass = torch.log1p(-in_support.sum(-1).double() * 2.0**-D).to(t.dtype)
    has_rest = torch.isfinite(log_rest_mass)
    if not bool(has_rest.any()):
        exact = _bits_per_dim(model, log_px)
        return NllEstimate(exact, exact)

    def in_s(z: Tensor) -> Tensor:
        # z and a configuration agree on all D bits iff ⟨z, c⟩ + ⟨1−z, 1−c⟩ = D.
        agree = z @ configs.transpose(1, 2) + (1 - z) @ (1 - configs).transpose(1, 2)
        return ((agree == D) & in_support[:, None, :]).any(-1) & has_rest[:, None]

    z = torch.randint(2, (B, n_samples, D), generator=generator, device=t.device).to(t.dtype)
    while bool((rejected := in_s(z)).any()):
        redraw = torch.randint(2, (int(rejected.sum()), D), generator=generator, device=t.device)
        z[rejected] = redraw.to(t.dtype)
    log_px_z = _log_likelihood(model, x, z, chunk_pairs)

    def with_rest(log_mean: Tensor) -> Tensor:
        rest = (log_mean + log_rest_mass).masked_fill(~has_rest, -math.inf)
        return _bits_per_dim(model, torch.logaddexp(log_px, rest))

    return NllEstimate(
        with_rest(_log_mean_exp(log_px_z)), with_rest(_log_mean_exp(_first_quarter(log_px_z)))
    )


@torch.no_grad()
def posterior_kl(model: BitVectorVAE, method: Method, x: Tensor) -> Tensor:
    """KL(q(z|x) ‖ p(z)) = D log 2 − H(q) in nats per example [B]: the rate of the ELBO. Near 0
    the code carries no information about x (posterior collapse: the decoder ignores z)."""
    t = model.scores(x)
    if method.sparse:
        entropy = support_entropy(method.bit_distribution(t).probs)
    else:
        entropy = bernoulli_entropy(t)
    return model.n_bits * math.log(2) - entropy


@torch.no_grad()
def exact_nll_bits_per_dim(model: BitVectorVAE, x: Tensor, chunk_pairs: int = 4096) -> Tensor:
    """−log₂ p(x) / P per example [B] with p(x) = 2^{−D} Σ_z p(x|z) summed over all 2^D codes
    (D ≤ 16)."""
    D = model.n_bits
    if D > MAX_ENUMERATED_BITS:
        raise LearnableSparsityError(
            f"exact NLL enumerates 2^D codes: n_bits={D} exceeds {MAX_ENUMERATED_BITS}"
        )
    model.inputs(x)
    codes = (torch.arange(2**D, device=x.device)[:, None] >> torch.arange(D, device=x.device)) & 1
    z = codes.float().expand(x.shape[0], -1, -1)
    log_px = _log_likelihood(model, x, z, chunk_pairs).logsumexp(-1) - D * math.log(2)
    return _bits_per_dim(model, log_px)


@dataclass(frozen=True, kw_only=True)
class BitVectorVaeSettings(LvmSettings):
    """Params ``lvm.bitvector_vae``: the shared keys (:class:`LvmSettings`) and the model.

    ``bits``: the values of D, a third grid axis; ``topk``: k of top-k sparsemax; ``hidden``
    width and decoder ``rank`` (None: a full linear head) of :class:`BitVectorVAE`;
    ``importance_samples`` N and ``test_examples`` (the first ones of the test set) of the
    test NLL.
    """

    KNOWN_METHODS: ClassVar[tuple[str, ...]] = METHODS["bits"]
    HEADLINE: ClassVar[tuple[str, str]] = ("nll_bits_per_dim", "test NLL (bits/dim)")
    GRID: ClassVar[tuple[str, ...]] = ("bits", "methods", "seeds")

    bits: tuple[int, ...] = setting(at_least=1, distinct=True)
    topk: int = setting(at_least=1)
    hidden: int = setting(at_least=1)
    rank: int | None = setting(at_least=1)
    importance_samples: int = setting(at_least=1)
    test_examples: int = setting(at_least=1)

    def cells(self) -> list[LvmCell]:
        """The grid: bits × methods × seeds in params order (one D's methods together)."""
        per_d = super().cells()
        return [LvmCell(c.method, c.seed, d) for d in self.bits for c in per_d]


def setup(
    settings: BitVectorVaeSettings, data: ImageSplits, cell: LvmCell, generator: torch.Generator
) -> Setup:
    """The bit-vector VAE of ``cell`` (D = ``cell.bits``) on the grey levels of ``data``."""
    if cell.bits is None:
        raise LearnableSparsityError(f"a bit-vector VAE cell needs bits (D), got {cell}")
    if settings.test_examples > len(data.test):
        raise LearnableSparsityError(
            f"test_examples={settings.test_examples} exceeds the {len(data.test)} test images "
            f"of {settings.data!r}"
        )
    device = generator.device
    train = quantize(data.train.images, data.levels).to(device)
    test = quantize(data.test.images[: settings.test_examples], data.levels).to(device)
    model = BitVectorVAE(data.pixels, cell.bits, data.levels, settings.hidden, settings.rank)
    method = build_method(
        cell.method,
        "bits",
        k=settings.topk,
        gumbel_rate=settings.gumbel_rate,
        nvil_features=data.pixels,
    )

    def step_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        x = train[sample_batch(len(train), settings.batch_size, generator)]
        return loss(model, method, x, step, generator)

    def evaluate() -> dict[str, float]:
        nll = nll_bits_per_dim(
            model, method, test, settings.importance_samples, evaluation_generator(device)
        )
        return {
            "nll_bits_per_dim": float(nll.bits_per_dim.mean()),
            # how far the estimate fell from N/4 to N samples: > 0 when N is still too small
            "nll_estimate_drift": float((nll.quarter_samples - nll.bits_per_dim).mean()),
            "kl_nats": float(posterior_kl(model, method, test).mean()),
            "latent_dim": cell.bits,
        }

    return Setup(model, method, step_fn, evaluate)
