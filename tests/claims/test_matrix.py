"""The claims matrix: a row per claim (by work), a column per run, each verdict linked to the
claim's row in that run's table, "—" where a run lacks the claim, a retired claim as a row of its
own, the totals, the titles of the claims out of scope."""

from __future__ import annotations

import datetime

import pytest

from learnable_sparsity.claims import Claim, OutOfScope
from learnable_sparsity.claims.catalog import ClaimResult
from learnable_sparsity.claims.checks import (
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    Verdict,
)
from learnable_sparsity.claims.preregistered import Change, Threshold
from learnable_sparsity.claims.report import (
    MATRIX_LEGEND,
    KeptVerdict,
    MatrixColumn,
    claims_matrix,
    kept_markdown,
    kept_verdicts,
)
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


def test_the_verdicts_as_kept_and_today_word_for_word() -> None:
    """A kept record's section beside its table: the claims whose verdict moved (one the record
    was kept without among them), each with its thresholds fixed since; the rules fixed since."""
    margin = Threshold(
        0.5,
        "BLEU",
        "31.1 vs 30.6",
        "Table 1",
        "r",
        (Change(1.0, datetime.date(2026, 11, 26), "x"),),
    )
    moved = Claim(
        "ast_bleu", "t", "AST", "s", "x", "bleu_at_least_as_good", thresholds={"margin": margin}
    )
    results = [
        ClaimResult(moved, Verdict(NOT_REPRODUCED, "e")),
        ClaimResult(CLAIMS[0], Verdict(REPRODUCED, "e")),
        ClaimResult(CLAIMS[2], Verdict(NOT_MEASURABLE, "e")),
    ]
    kept = {"ast_bleu": REPRODUCED, "est_topk": REPRODUCED}
    kept_at = datetime.datetime(2026, 11, 25, tzinfo=datetime.UTC)
    changed = kept_verdicts(results, kept, kept_at)
    since = ("margin = 0.5 BLEU; was 1 BLEU until 2026-11-26",)
    assert changed == [
        KeptVerdict("ast_bleu", REPRODUCED, NOT_REPRODUCED, since),
        KeptVerdict("ast_new", None, NOT_MEASURABLE, ()),
    ]
    rules = ["level = 0.05; was 0.1 until 2026-11-26"]
    assert kept_markdown(changed, rules, "the checks of `abc`") == (
        "\n### Verdicts as kept and today\n\n"
        "The record was judged when kept (the checks of `abc`); today's rules give another verdict "
        "for 2 claims. A rule changed after a record was kept applies to it beside the verdict it "
        "was kept with, never in its place. Changes of the checks' code that no registry entry "
        "names (before 2026-11-28 the gates' constants were code) lie between the two checks' "
        "commits (`git log <kept commit>..HEAD -- learnable_sparsity/claims`).\n\n"
        "Rules fixed since the record was kept: level = 0.05; was 0.1 until 2026-11-26.\n\n"
        "| Claim | As kept | Today | Its thresholds fixed since |\n"
        "|---|---|---|---|\n"
        "| [ast_bleu](#claim-ast_bleu) | reproduced | **not reproduced** | "
        "margin = 0.5 BLEU; was 1 BLEU until 2026-11-26 |\n"
        "| [ast_new](#claim-ast_new) | not yet a claim | **not measurable** | — |\n"
    )  # fmt: skip
    assert "Rules fixed since the record was kept: none.\n" in kept_markdown([], [], "x")
