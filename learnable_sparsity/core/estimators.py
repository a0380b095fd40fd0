r"""Sampling estimators of ∇ E_{z∼π(z|x)} ℓ(x, z): the baselines of sparse marginalization.

Same interface as ``learnable_sparsity.core.marginalize``: each estimator takes the scores of π for
a batch, a ``loss_fn(example [N], z [N, dim]) -> [N]`` and returns an
:class:`~learnable_sparsity.core.marginalize.Estimate` (surrogate, loss, decoder_calls) per example.

``latent`` selects the family of π:

* ``"categorical"``: scores [B, K], π = softmax(scores), z passed to ``loss_fn`` as a one-hot row;
* ``"bits"``: scores t [B, D], π(z) = Π_i σ(t_i)^{z_i} (1 − σ(t_i))^{1−z_i}, z ∈ {0,1}^D.

Estimators (SFE = score-function estimator, REINFORCE):

* :func:`sfe` — ℓ(z) + sg[ℓ(z) − b] log π(z) with a running-mean baseline b (Williams 1992).
* :func:`sfe_plus` — the baseline is the loss of an independent second sample z′ ∼ π, detached
  (the released code did not detach it, which biases the gradient).
* :func:`nvil` — a learned, input-dependent baseline b(x) trained by (ℓ − b(x))² (Mnih & Gregor
  2014); :class:`NVILBaseline` is the authors' MLP.
* :func:`gumbel` — Gumbel-Softmax / binary Concrete relaxation (Jang et al. 2017; Maddison et al.
  2017); straight-through: hard sample forward, relaxed gradient backward. Temperature schedule
  :class:`GumbelTemperature`: τ = max(τ_min, exp(−r·t)), updated every N steps.
* :func:`sum_and_sample` — exact term for the most probable class plus one SFE sample from the
  rest (Liu et al. 2019); categorical.
* :func:`unordered_set` — k samples without replacement (Gumbel-top-k) and the unordered set
  estimator with its built-in baseline (Kool et al. 2020); categorical.

``sg[·]`` is stop-gradient (``detach``). All sampling takes an optional ``torch.Generator``.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

from learnable_sparsity.core.marginalize import Estimate, LossFn

LATENTS = ("categorical", "bits")


def _check_latent(latent: str, scores: Tensor) -> None:
    if latent not in LATENTS:
        raise ValueError(f"unknown latent {latent!r}; choose one of {LATENTS}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [batch, K or D], got shape {tuple(scores.shape)}")


def _uniform(shape: torch.Size, like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U(0, 1) draws in float32 or ``like``'s wider dtype, never in bf16 (autocast's scores):
    256 levels would make Gumbel noise coarse, and torch's bf16 samplers draw other numbers
    from the same generator than its float32 ones, in some versions."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    u = torch.rand(shape, dtype=dtype, device=like.device, generator=generator)
    return u.clamp(torch.finfo(dtype).tiny, 1 - torch.finfo(dtype).eps)


def _gumbel_noise(like: Tensor, generator: torch.Generator | None) -> Tensor:
    return -torch.log(-torch.log(_uniform(like.shape, like, generator)))


def sample(scores: Tensor, latent: str, generator: torch.Generator | None = None) -> Tensor:
    """One z ∼ π per example: a one-hot row [B, K] or a bit vector [B, D] (float, no grad)."""
    _check_latent(latent, scores)
    with torch.no_grad():
        if latent == "bits":
            return (_uniform(scores.shape, scores, generator) < torch.sigmoid(scores)).to(
                scores.dtype
            )
        index = (scores + _gumbel_noise(scores, generator)).argmax(-1)
        return nn.functional.one_hot(index, scores.shape[-1]).to(scores.dtype)


def log_prob(scores: Tensor, z: Tensor, latent: str) -> Tensor:
    """log π(z | x) per example, differentiable in the scores."""
    _check_latent(latent, scores)
    if latent == "bits":
        # log σ(t) if z = 1 else log σ(−t)
        return -nn.functional.binary_cross_entropy_with_logits(scores, z, reduction="none").sum(-1)
    return (torch.log_softmax(scores, -1) * z).sum(-1)


def _evaluate(loss_fn: LossFn, z: Tensor) -> Tensor:
    example = torch.arange(z.shape[0], device=z.device)
    losses = loss_fn(example, z)
    if losses.shape != example.shape:
        raise ValueError(
            f"loss_fn must return one loss per example: expected shape {tuple(example.shape)}, "
            f"got {tuple(losses.shape)}"
        )
    return losses


def _calls(scores: Tensor, n: int) -> Tensor:
    return torch.full((scores.shape[0],), n, dtype=torch.long, device=scores.device)


class MovingAverageBaseline:
    """Running mean of all losses seen so far (the EGG / authors' SFE baseline)."""

    def __init__(self) -> None:
        self.mean = 0.0
        self.count = 0

    def update(self, losses: Tensor) -> None:
        """Fold a batch of losses into the mean."""
        n = losses.numel()
        self.count += n
        self.mean += (float(losses.detach().sum()) - n * self.mean) / self.count


def sfe(
    scores: Tensor,
    loss_fn: LossFn,
    latent: str,
    baseline: MovingAverageBaseline | None = None,
    generator: torch.Generator | None = None,
) -> Estimate:
    r"""Score-function estimator: surrogate ℓ(z) + sg[ℓ(z) − b] log π(z), z ∼ π; one call.

    ``b`` is the running mean of earlier batches' losses (0 without a baseline); it is updated
    with this batch's losses after use, so it never depends on the current sample.
    """
    z = sample(scores, latent, generator)
    losses = _evaluate(loss_fn, z)
    b = baseline.mean if baseline is not None else 0.0
    surrogate = losses + (losses.detach() - b) * log_prob(scores, z, latent)
    if baseline is not None:
        baseline.update(losses)
    return Estimate(surrogate, losses.detach(), _calls(scores, 1))


def sfe_plus(
    scores: Tensor, loss_fn: LossFn, latent: str, generator: torch.Generator | None = None
) -> Estimate:
    r"""SFE with a self-critic baseline: ℓ(z) + sg[ℓ(z) − ℓ(z′)] log π(z), z, z′ ∼ π independent.

    The baseline ℓ(z′) is independent of z, so the estimator is unbiased; two calls.
    """
    z = sample(scores, latent, generator)
    z_prime = sample(scores, latent, generator)
    losses = _evaluate(loss_fn, z)
    with torch.no_grad():
        critic = _evaluate(loss_fn, z_prime)
    surrogate = losses + (losses.detach() - critic) * log_prob(scores, z, latent)
    return Estimate(surrogate, losses.detach(), _calls(scores, 2))


class NVILBaseline(nn.Module):
    """The learned NVIL baseline b(x): input → 512 → 512 → 512 → 1 with ReLU (authors' sizes)."""

    def __init__(self, in_features: int, hidden: int = 512, layers: int = 3) -> None:
        super().__init__()
        sizes = [in_features] + [hidden] * layers
        blocks: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            blocks += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*blocks, nn.Linear(sizes[-1], 1))

    def forward(self, x: Tensor) -> Tensor:
        """b(x), [B]."""
        return self.net(x).squeeze(-1)


