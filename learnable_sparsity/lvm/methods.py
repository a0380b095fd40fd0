r"""One dispatcher from a method name to the core estimator or marginalization of E_π[ℓ].

Every experiment minimises E_{z∼π(z|x)} ℓ(x, z) (+ a term in the entropy H(π)). A
:class:`Method` names how the expectation and its gradient are obtained, and holds what that
method keeps across steps (the running-mean SFE baseline, the NVIL baseline network, the Gumbel
temperature schedule). :func:`expected_loss` evaluates it on a batch of scores.

Categorical z (scores s ∈ R^K):

* ``dense`` — Σ_z softmax(s)_z ℓ(z), all K calls; ``sparsemax`` — Σ_{z: π_z > 0} π_z ℓ(z) with
  π = sparsemax(s), one call per support element (the proposed method);
* ``sfe``, ``sfe_plus``, ``nvil``, ``gumbel``, ``st_gumbel``, ``sum_and_sample``,
  ``unordered_set`` — sampling estimators with π = softmax(s).

Bit vectors z ∈ {0,1}^D (scores t ∈ R^D, s_z = ⟨t, z⟩):

* ``topk_sparsemax`` — sparsemax over the k best configurations; ``sparsemap`` — SparseMAP with
  the independent-bits oracle; ``sparsemap_budget`` — SparseMAP with Σz ≤ B (B = D/2 unless
  given); each is an exact sum over its support;
* ``sfe``, ``sfe_plus``, ``nvil``, ``gumbel``, ``st_gumbel`` — sampling estimators with the
  factorised Bernoulli π(z) = Π_i σ(t_i)^{z_i} σ(−t_i)^{1−z_i}.

The entropy returned with each estimate is that of the π the method defines: sparsemax / sparse
bit-vector distributions over their support, softmax or factorised Bernoulli otherwise (for the
Gumbel methods this is the discrete distribution, as in Jang et al. 2017).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from learnable_sparsity.core import estimators
from learnable_sparsity.core.estimators import (
    GumbelTemperature,
    MovingAverageBaseline,
    NVILBaseline,
)
from learnable_sparsity.core.marginalize import (
    MAPPINGS,
    BitVectorDistribution,
    Estimate,
    LossFn,
    marginalize,
    marginalize_bits,
    topk_sparsemax,
)
from learnable_sparsity.core.sparsemap import bernoulli_map, budget_map, sparsemap
from learnable_sparsity.errors import LearnableSparsityError

METHODS: dict[str, tuple[str, ...]] = {
    "categorical": (
        "dense",
        "sparsemax",
        "sfe",
        "sfe_plus",
        "nvil",
        "gumbel",
        "st_gumbel",
        "sum_and_sample",
        "unordered_set",
    ),
    "bits": (
        "topk_sparsemax",
        "sparsemap",
        "sparsemap_budget",
        "sfe",
        "sfe_plus",
        "nvil",
        "gumbel",
        "st_gumbel",
    ),
}
SPARSE_METHODS = frozenset({"sparsemax", "topk_sparsemax", "sparsemap", "sparsemap_budget"})
SCORE_FUNCTION_METHODS = frozenset({"sfe", "sfe_plus", "nvil"})
# Default k: configurations kept by top-k sparsemax (the paper's 10); samples of the unordered set.
DEFAULT_K = {"topk_sparsemax": 10, "unordered_set": 4}


class Expectation(NamedTuple):
    """``estimate``: the core :class:`Estimate` of E_π[ℓ] per example; ``entropy`` [B]: H(π),
    differentiable in the scores."""

    estimate: Estimate
    entropy: Tensor


@dataclass
class Method:
    """A way of computing E_π[ℓ], with the state it keeps across training steps.

    Build it with :func:`build_method`. ``k``: top-k sparsemax configurations / unordered-set
    samples; ``budget``: the SparseMAP budget B (None: D // 2); ``max_iter``: the SparseMAP
    active-set cap. Exactly the state the method needs is set: ``moving_average`` (sfe),
    ``nvil_baseline`` (nvil), ``temperature`` (gumbel, st_gumbel).
    """

    name: str
    latent: str
    k: int | None = None
    budget: int | None = None
    max_iter: int = 300
    moving_average: MovingAverageBaseline | None = None
    nvil_baseline: NVILBaseline | None = None
    temperature: GumbelTemperature | None = None

    @property
    def sparse(self) -> bool:
        """π is sparse and E_π[ℓ] is summed exactly over its support."""
        return self.name in SPARSE_METHODS

    @property
    def exact(self) -> bool:
        """E_π[ℓ] is computed exactly (dense or sparse marginalization), not estimated."""
        return self.sparse or self.name == "dense"

    @property
    def score_function(self) -> bool:
        """The gradient reaches π only through ℓ(z)·∇log π(z) (SFE, SFE+, NVIL)."""
        return self.name in SCORE_FUNCTION_METHODS

    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the method itself (the NVIL baseline network), else []."""
        return [] if self.nvil_baseline is None else list(self.nvil_baseline.parameters())

    def state_dict(self) -> dict[str, Any]:
        """What the method learns or accumulates across steps, for a checkpoint: the NVIL
        baseline network's weights and the SFE moving average (mean, count)."""
        state: dict[str, Any] = {}
        if self.nvil_baseline is not None:
            state["nvil_baseline"] = self.nvil_baseline.state_dict()
        if self.moving_average is not None:
            state["moving_average"] = (self.moving_average.mean, self.moving_average.count)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned (for a method of the same name)."""
        if self.nvil_baseline is not None:
            self.nvil_baseline.load_state_dict(state["nvil_baseline"])
        if self.moving_average is not None:
            self.moving_average.mean, self.moving_average.count = state["moving_average"]

    def to(self, device: torch.device | str) -> Method:
        """Move the method's network (if any) to ``device``; returns self."""
        if self.nvil_baseline is not None:
            self.nvil_baseline.to(device)
        return self

    @property
    def mapping(self) -> str:
        """The categorical π = mapping(s): "sparsemax" for ``sparsemax``, "softmax" otherwise."""
        return "sparsemax" if self.name == "sparsemax" else "softmax"

    def probabilities(self, scores: Tensor) -> Tensor:
        """Categorical π(z|x) = mapping(s), [B, K]."""
        _check_scores(self, scores, "categorical")
        return MAPPINGS[self.mapping](scores)

    def bit_distribution(self, t: Tensor) -> BitVectorDistribution:
        """The sparse π over bit vectors of a sparse bits method (top-k sparsemax or SparseMAP)."""
        _check_scores(self, t, "bits")
        match self.name:
            case "topk_sparsemax":
                return topk_sparsemax(t, self.k)
            case "sparsemap":
                return sparsemap(t, bernoulli_map, self.max_iter)
            case "sparsemap_budget":
                budget = t.shape[-1] // 2 if self.budget is None else self.budget
                return sparsemap(t, budget_map(budget), self.max_iter)
        raise LearnableSparsityError(
            f"method {self.name!r} has no sparse bit-vector distribution; use one of "
            f"{sorted(SPARSE_METHODS - {'sparsemax'})}"
        )


def _check_scores(method: Method, scores: Tensor, latent: str) -> None:
    if method.latent != latent:
        raise LearnableSparsityError(
            f"method {method.name!r} has latent {method.latent!r}, not {latent!r}"
        )
    if scores.dim() != 2:
        raise LearnableSparsityError(
            f"scores must be [batch, K or D], got shape {tuple(scores.shape)}"
        )


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LearnableSparsityError(f"{name} must be a positive integer, got {value!r}")
    return value


def build_method(
    name: str,
    latent: str,
    *,
    k: int | None = None,
    budget: int | None = None,
    max_iter: int = 300,
    gumbel_rate: float = 1e-4,
    gumbel_update_every: int = 1000,
    nvil_features: int | None = None,
    nvil_hidden: int = 512,
    nvil_layers: int = 3,
) -> Method:
    r"""The :class:`Method` ``name`` for a ``latent`` ("categorical" or "bits").

    ``k`` defaults to 10 (top-k sparsemax) / 4 (unordered set). Gumbel temperature
    τ = max(0.5, exp(−r·t)) with r = ``gumbel_rate``, updated every ``gumbel_update_every``
    steps. NVIL needs ``nvil_features``, the width of the input its baseline b(x) reads
    (an MLP of ``nvil_layers`` hidden layers of ``nvil_hidden`` units).
    """
    if latent not in METHODS:
        raise LearnableSparsityError(f"unknown latent {latent!r}; choose one of {sorted(METHODS)}")
    if name not in METHODS[latent]:
        raise LearnableSparsityError(
            f"unknown method {name!r} for latent {latent!r}; choose one of {METHODS[latent]}"
        )
    method = Method(name, latent, max_iter=_positive_int("max_iter", max_iter))
    if name in DEFAULT_K:
        method.k = _positive_int("k", DEFAULT_K[name] if k is None else k)
    if name == "sparsemap_budget" and budget is not None:
        method.budget = _positive_int("budget", budget)
    if name == "sfe":
        method.moving_average = MovingAverageBaseline()
    if name in ("gumbel", "st_gumbel"):
        if gumbel_rate < 0:
            raise LearnableSparsityError(f"gumbel_rate must be >= 0, got {gumbel_rate}")
        method.temperature = GumbelTemperature(
            gumbel_rate, _positive_int("gumbel_update_every", gumbel_update_every)
        )
    if name == "nvil":
        if nvil_features is None:
            raise LearnableSparsityError("method 'nvil' needs nvil_features (got None)")
        method.nvil_baseline = NVILBaseline(
            _positive_int("nvil_features", nvil_features),
            _positive_int("nvil_hidden", nvil_hidden),
            _positive_int("nvil_layers", nvil_layers),
        )
    return method


def support_entropy(probs: Tensor) -> Tensor:
    """H(p) = −Σ_{p_i > 0} p_i log p_i over the last axis, with a finite gradient where p_i = 0."""
    return -(probs * torch.where(probs > 0, probs, 1.0).log()).sum(-1)


def bernoulli_entropy(t: Tensor) -> Tensor:
    """H of the factorised Bernoulli with logits t [B, D]: Σ_i −σ log σ − σ(−t_i) log σ(−t_i)."""
    return nn.functional.binary_cross_entropy_with_logits(
        t, torch.sigmoid(t), reduction="none"
    ).sum(-1)


def expected_loss(
    method: Method,
    scores: Tensor,
    loss_fn: LossFn,
    step: int,
    *,
    features: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Expectation:
    r"""E_{z∼π}[ℓ(x, z)] (exact or estimated) and H(π) for a batch of scores [B, K or D].

    ``step`` is the global training step (Gumbel temperature); ``features`` [B, F] is the
    input of the NVIL baseline b(x) (read detached, so the baseline's squared error
    (ℓ − b(x))², part of the NVIL surrogate, trains only the baseline); ``generator`` drives
    the sampling estimators. ``estimate.surrogate.mean()`` is what to backpropagate.
    """
    if method.latent == "bits" and method.sparse:
        distribution = method.bit_distribution(scores)
        return Expectation(
            marginalize_bits(distribution, loss_fn), support_entropy(distribution.probs)
        )
    if method.latent == "bits":
        _check_scores(method, scores, "bits")
        entropy = bernoulli_entropy(scores)
    else:
        entropy = support_entropy(method.probabilities(scores))
    match method.name:
        case "dense" | "sparsemax":
            estimate = marginalize(scores, loss_fn, method.mapping)
        case "sfe":
            estimate = estimators.sfe(
                scores, loss_fn, method.latent, method.moving_average, generator
            )
        case "sfe_plus":
            estimate = estimators.sfe_plus(scores, loss_fn, method.latent, generator)
        case "nvil":
            if features is None or features.shape[0] != scores.shape[0]:
                raise LearnableSparsityError(
                    f"method 'nvil' needs features [batch={scores.shape[0]}, F] for its "
                    f"baseline, got {None if features is None else tuple(features.shape)}"
                )
            baseline = method.nvil_baseline(features.detach())
            estimate = estimators.nvil(scores, loss_fn, method.latent, baseline, generator)
        case "gumbel" | "st_gumbel":
            estimate = estimators.gumbel(
                scores,
                loss_fn,
                method.latent,
                method.temperature(step),
                straight_through=method.name == "st_gumbel",
                generator=generator,
            )
        case "sum_and_sample":
            estimate = estimators.sum_and_sample(scores, loss_fn, generator)
        case "unordered_set":
            estimate = estimators.unordered_set(scores, loss_fn, method.k, generator)
        case _:
            raise LearnableSparsityError(
                f"unknown method {method.name!r} for latent {method.latent!r}; choose one of "
                f"{METHODS.get(method.latent)}"
            )
    return Expectation(estimate, entropy)


def expectation_metrics(method: Method, expectation: Expectation) -> dict[str, float]:
    """Batch means for logging: ``decoder_calls``, ``entropy`` and, for sparse methods,
    ``support`` (the number of z with π(z|x) > 0, which is also their decoder-call count)."""
    calls = float(expectation.estimate.decoder_calls.float().mean())
    metrics = {"decoder_calls": calls, "entropy": float(expectation.entropy.detach().mean())}
    if method.sparse:
        metrics["support"] = calls
    return metrics
