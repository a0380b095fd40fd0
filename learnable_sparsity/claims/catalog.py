"""The claim checks on a run's :class:`~learnable_sparsity.claims.results.Results`, and the claims
of ``claims.yaml`` they evaluate.

A check is a function ``(results, **args, **thresholds) -> Verdict`` registered in
:data:`CHECKS` under the name ``claims.yaml`` uses; the checks live with their family
(:mod:`~learnable_sparsity.claims.nmt_checks`, :mod:`~learnable_sparsity.claims.lvm_checks`,
:mod:`~learnable_sparsity.claims.ape_checks`), the statistics they share in
:mod:`~learnable_sparsity.claims.checks`. Where a result is missing (a stage not run, a
variant not in the grid, a record kept before the result existed) the verdict is "not
measurable", naming what is missing. Every gate that holds a verdict back (training still
deciding a comparison, too short a run) holds it back whichever way the result points: a claim
is never reproduced on a run that would not have been allowed to refute it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from learnable_sparsity.claims import ape_checks, lvm_checks, nmt_checks
from learnable_sparsity.claims.checks import Verdict, rule, rules_overridden
from learnable_sparsity.claims.preregistered import Claim, OutOfScope, parse_claims
from learnable_sparsity.claims.results import Results


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: Verdict


# Every check by the name claims.yaml gives it: the NMT works', the latent-variable experiments',
# automatic post-editing's.
CHECKS: dict[str, Callable[..., Verdict]] = {
    check.__name__: check for check in (*nmt_checks.CHECKS, *lvm_checks.CHECKS, *ape_checks.CHECKS)
}


@cache
def _claims_file() -> tuple[tuple[Claim, ...], tuple[OutOfScope, ...]]:
    text = resources.files(__package__).joinpath("claims.yaml").read_text("utf-8")
    return parse_claims(text, CHECKS)


def load_claims() -> tuple[Claim, ...]:
    """The claims of ``claims.yaml`` (:func:`parse_claims`: checked against :data:`CHECKS`)."""
    return _claims_file()[0]


def out_of_scope() -> tuple[OutOfScope, ...]:
    """The claims of the seed documents that ``claims.yaml`` leaves out, with the reasons."""
    return _claims_file()[1]


# How far a threshold or rule is moved to ask whether a verdict stands on its edge: a verdict
# that flips when one of them moves by 10% is fragile (the matrix marks it).
NUDGE = 0.1
# The numeric rules a verdict can hang on (claims.yaml's rules; power only sizes "what would
# decide it", min_seeds is a count).
NUDGED_RULES = (
    "significance",
    "convergence_window",
    "still_improving",
    "trend_window",
    "gap_trend_level",
    "alpha_settled",
    "alpha_drift_level",
    "alpha_drift_material",
)


def _edges(numbers: Mapping[str, Any]) -> list[dict[str, float]]:
    """Every ``edge`` (statistic, threshold, distance) in a verdict's numbers, parts included."""
    found = [numbers["edge"]] if isinstance(numbers.get("edge"), Mapping) else []
    for value in numbers.values():
        if isinstance(value, Mapping):
            found += _edges(value)
    return found


def sensitivity(results: Results, claim: Claim, status: str) -> dict[str, Any]:
    """Which ±:data:`NUDGE` moves of the claim's thresholds and of the :data:`NUDGED_RULES`
    flip its verdict (``flips``: "name ×factor → status"), out of how many were tried."""
    check = CHECKS[claim.check]
    flips, tried = [], 0
    for factor in (1 - NUDGE, 1 + NUDGE):
        for name, threshold in claim.thresholds.items():
            tried += 1
            moved = check(results, **{**claim.arguments(), name: threshold.value * factor})
            if moved.status != status:
                flips.append(f"{name} ×{factor:g} → {moved.status}")
        for name in NUDGED_RULES:
            tried += 1
            with rules_overridden({name: rule(name) * factor}):
                moved = check(results, **claim.arguments())
            if moved.status != status:
                flips.append(f"rule {name} ×{factor:g} → {moved.status}")
    return {"flips": flips, "tried": tried}


def _with_edge(results: Results, claim: Claim, verdict: Verdict) -> Verdict:
    """``verdict`` with its distance from the edge (the nearest of its parts' edges, relative to
    the threshold) and its :func:`sensitivity`, in its evidence and numbers."""
    moved = sensitivity(results, claim, verdict.status)
    edges = _edges(verdict.numbers)
    nearest = min(
        edges,
        key=lambda e: abs(e["distance"]) / max(abs(e["threshold"]), abs(e["statistic"]), 1e-12),
        default=None,
    )
    said = (
        f"edge: {nearest['statistic']:.4g} against {nearest['threshold']:.4g} (distance "
        f"{nearest['distance']:+.3g})"
        if nearest
        else "edge: no numeric threshold decides it"
    )
    flipped = (
        f"FRAGILE: flips under {'; '.join(moved['flips'])}"
        if moved["flips"]
        else f"stands under ±{NUDGE:.0%} on each of {moved['tried'] // 2} thresholds and rules"
    )
    numbers = {**verdict.numbers, "nearest_edge": nearest, "sensitivity": moved}
    return Verdict(verdict.status, f"{verdict.evidence} [{said}; {flipped}]", numbers)


def evaluate(
    results: Results, claims: Sequence[Claim] | None = None, *, edges: bool = True
) -> list[ClaimResult]:
    """Every claim's verdict on ``results`` (default: the claims of ``claims.yaml``), with its
    distance from the edge and its sensitivity to ±10% on each threshold and rule it uses
    (:func:`_with_edge`; ``edges=False``: the verdicts alone)."""
    verdicts = []
    for claim in load_claims() if claims is None else claims:
        verdict = CHECKS[claim.check](results, **claim.arguments())
        verdicts.append(
            ClaimResult(claim, _with_edge(results, claim, verdict) if edges else verdict)
        )
    return verdicts
