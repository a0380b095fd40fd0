r"""The learned α of α-entmax heads: trajectories over training and the converged values.

AST (Correia et al. 2019, §5) reads two things off the learned α: its distribution per attention
type (bimodal in the encoder self-attention: one mode near 2, one between 1 and 1.5), measured
here with Hartigan's dip test of unimodality and the modes of a two-component Gaussian mixture
(:func:`modality`), and its trajectory (some heads first move towards softmax, α → 1, then become
sparser again: :func:`softmax_then_sparser`). Whether α still moves is read in its logit
(:func:`alpha_movement`): α = 1.01 + 0.99·sigmoid(w) hardly moves in the sigmoid's tails even
while w travels.

A trajectory history is the trainer's ``history.alphas``: a list of
{"step": int, "alphas": {block key: [α per head]}} (block keys as in
:mod:`learnable_sparsity.analysis.blocks`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import diptest
    import numpy as np
    from sklearn.mixture import GaussianMixture

from learnable_sparsity.analysis.blocks import ATTENTION_TYPES, block_order, split_block
from learnable_sparsity.core.attention import ALPHA_MAX, ALPHA_MIN
from learnable_sparsity.errors import LearnableSparsityError

# The dip test's p-values are tabulated from 4 values on; two separated pairs already reject
# unimodality at p = 0.001.
MIN_MODALITY_VALUES = 4
# The mixture's fit is made reproducible: the same α give the same modes.
MIXTURE_SEED = 0
# α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w) changes fastest at w = 0, by this much per
# unit of w: a logit's move times it is the largest move of α it can make anywhere.
STEEPEST_SLOPE = (ALPHA_MAX - ALPHA_MIN) / 4
# The sigmoid's flat tails: where dα/dw = (ALPHA_MAX − ALPHA_MIN)·σ(w)(1 − σ(w)) is below this
# share of its steepest (at w = 0), a head needs that many times the gradient to move α as far.
# σ(1 − σ) = share/4 gives σ = (1 − √(1 − share))/2: |w| > 3.64, α < 1.035 or α > 1.975.
FLAT_TAIL_SLOPE_SHARE = 0.1
FLAT_TAIL_SIGMOID = (1 - math.sqrt(1 - FLAT_TAIL_SLOPE_SHARE)) / 2
FLAT_TAIL_ALPHAS = (
    ALPHA_MIN + (ALPHA_MAX - ALPHA_MIN) * FLAT_TAIL_SIGMOID,
    ALPHA_MAX - (ALPHA_MAX - ALPHA_MIN) * FLAT_TAIL_SIGMOID,
)
# Dense → sparse, AST's example (encoder self-attention layer 2, head 8): α drops to about 1.3
# and ends near 2, a rebound of about 0.7; from a start at the random initialisation's median α
# (1.5) its dip is about 0.2. A head counts when it makes half of each (the claim pre-registers
# the same magnitudes: learnable_sparsity/claims/claims.yaml, ast_dense_then_sparse).
DENSE_THEN_SPARSE_DIP = 0.1
DENSE_THEN_SPARSE_REBOUND = 0.35


@dataclass(frozen=True)
class Modality:
    """Whether a sample of α looks multimodal: ``dip`` and ``p_unimodal``, Hartigan's dip
    statistic and the p-value of the hypothesis "one mode" (interpolated from the test's table);
    ``modes``, the two means of a two-component Gaussian mixture fitted to the values, ascending
    (where the modes lie if there are two)."""

    n: int
    dip: float
    p_unimodal: float
    modes: tuple[float, float]


def modality(values: Sequence[float] | Tensor) -> Modality:
    """The :class:`Modality` of ``values`` (n ≥ :data:`MIN_MODALITY_VALUES`, not all equal).

    The dip test (Hartigan & Hartigan 1985) measures the largest distance between the empirical
    distribution function and the closest unimodal one: skew does not make a sample look
    bimodal (Sarle's bimodality coefficient, which it replaces, called 65% of skewed unimodal
    samples of 24 α piled near the lower bound bimodal).
    """
    x = np.sort(np.asarray(torch.as_tensor(values, dtype=torch.float64).flatten()))
    n = x.size
    if n < MIN_MODALITY_VALUES:
        raise LearnableSparsityError(
            f"modality needs at least {MIN_MODALITY_VALUES} values, got {n}"
        )
    if np.ptp(x) == 0:
        raise LearnableSparsityError(f"modality of {n} identical values ({x[0]}) is undefined")
    dip, p = diptest.diptest(x)
    mixture = GaussianMixture(2, n_init=5, random_state=MIXTURE_SEED).fit(x[:, None])
    low, high = sorted(float(m) for m in mixture.means_.ravel())
    return Modality(n, float(dip), float(p), (low, high))


def _logit(alpha: float) -> float:
    """w with α = ALPHA_MIN + (ALPHA_MAX − ALPHA_MIN)·sigmoid(w); α logged at a bound (float
    rounding) is read a hair inside it."""
    u = min(max((alpha - ALPHA_MIN) / (ALPHA_MAX - ALPHA_MIN), 1e-12), 1 - 1e-12)
    return math.log(u / (1 - u))


def alpha_movement(before: float, after: float, near_bound: float) -> float:
    """How far a head's α moved from ``before`` to ``after``, read in its logit w: |Δw| times
    :data:`STEEPEST_SLOPE`, the move α would make where it is most sensitive.

    A head in the sigmoid's tail barely moves α while its logit travels — it may be on its way
    back, as AST's heads that dip toward softmax and turn sparser — so |Δα| alone would call it
    settled. The one exception is a head moving into a bound it already lies within
    ``near_bound`` of: however far its logit goes, its α can move less than that: its |Δα| is
    returned.
    """
    for bound in (ALPHA_MIN, ALPHA_MAX):
        if abs(after - bound) <= near_bound and abs(after - bound) <= abs(before - bound):
            return abs(after - before)
    return STEEPEST_SLOPE * abs(_logit(after) - _logit(before))


def softmax_then_sparser(
    trajectory: Sequence[float],
    alpha_init: float | None = None,
    min_dip: float = DENSE_THEN_SPARSE_DIP,
    min_rebound: float = DENSE_THEN_SPARSE_REBOUND,
) -> bool:
    """Whether a head's α first moves toward softmax and then becomes sparser.

    With α₀ = ``alpha_init`` (the first logged value when None) and α_min = min_t α_t:
    True iff α_min ≤ α₀ − ``min_dip`` (α fell toward 1) and α_T ≥ α_min + ``min_rebound`` (the
    final α rose again after the minimum). The magnitudes (in α units) default to half of AST's
    example (:data:`DENSE_THEN_SPARSE_DIP`, :data:`DENSE_THEN_SPARSE_REBOUND`).
    """
    if not trajectory:
        raise LearnableSparsityError("softmax_then_sparser needs a non-empty α trajectory")
    if not (min_dip >= 0 and min_rebound >= 0):
        raise LearnableSparsityError(
            f"min_dip and min_rebound must be >= 0, got {min_dip!r}, {min_rebound!r}"
        )
    start = trajectory[0] if alpha_init is None else alpha_init
    lowest = min(trajectory)
    return lowest <= start - min_dip and trajectory[-1] >= lowest + min_rebound


def alpha_trajectories(
    history: Sequence[Mapping[str, object]],
) -> tuple[list[int], dict[str, list[list[float]]]]:
    """Steps and per-block, per-head α series from the trainer's ``history.alphas``.

    ``history`` is a list of {"step": int, "alphas": {block key: [α per head]}}; the result is
    (steps [T], {block key: [[α_t for t < T] for each head]}).
    """
    if not history:
        raise LearnableSparsityError("the α history is empty (was the model α-entmax?)")
    steps = [int(entry["step"]) for entry in history]
    blocks = sorted(history[0]["alphas"], key=block_order)
    series: dict[str, list[list[float]]] = {}
    for key in blocks:
        heads = len(history[0]["alphas"][key])
        series[key] = [[] for _ in range(heads)]
    for entry in history:
        alphas = entry["alphas"]
        if sorted(alphas, key=block_order) != blocks:
            raise LearnableSparsityError(
                f"α history at step {entry['step']} has blocks {sorted(alphas)}, expected {blocks}"
            )
        for key in blocks:
            if len(alphas[key]) != len(series[key]):
                raise LearnableSparsityError(
                    f"α history at step {entry['step']} has {len(alphas[key])} heads in {key}, "
                    f"expected {len(series[key])}"
                )
            for head, value in enumerate(alphas[key]):
                series[key][head].append(float(value))
    return steps, series


def alpha_statistics(alphas: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float | None]]:
    """Mean, min, max and the dip test's p-value of "one mode" (:func:`modality`) of the final α
    per attention type, and how many heads end in the parametrisation's flat tails
    (``flat_tail_softmax``: α below ``FLAT_TAIL_ALPHAS[0]``; ``flat_tail_sparsemax``: above
    ``FLAT_TAIL_ALPHAS[1]``), where α responds to its gradient at a tenth of the rate it can.

    ``alphas``: {block key: [α per head]}. The p-value is None where it is undefined (fewer than
    :data:`MIN_MODALITY_VALUES` values, or all equal).
    """
    out: dict[str, dict[str, float | None]] = {}
    for kind in ATTENTION_TYPES:
        values = [a for key, heads in alphas.items() if split_block(key)[0] == kind for a in heads]
        if values:
            defined = len(values) >= MIN_MODALITY_VALUES and len(set(values)) > 1
            out[kind] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "p_unimodal": modality(values).p_unimodal if defined else None,
                "flat_tail_softmax": sum(a < FLAT_TAIL_ALPHAS[0] for a in values),
                "flat_tail_sparsemax": sum(a > FLAT_TAIL_ALPHAS[1] for a in values),
            }
    return out


def flagged_heads(history: Sequence[Mapping[str, object]]) -> list[tuple[str, int]]:
    """(block, head) of every α trajectory in ``history`` that first moves towards softmax and
    then becomes sparser (:func:`softmax_then_sparser`)."""
    _, series = alpha_trajectories(history)
    return [
        (block, head)
        for block, heads in series.items()
        for head, trajectory in enumerate(heads)
        if softmax_then_sparser(trajectory)
    ]
