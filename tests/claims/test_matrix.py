"""The claims matrix: a row per claim (by work), a column per run, each verdict linked to the
claim's row in that run's table, "—" where a run lacks the claim, a retired claim as a row of its
own, the totals, the titles of the claims out of scope."""

from __future__ import annotations

import pytest

from learnable_sparsity.claims import Claim, OutOfScope
from learnable_sparsity.claims.report import MATRIX_LEGEND, MatrixColumn, claims_matrix
from learnable_sparsity.errors import LearnableSparsityError


def _claim(claim_id: str, work: str, title: str) -> Claim:
    return Claim(claim_id, title, work, "Table 1", "the claim in full", "bleu_at_least_as_good")


# In claims.yaml's order, which the matrix groups by work: AST before EST.
CLAIMS = (
    _claim("est_topk", "EST", "Top-k translates as well as softmax"),
    _claim("ast_bleu", "AST", "α-entmax translates as well as softmax"),
    _claim("ast_new", "AST", "A claim | added after the record"),
)
SMOKE = MatrixColumn(
    "smoke",
    "claims.md",
    {"ast_bleu": "not measurable", "ast_new": "reproduced", "est_topk": "not reproduced"},
)
KEPT = MatrixColumn(
    "evidence",
    "evidence/claims.md",
    {"ast_bleu": "reproduced", "est_topk": "reproduced", "est_gone": "not reproduced"},
)
EXCLUDED = (OutOfScope("est_k8", "k = 8 is best", "EST", "§5.2", "k = 8 is best", "too costly"),)

EXPECTED = """\
| Work | Claim | [smoke](claims.md) | [evidence](evidence/claims.md) |
|---|---|---|---|
| AST | α-entmax translates as well as softmax | [? not measurable](claims.md#claim-ast_bleu) | [✓ reproduced](evidence/claims.md#claim-ast_bleu) |
|  | A claim \\| added after the record | [✓ reproduced](claims.md#claim-ast_new) | — |
| EST | Top-k translates as well as softmax | [✗ not reproduced](claims.md#claim-est_topk) | [✓ reproduced](evidence/claims.md#claim-est_topk) |
|  | `est_gone` (retired) | — | [✗ not reproduced](evidence/claims.md#claim-est_gone) |
| | **4 claims** | 1 ✓ · 1 ✗ · 1 ? · 1 — | 2 ✓ · 1 ✗ · 0 ? · 1 — |

{legend}

Out of scope, no check tests them (why: each run's table): k = 8 is best (EST).
"""  # noqa: E501


def test_the_matrix_of_two_runs() -> None:
    assert claims_matrix(CLAIMS, [SMOKE, KEPT], EXCLUDED) == EXPECTED.format(legend=MATRIX_LEGEND)


def test_the_matrix_marks_fragile_verdicts_and_the_verdict_a_record_was_kept_with() -> None:
    """≈ before a verdict a ±10% move flips; "(kept ✗)" after one today's rules changed; a claim
    the record was kept without (None) shows today's verdict alone; the totals count ≈."""
    kept = MatrixColumn(
        "evidence",
        "evidence/claims.md",
        {"ast_bleu": "not measurable", "est_topk": "reproduced", "ast_new": "reproduced"},
        fragile=frozenset({"est_topk"}),
        kept={"ast_bleu": "not reproduced", "ast_new": None},
    )
    matrix = claims_matrix(CLAIMS, [kept])
    assert "[? not measurable](evidence/claims.md#claim-ast_bleu) (kept ✗) |" in matrix
    assert "[✓ reproduced](evidence/claims.md#claim-ast_new) |" in matrix
    assert "[≈ ✓ reproduced](evidence/claims.md#claim-est_topk) |" in matrix
    assert "| 2 ✓ · 0 ✗ · 1 ? · 1 ≈ |" in matrix
    assert MATRIX_LEGEND in matrix and "≈: fragile" in MATRIX_LEGEND


def test_an_unknown_verdict_is_refused_naming_the_run_and_the_claim() -> None:
    odd = MatrixColumn("bible", "bible/claims.md", {"ast_bleu": "maybe"})
    with pytest.raises(LearnableSparsityError, match=r"run 'bible': claim 'ast_bleu' .* 'maybe'"):
        claims_matrix(CLAIMS, [odd])
