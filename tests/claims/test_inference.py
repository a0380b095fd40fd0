"""The tests of each kind of claim and the claim-level family, measured by simulation at the
kept records' noise: how often "as good as" is reproduced at a true deficit equal to its margin
(its false-reproduce rate), how often a claim of 5 comparisons on constant gaps is held back
(its false-block rate), and the power of each.

The noise: three seeds a side whose same-seed results share a seed effect (the records'
same-seed residuals correlate 0.51-0.98; here 0.75), so the per-seed differences are the
replicates (rule ``paired_seeds``). 4000 replicates: a rate's simulation sd ≤ 0.8 points.
"""

from __future__ import annotations

import math
import random

import pytest

from learnable_sparsity.claims import checks

SEEDS = 3
SD = 1.0  # each method's seed sd (the evidence record's BLEU: 0.8-1.2)
CORRELATION = 0.75  # the same seed's results of two methods
RUNS = 4000


def _pair(rng: random.Random, deficit: float) -> tuple[list[float], list[float]]:
    """Candidate and baseline over the same seeds, the candidate ``deficit`` worse."""
    shared = [rng.gauss(0, SD * math.sqrt(CORRELATION)) for _ in range(SEEDS)]
    alone = SD * math.sqrt(1 - CORRELATION)
    baseline = [80 + s + rng.gauss(0, alone) for s in shared]
    candidate = [80 - deficit + s + rng.gauss(0, alone) for s in shared]
    return candidate, baseline


def _rate(deficit: float, margin: float, status: str, paired: bool = True) -> float:
    rng = random.Random(0)
    hits = 0
    for _ in range(RUNS):
        candidate, baseline = _pair(rng, deficit)
        verdict = checks.at_least_as_good(candidate, baseline, margin, paired=paired)
        hits += verdict.status == status
    return hits / RUNS


@pytest.mark.parametrize("paired", [True, False])
def test_as_good_as_reproduces_a_deficit_equal_to_the_margin_at_most_at_its_level(
    paired: bool,
) -> None:
    """Non-inferiority: a true deficit equal to the margin is reproduced ≤ 5% of the time (the
    absence-of-significance rule it replaced: about 40%, issue 46)."""
    rate = _rate(0.5, 0.5, checks.REPRODUCED, paired=paired)
    assert rate <= 0.05 + 0.015, rate


def test_as_good_as_refutes_a_candidate_at_the_margin_at_most_at_its_level() -> None:
    """The other side: a deficit equal to the margin is refuted ≤ 5% of the time."""
    assert _rate(0.5, 0.5, checks.NOT_REPRODUCED) <= 0.065


def test_as_good_as_has_power_for_an_equal_candidate_with_a_wide_margin() -> None:
    """Equal methods against a margin of 1.5 seed sd, paired: reproduced in 76% of records."""
    assert _rate(0.0, 1.5, checks.REPRODUCED) >= 0.7


def _gap_curves(
    rng: random.Random, offset: float, shared: list[list[float]]
) -> list[list[tuple[float, float]]]:
    steps = range(250, 1501, 250)
    return [
        [
            (step, 2.8 + 1.5 * math.exp(-step / 400) + offset + wobble + rng.gauss(0, 0.01))
            for step, wobble in zip(steps, seed, strict=True)
        ]
        for seed in shared
    ]


def test_a_claim_of_five_comparisons_on_constant_gaps_is_held_back_at_most_ten_percent() -> None:
    """One family per claim (Holm over its gap trends): 5 comparisons of constant gaps, at the
    records' paired noise (same-seed checkpoint residuals shared: the gap's own scatter 0.01
    nats per checkpoint), are held back ≤ 10% of the time (per-call levels: 21%, issue 46)."""
    rng = random.Random(1)
    blocked = 0
    for _ in range(RUNS // 4):
        shared = [[rng.gauss(0, 0.035) for _ in range(6)] for _ in range(SEEDS)]
        baseline = _gap_curves(rng, 0.0, shared)
        comparisons = {f"v{i}": (_gap_curves(rng, 0.1 * i, shared), baseline) for i in range(1, 6)}
        blocked += checks.unsettled(comparisons, "validation NLL") is not None
    assert blocked / (RUNS // 4) <= 0.10


def test_a_claim_refuted_only_by_a_part_holm_rejects() -> None:
    """A part refuted at p = 0.03 alone, in a family of 3, is not refuted by the claim: Holm
    needs p ≤ 0.05 / 3 for the smallest."""
    refuted = checks.Verdict(checks.NOT_REPRODUCED, "a", {"p_refutes": 0.03})
    others = {name: checks.Verdict(checks.REPRODUCED, name, {"p_refutes": 0.9}) for name in "bc"}
    claim = checks.all_of({"a": refuted, **others})
    assert claim.status == checks.NOT_MEASURABLE
    assert "Holm at 0.05" in claim.evidence
    alone = checks.all_of({"a": refuted})
    assert alone.status == checks.NOT_REPRODUCED


def test_holm_steps_down() -> None:
    assert checks.holm({"a": 0.01, "b": 0.02, "c": 0.04}, 0.05) == {"a", "b", "c"}
    assert checks.holm({"a": 0.01, "b": 0.03, "c": 0.04}, 0.05) == {"a"}
    assert checks.holm({"a": 0.02, "b": 0.03}, 0.05) == {"a", "b"}
    assert checks.holm({"a": 0.026, "b": 0.03}, 0.05) == set()


def test_calls_fall_pairs_each_run_s_first_and_last_fifth() -> None:
    """Three runs that each fall by 1 call from different levels: paired, the fall is certain;
    as independent samples (the earlier rule) the levels' spread would hide it."""
    first = [5.0, 9.0, 13.0]
    last = [4.0, 8.1, 11.9]
    paired = checks.significantly_below(last, first, paired=True)
    unpaired = checks.significantly_below(last, first)
    assert paired.status == checks.REPRODUCED
    assert unpaired.status == checks.NOT_MEASURABLE