def nvil(
    scores: Tensor,
    loss_fn: LossFn,
    latent: str,
    baseline: Tensor,
    generator: torch.Generator | None = None,
) -> Estimate:
    r"""NVIL: ℓ(z) + sg[ℓ(z) − b(x)] log π(z) + (sg[ℓ(z)] − b(x))², z ∼ π; one call.

    ``baseline`` [B] is b(x) from a network (e.g. :class:`NVILBaseline`) whose parameters the
    squared-error term trains; no variance normalisation (as in the authors' code).
    """
    if baseline.shape != scores.shape[:1]:
        raise ValueError(f"baseline must be [batch]={scores.shape[0]}, got {tuple(baseline.shape)}")
    z = sample(scores, latent, generator)
    losses = _evaluate(loss_fn, z)
    advantage = losses.detach() - baseline.detach()
    surrogate = losses + advantage * log_prob(scores, z, latent)
    surrogate = surrogate + (losses.detach() - baseline) ** 2
    return Estimate(surrogate, losses.detach(), _calls(scores, 1))


class _StraightThrough(torch.autograd.Function):
    """Forward: the hard sample, exactly. Backward: the gradient goes to the relaxed sample.

    Not decorated by ``core.amp``: it does no arithmetic, so autocast cannot change it.
    """

    @staticmethod
    def forward(ctx, hard: Tensor, relaxed: Tensor) -> Tensor:
        return hard.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:
        return None, grad


