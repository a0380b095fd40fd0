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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from learnable_sparsity.claims import ape_checks, lvm_checks, nmt_checks
from learnable_sparsity.claims.checks import Verdict
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


def evaluate(results: Results, claims: Sequence[Claim] | None = None) -> list[ClaimResult]:
    """Every claim's verdict on ``results`` (default: the claims of ``claims.yaml``)."""
    return [
        ClaimResult(claim, CHECKS[claim.check](results, **claim.arguments()))
        for claim in (load_claims() if claims is None else claims)
    ]
