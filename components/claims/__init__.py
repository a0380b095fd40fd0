"""The papers' qualitative claims, written once as data (``claims.yaml``) and checked on results.

Each claim of ``claims.yaml`` has an ``id``, the ``work`` it comes from (AST, EST, SparseMarg,
APE), its ``source`` (table or section), the ``text`` a reader checks, the ``check`` that tests
it (a function of :mod:`components.claims.catalog`) and that check's ``args``.
:func:`evaluate` gives each claim a :class:`~components.claims.checks.Verdict` on a
:class:`~components.claims.catalog.Results`.
"""

from components.claims.catalog import CHECKS, Claim, ClaimResult, Results, evaluate, load_claims
from components.claims.checks import NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, Verdict

__all__ = [
    "CHECKS",
    "NOT_MEASURABLE",
    "NOT_REPRODUCED",
    "REPRODUCED",
    "Claim",
    "ClaimResult",
    "Results",
    "Verdict",
    "evaluate",
    "load_claims",
]