class GumbelTemperature:
    r"""τ(t) = max(τ_min, exp(−r · t₀)) with t₀ = t rounded down to a multiple of ``update_every``.

    The thesis prints max(0.5, −r·t), a typo for the authors' code: τ starts at 1 and is updated
    every 1000 steps (r ∈ {1e-5, 1e-4}, τ_min = 0.5).
    """

    def __init__(self, rate: float, update_every: int = 1000, minimum: float = 0.5) -> None:
        if rate < 0 or update_every < 1 or minimum <= 0:
            raise ValueError(
                f"need rate >= 0, update_every >= 1, minimum > 0; got rate={rate}, "
                f"update_every={update_every}, minimum={minimum}"
            )
        self.rate, self.update_every, self.minimum = rate, update_every, minimum

    def __call__(self, step: int) -> float:
        """Temperature at global training step ``step``."""
        last_update = step - step % self.update_every
        return max(self.minimum, math.exp(-self.rate * last_update))


def gumbel(
    scores: Tensor,
    loss_fn: LossFn,
    latent: str,
    temperature: float,
    straight_through: bool = False,
    generator: torch.Generator | None = None,
) -> Estimate:
    r"""Gumbel-Softmax (categorical) / binary Concrete (bits) relaxation; one call; biased.

    Categorical: z̃ = softmax((s + g)/τ), g ∼ Gumbel(0, 1). Bits: z̃_i = σ((t_i + l_i)/τ),
    l ∼ Logistic(0, 1). ``loss_fn`` sees z̃; with ``straight_through`` it sees the hard sample
    (one_hot(argmax) / [t + l > 0], an exact sample of π) whose gradient is z̃'s.
    """
    _check_latent(latent, scores)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if latent == "bits":
        u = _uniform(scores.shape, scores, generator)
        perturbed = scores + torch.log(u) - torch.log1p(-u)
        relaxed = torch.sigmoid(perturbed / temperature)
        hard = (perturbed > 0).to(scores.dtype)
    else:
        perturbed = scores + _gumbel_noise(scores, generator)
        relaxed = torch.softmax(perturbed / temperature, -1)
        hard = nn.functional.one_hot(perturbed.argmax(-1), scores.shape[-1]).to(scores.dtype)
    z = _StraightThrough.apply(hard, relaxed) if straight_through else relaxed
    losses = _evaluate(loss_fn, z)
    return Estimate(losses, losses.detach(), _calls(scores, 1))


def sum_and_sample(
    scores: Tensor, loss_fn: LossFn, generator: torch.Generator | None = None
) -> Estimate:
    r"""Sum&Sample (Liu et al. 2019), categorical: E = π(c) ℓ(c) + (1 − π(c)) E_{z∼q} ℓ(z).

    c is the most probable class and q = π restricted to the other classes. The first term is
    exact, the second is estimated with one sample z ∼ q and SFE:
    surrogate = π(c) ℓ(c) + (1 − π(c)) ℓ(z) + sg[(1 − π(c)) ℓ(z)] log q(z). Unbiased; two calls.
    """
    _check_latent("categorical", scores)
    B, K = scores.shape
    if K < 2:
        raise ValueError(f"sum_and_sample needs at least 2 classes, got K={K}")
    probs = torch.softmax(scores, -1)
    top = scores.argmax(-1)
    top_hot = nn.functional.one_hot(top, K).to(scores.dtype)
    rest_scores = scores.masked_fill(top_hot.bool(), float("-inf"))
    z = sample(rest_scores, "categorical", generator)
    example = torch.arange(B, device=scores.device)
    losses = loss_fn(torch.cat([example, example]), torch.cat([top_hot, z]))
    top_loss, sampled_loss = losses[:B], losses[B:]
    p_top = probs.gather(1, top[:, None]).squeeze(1)
    log_q = (torch.log_softmax(rest_scores, -1).masked_fill(top_hot.bool(), 0.0) * z).sum(-1)
    rest_loss = (1 - p_top) * sampled_loss
    surrogate = p_top * top_loss + rest_loss + rest_loss.detach() * log_q
    value = (p_top * top_loss + rest_loss).detach()
    return Estimate(surrogate, value, _calls(scores, 2))


# Unordered-set probabilities enumerate orderings: (k choose 2)·(k−2)! + k·(k−1)! + k! terms.
MAX_UNORDERED_SET_SIZE = 6


