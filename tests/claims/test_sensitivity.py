"""Every verdict's distance from its edge and its sensitivity (learnable_sparsity.claims.catalog):
which ±10% moves of the claim's thresholds and of the statistics' rules flip it, and the nearest of
its parts' edges, relative to the threshold — what the claims page prints and the matrix marks.

A stand-in check whose verdict depends on one threshold and one rule in a known way, so every
expected flip and count is worked out here by hand."""

from __future__ import annotations

import pytest

from learnable_sparsity.claims import catalog, checks
from learnable_sparsity.claims.catalog import NUDGE, NUDGED_RULES, evaluate, sensitivity
from learnable_sparsity.claims.checks import NOT_REPRODUCED, REPRODUCED, Verdict
from learnable_sparsity.claims.preregistered import Claim, Threshold
from learnable_sparsity.claims.results import Results

RESULTS = Results()


def _claim(margin: float, numbers: dict | None = None) -> tuple[Claim, list[tuple[float, float]]]:
    """A claim of the stand-in check ``at_margin``: reproduced while its margin is at least 1 and
    the rule ``significance`` at most 0.05 (its value today); the calls it receives, as
    (margin, significance)."""
    calls: list[tuple[float, float]] = []

    def at_margin(results: Results, margin: float) -> Verdict:
        level = checks.rule("significance")
        calls.append((margin, level))
        status = REPRODUCED if margin >= 1.0 and level <= 0.05 else NOT_REPRODUCED
        return Verdict(status, "measured", dict(numbers or {}))

    catalog.CHECKS["at_margin"] = at_margin
    threshold = Threshold(margin, "BLEU", "p", "s", "r")
    claim = Claim("c", "t", "AST", "s", "x", "at_margin", thresholds={"margin": threshold})
    return claim, calls


@pytest.fixture(autouse=True)
def _stand_in_check():
    yield
    catalog.CHECKS.pop("at_margin", None)


def test_each_threshold_and_rule_is_moved_down_then_up_by_ten_percent_alone() -> None:
    claim, calls = _claim(1.05)
    moved = sensitivity(RESULTS, claim, REPRODUCED)
    level = checks.rule("significance")
    rules = len(NUDGED_RULES)
    assert moved["tried"] == 2 * (1 + rules)
    # per factor: the threshold moved (the rules as they are), then each rule moved alone
    assert calls[0] == pytest.approx((1.05 * (1 - NUDGE), level))
    assert calls[1 + rules] == pytest.approx((1.05 * (1 + NUDGE), level))
    assert sorted(c[1] for c in calls) == pytest.approx(
        sorted([level] * (2 * rules) + [level * (1 - NUDGE), level * (1 + NUDGE)])
    )
    # 1.05 × 0.9 < 1 flips it; so does a significance level of 0.055
    assert moved["flips"] == [
        "margin ×0.9 → not reproduced",
        "rule significance ×1.1 → not reproduced",
    ]
    assert checks.rule("significance") == level  # restored


def test_a_verdict_no_move_flips_stands_and_says_how_many_it_tried() -> None:
    claim, _ = _claim(2.0)
    (result,) = evaluate(RESULTS, [claim])
    # the margin is far from 1, but the level 0.05 is at the stand-in's edge: ×1.1 flips it
    moved = result.verdict.numbers["sensitivity"]
    assert moved["tried"] == 2 * (1 + len(NUDGED_RULES))
    assert result.verdict.evidence.endswith(
        "[edge: no numeric threshold decides it; FRAGILE: flips under rule significance ×1.1 → "
        "not reproduced]"
    )
    with checks.rules_overridden({"significance": 0.01}):  # away from the edge: nothing flips
        (result,) = evaluate(RESULTS, [claim])
    assert result.verdict.numbers["sensitivity"]["flips"] == []
    assert result.verdict.evidence == (
        f"measured [edge: no numeric threshold decides it; stands under ±10% on each of "
        f"{1 + len(NUDGED_RULES)} thresholds and rules]"
    )


def _edge(statistic: float, threshold: float) -> dict[str, float]:
    return {"statistic": statistic, "threshold": threshold, "distance": statistic - threshold}


@pytest.mark.parametrize(
    ("numbers", "nearest"),
    [
        # relative to the larger of threshold and statistic: 10/100 beats 0.1/0.5
        ({"edge": _edge(100, 90), "part": {"edge": _edge(0.5, 0.4)}}, _edge(100, 90)),
        # a part's edge nearer than the verdict's own; every part is searched
        (
            {
                "edge": _edge(10, 5),
                "a": {"edge": _edge(100, 99)},
                "b": {"status": "x", "edge": _edge(3, 1)},
            },
            _edge(100, 99),
        ),
        # a threshold far above its statistic: 19/20 = 0.95 beats 9.8/10 = 0.98
        ({"edge": _edge(1, 20), "part": {"edge": _edge(10, 0.2)}}, _edge(1, 20)),
        # a statistic far above its threshold: 9/10 = 0.9 beats 19/20 = 0.95
        ({"edge": _edge(10, 1), "part": {"edge": _edge(1, 20)}}, _edge(10, 1)),
    ],
)
def test_the_nearest_edge_is_the_relatively_nearest_of_the_verdict_and_its_parts(
    numbers: dict, nearest: dict
) -> None:
    claim, _ = _claim(2.0, numbers)
    with checks.rules_overridden({"significance": 0.01}):
        (result,) = evaluate(RESULTS, [claim])
    assert result.verdict.numbers["nearest_edge"] == nearest
    assert (
        f"[edge: {nearest['statistic']:.4g} against {nearest['threshold']:.4g} (distance "
        f"{nearest['distance']:+.3g}); stands under" in result.verdict.evidence
    )
