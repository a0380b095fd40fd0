"""The papers' qualitative claims, written once as data (``claims.yaml``) and checked on results.

Each claim of ``claims.yaml`` has an ``id``, a short ``title`` (its row in the matrix of verdicts
per run, :func:`learnable_sparsity.claims.report.claims_matrix`), the ``work`` it comes from (AST,
EST, SparseMarg, APE), its ``source`` (table or section), the ``text`` a reader checks, the
``check`` that tests it (registered in :data:`learnable_sparsity.claims.catalog.CHECKS`), that
check's ``args`` and its pre-registered ``thresholds``
(:mod:`learnable_sparsity.claims.preregistered`: each with the publication's value, source, reason
and history). :func:`evaluate` gives each claim a
:class:`~learnable_sparsity.claims.checks.Verdict` on
:class:`~learnable_sparsity.claims.results.Results`; the claims no check covers are listed, with
their reasons, by :func:`out_of_scope`.
"""

from learnable_sparsity.claims.catalog import (
    CHECKS,
    ClaimResult,
    evaluate,
    load_claims,
    out_of_scope,
)
from learnable_sparsity.claims.checks import NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, Verdict
from learnable_sparsity.claims.preregistered import Claim, OutOfScope, Threshold
from learnable_sparsity.claims.results import Results, results_from_json, results_to_json

__all__ = [
    "CHECKS",
    "NOT_MEASURABLE",
    "NOT_REPRODUCED",
    "REPRODUCED",
    "Claim",
    "ClaimResult",
    "OutOfScope",
    "Results",
    "Threshold",
    "Verdict",
    "evaluate",
    "load_claims",
    "out_of_scope",
    "results_from_json",
    "results_to_json",
]
