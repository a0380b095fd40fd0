r"""Exact expectations over discrete latent variables, evaluated only where π(z|x) > 0.

Training a model with a discrete latent z means minimising E_{z∼π(z|x)} ℓ(x, z). Sampling
estimators (``learnable_sparsity.core.estimators``) approximate its gradient; *marginalization*
computes

    E_π[ℓ] = Σ_z π(z|x) ℓ(x, z)

exactly. With softmax every z has π > 0, so all |Z| values of ℓ are needed (dense). With a sparse
π (sparsemax, 1.5-entmax, top-k sparsemax, SparseMAP) only the support counts, so ℓ is evaluated
on the (example, z) pairs with π(z|x) > 0 — gathered per example, not the union over the batch —
and the gradient reaches the scores through the mapping's Jacobian (Correia et al. 2020,
"Efficient Marginalization of Discrete and Structured Latent Variables via Sparsity").

The interface shared with the estimators:

* ``loss_fn(example, z) -> [N]`` evaluates the downstream loss on N (example, z) pairs:
  ``example`` [N] indexes the batch, ``z`` [N, dim] is the latent code — a one-hot row for a
  categorical z (relaxed for Gumbel estimators), a {0, 1} vector for a bit vector.
* Every method returns an :class:`Estimate`: a per-example ``surrogate`` whose gradient is the
  exact gradient (here) or the estimator's, the per-example ``loss`` value for logging, and the
  ``decoder_calls`` per example (the number of ℓ evaluations).

Structured z ∈ {0,1}^D scored by s_z = ⟨t, z⟩: :func:`topk_sparsemax` (here) and
``learnable_sparsity.core.sparsemap.sparsemap`` return a :class:`BitVectorDistribution` — a few
configurations with their probabilities — and :func:`marginalize_bits` takes the expectation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from learnable_sparsity.core.normalizers import entmax, entmax15, softmax, sparsemax

# loss_fn(example [N] long, z [N, dim] float) -> per-pair loss [N]
LossFn = Callable[[Tensor, Tensor], Tensor]

MAPPINGS: dict[str, Callable[[Tensor], Tensor]] = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
}


class Estimate(NamedTuple):
    """Result of a marginalization or an estimator, per example of the batch.

    ``surrogate`` [B]: backpropagate ``surrogate.mean()``; its gradient is the exact gradient of
    E_π[ℓ] (marginalization) or the estimator's. ``loss`` [B]: the value of E_π[ℓ] or its
    estimate, for logging. ``decoder_calls`` [B]: ℓ evaluations made for each example.
    """

    surrogate: Tensor
    loss: Tensor
    decoder_calls: Tensor


@dataclass(frozen=True)
class BitVectorDistribution:
    r"""A sparse distribution over bit vectors z ∈ {0,1}^D, S configuration slots per example.

    ``configs`` [B, S, D] holds {0, 1} floats, ``probs`` [B, S] their probabilities (0 on slots
    outside the support; differentiable in the scores t). ``certified`` (top-k sparsemax): True
    where the result provably equals sparsemax over all 2^D configurations; a sufficient
    condition only (see :func:`topk_sparsemax`). ``iterations`` (SparseMAP): active-set
    iterations per example.
    ``projection`` (SparseMAP): μ as an output of SparseMAP itself, whose backward is the Jacobian
    of the projection onto the marginal polytope even where the support does not span the face
    containing μ (ties); ``marginals`` returns it.
    """

    configs: Tensor
    probs: Tensor
    certified: Tensor | None = None
    iterations: Tensor | None = None
    projection: Tensor | None = None

    @property
    def marginals(self) -> Tensor:
        """μ = Σ_z p(z) z, [B, D]: the probability of each bit being on (``projection`` if set)."""
        if self.projection is not None:
            return self.projection
        return torch.einsum("bs,bsd->bd", self.probs, self.configs)

    @property
    def support_size(self) -> Tensor:
        """Number of configurations with p(z) > 0 per example, [B]."""
        return (self.probs > 0).sum(-1)


def _expectation(probs: Tensor, codes: Tensor, loss_fn: LossFn, dense: bool) -> Estimate:
    """Σ_s probs[b, s] ℓ(b, codes[b, s]) over the slots with probs > 0 (all slots if dense).

    A row with NaN probabilities (from a NaN score) has no slot with probs > 0; its expectation
    is NaN, in value and gradient, not the empty sum 0.
    """
    B = probs.shape[0]
    evaluated = torch.ones_like(probs, dtype=torch.bool) if dense else probs > 0
    example, slot = evaluated.nonzero(as_tuple=True)
    losses = loss_fn(example, codes[example, slot])
    if losses.shape != example.shape:
        raise ValueError(
            f"loss_fn must return one loss per (example, z) pair: expected shape "
            f"{tuple(example.shape)}, got {tuple(losses.shape)}"
        )
    weighted = probs[example, slot] * losses
    expected = weighted.new_zeros(B).index_add(0, example, weighted)
    nan_rows = probs.isnan().any(-1)
    if bool(nan_rows.any()):  # Σ probs is NaN there, and its gradient reaches the scores
        expected = expected + torch.where(nan_rows, probs.sum(-1), 0.0)
    return Estimate(expected, expected, evaluated.sum(-1))


def marginalize(scores: Tensor, loss_fn: LossFn, mapping: str = "sparsemax") -> Estimate:
    r"""E_{z∼π}[ℓ(x, z)] exactly, for a categorical z with π = mapping(scores), scores [B, K].

    ``mapping``: ``softmax`` (dense: all K values of ℓ), ``sparsemax`` or ``entmax15`` (ℓ only on
    each example's support). ``loss_fn`` receives z as one-hot rows [N, K]. The gradient is exact:
    Σ_z ∇π(z) ℓ(z) + π(z) ∇ℓ(z).
    """
    if mapping not in MAPPINGS:
        raise ValueError(f"unknown mapping {mapping!r}; choose one of {sorted(MAPPINGS)}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [batch, K], got shape {tuple(scores.shape)}")
    probs = MAPPINGS[mapping](scores)
    one_hot = torch.eye(scores.shape[-1], dtype=scores.dtype, device=scores.device)
    codes = one_hot.expand(scores.shape[0], -1, -1)
    return _expectation(probs, codes, loss_fn, dense=mapping == "softmax")


def marginalize_bits(distribution: BitVectorDistribution, loss_fn: LossFn) -> Estimate:
    """E_{z∼p}[ℓ(x, z)] exactly for a sparse distribution over bit vectors (ℓ on its support)."""
    return _expectation(distribution.probs, distribution.configs, loss_fn, dense=False)


# --------------------------------------------------------------------------- top-k sparsemax


@torch.no_grad()
def k_best_bit_vectors(t: Tensor, k: int) -> tuple[Tensor, Tensor]:
    r"""The k highest-scoring z ∈ {0,1}^D under s_z = ⟨t, z⟩, best first; t [B, D].

    The best z has z_i = [t_i > 0]; any other z flips a set F of its bits at cost Σ_{i∈F} |t_i|,
    so the k best are the k cheapest flip sets. Bits are merged in order of increasing cost,
    keeping the k cheapest sets after each bit: O(kD) work, batched. The merge stops as soon as
    the next bit costs at least the current k-th cheapest set (no later set can enter).

    Returns ``configs`` [B, k, D] ({0,1} floats) and ``valid`` [B, k] (False on slots beyond
    2^D when 2^D < k; those repeat the best configuration and get probability 0 downstream).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    B, D = t.shape
    cost, order = t.abs().sort(dim=-1)
    set_cost = t.new_full((B, k), float("inf"))
    set_cost[:, 0] = 0.0
    flips = torch.zeros(B, k, D, dtype=torch.bool, device=t.device)  # in `order` coordinates
    for i in range(D):
        if bool((cost[:, i] >= set_cost[:, -1]).all()):
            break
        with_bit = flips.clone()
        with_bit[:, :, i] = True
        candidate_cost = torch.cat([set_cost, set_cost + cost[:, i : i + 1]], dim=1)
        set_cost, pick = candidate_cost.topk(k, dim=1, largest=False, sorted=True)
        flips = torch.cat([flips, with_bit], dim=1).gather(1, pick[..., None].expand(-1, -1, D))
    flipped = torch.zeros_like(flips).scatter_(2, order[:, None, :].expand(-1, k, -1), flips)
    configs = (t > 0)[:, None, :] ^ flipped
    return configs.to(t.dtype), torch.isfinite(set_cost)


def topk_sparsemax(t: Tensor, k: int) -> BitVectorDistribution:
    r"""Top-k sparsemax over bit vectors (Correia et al. 2020, §5): sparsemax restricted to the k
    best configurations of z ∈ {0,1}^D under s_z = ⟨t, z⟩; t [B, D].

    The k best are found exactly (:func:`k_best_bit_vectors`); their scores ⟨t, z⟩ keep the
    graph to t, so gradients flow through the sparsemax Jacobian (the top-k selection itself is
    piecewise constant).

    ``certified`` is True exactly where fewer than k configurations get probability, which holds
    iff the sparsemax over all 2^D configurations has fewer than k in its support; the result
    then equals that sparsemax (the k-th best has p = 0, so every configuration outside the k
    best, scoring no more, would get 0 too). It is sufficient, not necessary, for exactness: the
    result also equals the full sparsemax when that has exactly k configurations in its support
    (the (k+1)-th best score is at most the threshold τ), a case the flag does not detect. False
    means "not certified", not "inexact". Rows with a NaN score (NaN probabilities) are never
    certified.
    """
    if t.dim() != 2:
        raise ValueError(f"scores t must be [batch, D], got shape {tuple(t.shape)}")
    configs, valid = k_best_bit_vectors(t.detach(), k)
    scores = torch.einsum("bkd,bd->bk", configs, t)
    probs = sparsemax(scores, mask=valid)
    certified = (((probs > 0).sum(-1) < k) & ~probs.isnan().any(-1)).detach()
    return BitVectorDistribution(configs, probs, certified=certified)


# --------------------------------------------------------------------------- Fenchel–Young losses


def fenchel_young_loss(scores: Tensor, target: Tensor, alpha: float) -> Tensor:
    r"""The Fenchel–Young loss of α-entmax (Blondel et al. 2020), per example; scores [B, K].

    L_α(s; y) = ⟨p − y, s⟩ + H^T_α(p) − H^T_α(y) with p = entmax_α(s) and the Tsallis entropy
    H^T_α(p) = (1 − Σ p^α)/(α(α−1)) (Shannon at α = 1, where L is the cross-entropy). It is
    ≥ 0, zero iff p = y, and ∇_s L = p − y exactly. ``target``: class indices [B] or a
    distribution [B, K].
    """
    if alpha < 1:
        raise ValueError(f"alpha must be >= 1, got {alpha}")
    if target.dtype in (torch.long, torch.int32, torch.int64):
        target = torch.nn.functional.one_hot(target, scores.shape[-1]).to(scores.dtype)
    if target.shape != scores.shape:
        raise ValueError(
            f"target must be class indices [B] or a distribution of shape {tuple(scores.shape)}, "
            f"got {tuple(target.shape)}"
        )
    # p is detached: by Danskin's theorem the gradient of the max is p − y with p held fixed.
    p = entmax(scores, alpha).detach()
    return (
        ((p - target) * scores).sum(-1)
        + _tsallis_entropy(p, alpha)
        - _tsallis_entropy(target, alpha)
    )


def _tsallis_entropy(p: Tensor, alpha: float) -> Tensor:
    if alpha == 1:
        return -torch.special.xlogy(p, p).sum(-1)
    return (1 - p.pow(alpha).sum(-1)) / (alpha * (alpha - 1))


def sparsemax_loss(scores: Tensor, target: Tensor) -> Tensor:
    """Sparsemax loss (Martins & Astudillo 2016): the Fenchel–Young loss with α = 2."""
    return fenchel_young_loss(scores, target, 2.0)


def entmax15_loss(scores: Tensor, target: Tensor) -> Tensor:
    """1.5-entmax loss (Peters et al. 2019): the Fenchel–Young loss with α = 1.5."""
    return fenchel_young_loss(scores, target, 1.5)
