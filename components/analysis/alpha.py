r"""The learned α of α-entmax heads: trajectories over training and the converged values.

AST (Correia et al. 2019, §5) reads two things off the learned α: its distribution per attention
type (bimodal in the encoder self-attention: some heads near softmax, some near sparsemax), measured
here with Sarle's bimodality coefficient, and its trajectory (some heads first move towards
softmax, α → 1, then become sparser again).

A trajectory history is the trainer's ``history.alphas``: a list of
{"step": int, "alphas": {block key: [α per head]}} (block keys as in
:mod:`components.analysis.blocks`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from components.analysis.blocks import ATTENTION_TYPES, block_order, split_block
from components.errors import LearnableSparsityError

# Sarle's coefficient of a uniform distribution; larger values suggest bimodality.
BIMODALITY_THRESHOLD = 5 / 9
# The coefficient's bias corrections need n >= 4 values.
MIN_BIMODALITY_VALUES = 4


def bimodality_coefficient(values: Sequence[float] | Tensor) -> float:
    """Sarle's bimodality coefficient with the sample-size correction:

        BC = (g² + 1) / (κ + 3 (n − 1)² / ((n − 2)(n − 3))),

    g the bias-corrected sample skewness and κ the bias-corrected sample excess kurtosis of the
    n values. BC of a uniform distribution is 5/9 (:data:`BIMODALITY_THRESHOLD`), of a normal
    1/3; BC > 5/9 suggests a bimodal (or strongly skewed) distribution. Needs n ≥ 4 values that
    are not all equal.
    """
    x = np.asarray(torch.as_tensor(values, dtype=torch.float64).flatten())
    n = x.size
    if n < 4:
        raise LearnableSparsityError(f"bimodality needs at least 4 values, got {n}")
    if np.ptp(x) == 0:
        raise LearnableSparsityError(f"bimodality of {n} identical values ({x[0]}) is undefined")
    g = stats.skew(x, bias=False)
    kappa = stats.kurtosis(x, fisher=True, bias=False)
    return float((g**2 + 1) / (kappa + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


def softmax_then_sparser(
    trajectory: Sequence[float], alpha_init: float | None = None, tolerance: float = 0.05
) -> bool:
    """Whether a head's α first moves toward softmax and then becomes sparser.

    With α₀ = ``alpha_init`` (the first logged value when None) and α_min = min_t α_t:
    True iff α_min ≤ α₀ − tolerance (α decreased toward 1) and α_T ≥ α_min + tolerance (the
    final α rose again after the minimum). The tolerance (in α units) ignores small wiggles.
    """
    if not trajectory:
        raise LearnableSparsityError("softmax_then_sparser needs a non-empty α trajectory")
    if not tolerance >= 0:
        raise LearnableSparsityError(f"tolerance must be >= 0, got {tolerance!r}")
    start = trajectory[0] if alpha_init is None else alpha_init
    lowest = min(trajectory)
    return lowest <= start - tolerance and trajectory[-1] >= lowest + tolerance


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
    """Mean, min, max and bimodality coefficient of the final α per attention type.

    ``alphas``: {block key: [α per head]}. The coefficient is None where it is undefined (fewer
    than :data:`MIN_BIMODALITY_VALUES` values, or all equal).
    """
    out: dict[str, dict[str, float | None]] = {}
    for kind in ATTENTION_TYPES:
        values = [a for key, heads in alphas.items() if split_block(key)[0] == kind for a in heads]
        if values:
            defined = len(values) >= MIN_BIMODALITY_VALUES and len(set(values)) > 1
            out[kind] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "bimodality": bimodality_coefficient(values) if defined else None,
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