def _log_unordered_set_prob(members: Tensor, outside: Tensor) -> Tensor:
    r"""log P(the set of the m sampled items is ``members``) when sampling without replacement.

    ``members`` [..., m] are the items' probabilities; ``outside`` [...] is the mass of the
    domain's other items. P = Σ_{orderings o} Π_i p_{o_i} / (outside + Σ_{j ≥ i} p_{o_j}), the
    denominator being the mass left before the i-th draw (summed from what remains, not as
    1 − Σ drawn, which cancels catastrophically when few items hold all the mass).
    """
    m = members.shape[-1]
    if m == 0:
        return torch.zeros_like(outside)
    orders = torch.tensor(list(itertools.permutations(range(m))), device=members.device)
    drawn = members[..., orders]  # [..., m!, m]
    remaining = drawn.flip(-1).cumsum(-1).flip(-1) + outside[..., None, None]
    return (drawn.log() - remaining.log()).sum(-1).logsumexp(-1)


def unordered_set(
    scores: Tensor, loss_fn: LossFn, k: int, generator: torch.Generator | None = None
) -> Estimate:
    r"""The unordered set estimator with baseline (Kool et al. 2020), categorical; k calls.

    S = k classes sampled without replacement (the top k of log π + Gumbel noise). With P(S) the
    probability of the unordered set and P^{D∖s} probabilities in the domain without s,

        R(S, s) = P^{D∖s}(S ∖ {s}) / P(S),    E[ℓ] ≈ Σ_{s∈S} π(s) R(S, s) ℓ(s)   (unbiased)

        ∇ ≈ Σ_{s∈S} ∇π(s) R(S, s) (ℓ(s) − B_s),
        B_s = π(s) ℓ(s) + Σ_{s′∈S∖s} π(s′) P^{D∖{s,s′}}(S ∖ {s,s′}) / P^{D∖s}(S ∖ {s}) ℓ(s′),

    B_s being the same estimator for the set conditioned on s ∈ S (hence an unbiased baseline).
    Probabilities of unordered sets are sums over orderings, so k ≤ ``MAX_UNORDERED_SET_SIZE``.
    """
    _check_latent("categorical", scores)
    B, K = scores.shape
    # k = 1 leaves B_s without the other samples it needs to be unbiased: that is plain SFE.
    if (
        isinstance(k, bool)
        or not isinstance(k, int)
        or not 2 <= k <= min(K, MAX_UNORDERED_SET_SIZE)
    ):
        raise ValueError(
            f"k must be an integer in [2, min(K={K}, {MAX_UNORDERED_SET_SIZE})]; got {k!r}"
        )
    log_probs = torch.log_softmax(scores, -1)
    with torch.no_grad():
        chosen = (log_probs + _gumbel_noise(scores, generator)).topk(k, -1).indices  # [B, k]
    chosen_hot = nn.functional.one_hot(chosen, K).to(scores.dtype)  # [B, k, K]
    example = torch.arange(B, device=scores.device).repeat_interleave(k)
    losses = loss_fn(example, chosen_hot.reshape(B * k, K)).reshape(B, k)

    with torch.no_grad():
        p64 = log_probs.detach().double().exp()
        p_set = p64.gather(1, chosen)  # [B, k]
        outside = p64.sum(-1) - p_set.sum(-1)  # mass of the classes not sampled
        others = [[j for j in range(k) if j != i] for i in range(k)]
        log_p_set = _log_unordered_set_prob(p_set, outside)
        # log P^{D∖s}(S∖s): members S∖s, same outside mass (s is removed from the domain).
        log_p_without = torch.stack(
            [_log_unordered_set_prob(p_set[:, others[i]], outside) for i in range(k)], -1
        )
        weight = p_set * (log_p_without - log_p_set[:, None]).exp()  # π(s) R(S, s)
        l64 = losses.detach().double()
        baseline = p_set * l64
        for i, j in itertools.permutations(range(k), 2):
            pair_rest = [m for m in range(k) if m not in (i, j)]
            log_p_pair = _log_unordered_set_prob(p_set[:, pair_rest], outside)
            ratio = (log_p_pair - log_p_without[:, i]).exp()
            baseline[:, i] += p_set[:, j] * ratio * l64[:, j]
        advantage = (weight * (l64 - baseline)).to(scores.dtype)
        weight = weight.to(scores.dtype)

    chosen_log_probs = log_probs.gather(1, chosen)
    surrogate = (weight * losses).sum(-1) + (advantage * chosen_log_probs).sum(-1)
    return Estimate(surrogate, (weight * losses.detach()).sum(-1), _calls(scores, k))
