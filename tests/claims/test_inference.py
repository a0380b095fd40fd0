"""The tests of each kind of claim and the claim-level family, measured by simulation at the
kept records' noise: how often "as good as" is reproduced at a true deficit equal to its margin
(its false-reproduce rate), how often a claim of 5 comparisons on constant gaps is held back
(its false-block rate), and the power of each.

The noise: three seeds a side whose same-seed results share a seed effect (the records'
same-seed residuals correlate 0.51-0.98; here 0.75), so the per-seed differences are the
replicates (rule ``paired_seeds``). 4000 replicates: a rate's simulation sd ≤ 0.8 points.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from learnable_sparsity.claims import checks, results_from_json

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


# The records' own noise of a validation-NLL gap (python -c in docs/claims.md): same-seed
# checkpoint residuals of two methods correlate 0.4-0.97, so the gap of a seed pair scatters by
# 0.003-0.012 nats about its own line (0.012 in the bible record), the pairs' own moves over the
# last half spread by up to 0.021 nats in the bible record (0.040 in the evidence record's
# sparsemax, whose gap closes in every pair), and the residuals of the evidence record's 8-point
# curves show no positive lag-1 autocorrelation (-0.52 to +0.13).
GAP_SCATTER = 0.012
PAIR_DRIFT_SD = 0.021
CHECKPOINT_STEPS = tuple(range(250, 1501, 250))  # the bible record's validation steps


def _gap_claim(
    rng: random.Random,
    comparisons: int,
    closing: float,
    rho: float = 0.0,
    drift_sd: float = PAIR_DRIFT_SD,
    flips_at: float = 0.0,
) -> bool:
    """Whether the gap gate holds back a claim of ``comparisons`` gaps of 0.15 nats that close
    by ``closing`` nats over the last half as 1/step, at the records' paired noise (``rho``: a
    lag-1 autocorrelation of each pair's checkpoint scatter, which the records do not show;
    ``drift_sd``: the spread of the pairs' own moves, run-to-run heterogeneity), each
    comparison's verdict flipping when the gap moves by ``flips_at`` of itself (0: no verdict,
    any move beyond rule still_improving is material)."""
    last = CHECKPOINT_STEPS[-1]
    shared = [[rng.gauss(0, 0.035) for _ in CHECKPOINT_STEPS] for _ in range(SEEDS)]
    learning = [2.8 + 1.5 * math.exp(-step / 400) for step in CHECKPOINT_STEPS]

    def curve(seed: int, gap: list[float]) -> list[tuple[float, float]]:
        return [
            (step, learning[j] + shared[seed][j] + gap[j])
            for j, step in enumerate(CHECKPOINT_STEPS)
        ]

    baseline = [curve(seed, [0.0] * len(CHECKPOINT_STEPS)) for seed in range(SEEDS)]
    gates = {}
    for i in range(comparisons):
        curves = []
        for seed in range(SEEDS):
            drift = rng.gauss(0, drift_sd)
            scatter = [rng.gauss(0, GAP_SCATTER)]
            for _ in CHECKPOINT_STEPS[1:]:
                fresh = rng.gauss(0, GAP_SCATTER)
                scatter.append(rho * scatter[-1] + math.sqrt(1 - rho * rho) * fresh)
            gap = [
                0.15 + wobble + drift * max(0.0, 2 * step / last - 1) + closing * (last / step - 1)
                for step, wobble in zip(CHECKPOINT_STEPS, scatter, strict=True)
            ]
            curves.append(curve(seed, gap))
        gates[f"v{i}"] = (curves, baseline)
    edge = {"statistic": 1.0, "threshold": 1.0 + flips_at, "distance": flips_at}
    verdicts = {name: checks.verdict(True, "simulated", edge=edge) for name in gates}
    held = checks.unsettled_each(gates, "validation NLL", verdicts if flips_at else None)
    return any(gate is not None for gate in held.values())


def _held_rate(runs: int, seed: int, **claim: float) -> float:
    rng = random.Random(seed)
    return sum(_gap_claim(rng, **claim) for _ in range(runs)) / runs  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("noise", "at_most"),
    [
        # measured (docs/claims.md, 1000 claims each): 2.8%, 3.3%, 2.2%, 3.8%, 4.5%
        ({}, 0.06),
        ({"drift_sd": 0.0}, 0.06),
        ({"rho": 0.5, "drift_sd": 0.0}, 0.06),
        ({"rho": 0.5}, 0.07),
        ({"drift_sd": 0.040}, 0.08),
    ],
)
def test_the_gap_gate_at_the_records_noise_blocks_a_claim_of_five_constant_gaps_rarely(
    noise: dict[str, float], at_most: float
) -> None:
    """Seed pairs as replicates (rule gap_trend_test): a claim of five constant gaps is held
    back at most at the gate's level whatever the pairs' own drifts (the checkpoint-replicate
    test it replaced: 9.3% at the records' noise, 18.3% with AR(1) ρ = 0.5 too), within the
    issue's 10% with the simulation's error (sd ≤ 0.8 points) to spare."""
    assert _held_rate(1000, 2, comparisons=5, closing=0.0, **noise) <= at_most


@pytest.mark.parametrize(("closing", "at_least", "at_most"), [(0.1, 0.45, 0.7), (0.2, 0.9, 1.0)])
def test_the_gap_gate_at_the_records_noise_holds_back_a_gap_closing_as_one_over_step(
    closing: float, at_least: float, at_most: float
) -> None:
    """A gap closing by ``closing`` nats over the last half as 1/step (as much again to come),
    no verdict to tie it to: held back in 55% / 96% (docs; 1000 claims). Three seed pairs give
    the test 2 degrees of freedom: the power the replicates cost (96% / 100% before)."""
    assert at_least <= _held_rate(400, 3, comparisons=1, closing=closing) <= at_most


@pytest.mark.parametrize(("closing", "at_most"), [(0.05, 0.02), (0.1, 0.13)])
def test_a_gap_that_cannot_flip_the_verdict_is_not_waited_for(
    closing: float, at_most: float
) -> None:
    """Rule gap_materiality: a verdict 4× the margin from its edge flips only if the gap (0.15
    nats) moves by 75% of itself (0.11); a gap still to close by 0.05 or 0.1 nats is judged
    (held back: 0.3% / 8.4%, 1000 claims; without the bound 20% / 55%), one to close by 0.2 is
    still waited for (below)."""
    assert _held_rate(400, 3, comparisons=1, closing=closing, flips_at=0.75) <= at_most


def test_a_gap_that_could_flip_the_verdict_is_still_waited_for() -> None:
    """Measured 90% (1000 claims): 0.2 nats to come against 0.11 that would flip it."""
    assert _held_rate(400, 3, comparisons=1, closing=0.2, flips_at=0.75) >= 0.8


def _record_gaps(name: str) -> dict[str, tuple[float, float]]:
    """Per comparison with softmax in a kept record: the gap's scatter about each seed pair's
    line (:func:`checks.gap_trend`) and the sd over pairs of each pair's own fitted move over
    the last half — the noise the simulations above are run at."""
    root = Path(__file__).resolve().parents[2] / "reports" / name / "results.json"
    results = results_from_json(json.loads(root.read_text()), str(root))
    measured = {}
    for corpus, curves in results.valid_nll.items():
        for variant, runs in curves.items():
            if variant == "softmax":
                continue
            trend = checks.gap_trend(runs, curves["softmax"])
            assert trend is not None
            measured[f"{corpus}/{variant}"] = (trend.noise, statistics.stdev(trend.moves))
    return measured


def test_the_simulated_gap_noise_is_the_bible_record_s() -> None:
    """GAP_SCATTER and PAIR_DRIFT_SD are the largest the bible record shows (α-entmax and
    1.5-entmax against softmax: scatter about each pair's line 0.0056-0.0122 nats, pairs' moves
    over the last half spread by up to 0.021)."""
    measured = _record_gaps("bible")
    scatter = max(noise for noise, _ in measured.values())
    drift = max(spread for _, spread in measured.values())
    assert scatter == pytest.approx(GAP_SCATTER, abs=0.0005)
    assert drift == pytest.approx(PAIR_DRIFT_SD, abs=0.0015)
