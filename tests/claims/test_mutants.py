"""The claim checks at the edges a mutation tool found untested (make mutation, reports/
measurements/claims_mutation): boundaries of each rule, the results a check must refuse to judge
without, the evidence and numbers a verdict records. Every expected value is worked out here by
hand or from a closed form (Student's t for 1, 2 and 4 degrees of freedom), not by the checks."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from scipy import stats

from learnable_sparsity.analysis.alpha import alpha_movement
from learnable_sparsity.claims import (
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    Results,
    ape_checks,
    checks,
    lvm_checks,
    nmt_checks,
)
from learnable_sparsity.errors import LearnableSparsityError

NAMES = ("entmax15", "softmax")
Check = Callable[[Results], checks.Verdict]


def _t_cdf_2(t: float) -> float:
    """Student's t distribution function with 2 degrees of freedom."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def _t_cdf_4(t: float) -> float:
    """Student's t distribution function with 4 degrees of freedom."""
    u = t / math.sqrt(t * t + 4)
    return 0.5 + 0.75 * u * (1 - u * u / 3)


# Three seeds a side, sd 1 each: Welch's t of a difference d of the means is d / sqrt(2/3) with
# 4 degrees of freedom.
P_ONE_BELOW = _t_cdf_4(-1 / math.sqrt(2 / 3))  # 0.144
P_TWO_BELOW = _t_cdf_4(-2 / math.sqrt(2 / 3))  # 0.035


def _assert_numbers(numbers: dict[str, object], expected: dict[str, object]) -> None:
    """The verdict's numbers: the expected keys, each value within pytest.approx of its own."""
    assert numbers.keys() == expected.keys()
    for key, value in expected.items():
        assert numbers[key] == pytest.approx(value), key


# ------------------------------------------------------------------------------ statistics


def test_describe_gives_the_mean_and_the_sd_over_seeds() -> None:
    assert checks.describe([]) == "no values"
    assert checks.describe([2.0]) == "2.00 (n=1)"
    assert checks.describe([1.0, 2.0]) == "1.50 ± 0.71 (n=2)"  # sd √0.5


def test_beside_stops_at_six_decimals() -> None:
    assert checks.beside(0.1234567, 0.1234568) == "0.123457"


def test_too_few_seeds_names_each_short_method() -> None:
    short = checks.too_few_seeds({"a": [1.0], "b": [1.0, 2.0], "c": [1.0, 2.0, 3.0]})
    assert short is not None and short.status == NOT_MEASURABLE
    decides = "3 seeds per method, whose spread then gives how many the claim needs"
    assert short.evidence == (
        "not measurable in this profile: seeds per method a: 1, b: 2; the test over seeds needs "
        f"3; what would decide it: {decides}"
    )
    assert short.numbers == {"seeds": {"a": 1, "b": 2}, "seeds_needed": 3, "decides": decides}


def test_missing_results_names_each_absent_result_and_why() -> None:
    missing = {"bleu": "bleu.json not found", "speed": "not timed", "heads": "x"}
    verdict = checks.missing_results(missing, "bleu", "speed", "alphas")
    assert verdict is not None and verdict.status == NOT_MEASURABLE
    assert verdict.evidence == (
        "no results: bleu (bleu.json not found); speed (not timed); what would decide it: a run "
        "whose stages write them (a record kept before a result existed cannot)"
    )
    assert checks.missing_results(missing, "alphas") is None


def test_a_verdict_keeps_its_numbers() -> None:
    assert checks.verdict(True, "e", gap=1.0).numbers == {"gap": 1.0}
    assert checks.verdict(False, "e").status == NOT_REPRODUCED


def test_all_of_joins_the_parts_evidence() -> None:
    ok = checks.verdict(True, "a", p=0.5)
    verdict = checks.all_of({"x": ok, "y": ok})
    assert verdict.evidence == "x: a; y: a"
    assert verdict.numbers == {
        "x": {"status": REPRODUCED, "p": 0.5},
        "y": {"status": REPRODUCED, "p": 0.5},
    }


def test_finite_drops_nan_and_infinity() -> None:
    assert checks.finite([1.0, float("nan"), float("inf"), 2, -float("inf")]) == [1.0, 2]


# ------------------------------------------------------------------------------ convergence


def test_still_improving_compares_the_mean_of_each_window() -> None:
    """Validation every 10 of 100 steps: the last fifth holds 90 and 100, the fifth before it 70
    and 80 (not 60, not 80 alone)."""
    values = {60: 3.0, 70: 2.4, 80: 1.6, 90: 1.2, 100: 0.8}
    curve = [(10 * k, 4.0) for k in range(1, 6)] + sorted(values.items())
    before, recent = (2.4 + 1.6) / 2, (1.2 + 0.8) / 2
    assert checks.still_improving(curve) == pytest.approx((before - recent) / before)


def test_a_sparse_curve_compares_the_last_point_with_the_one_before_the_window() -> None:
    """No point in the fifth before the last one (600-800 of 1000): the point just before the
    last fifth (500) is the reference, not an earlier one nor the mean of several."""
    curve = [(100, 3.0), (300, 2.0), (500, 1.5), (1000, 1.2)]
    assert checks.still_improving(curve) == pytest.approx((1.5 - 1.2) / 1.5)


def test_an_improvement_of_exactly_two_percent_is_converged() -> None:
    """Over the threshold means more than 2%: 50 → 49 is exactly 2% (1/50 is the float 0.02)."""
    assert checks.unconverged({"run": [(400, 50.0), (500, 49.0)]}, "loss") is None
    assert checks.unconverged({"run": [(400, 50.0), (500, 48.9)]}, "loss") is not None


def test_unconverged_compares_relatively_unless_told_the_loss_is_a_log_loss() -> None:
    """0.20 → 0.19 nats: 5% relative, 1% in perplexity."""
    curve = [(400, 0.20), (500, 0.19)]
    assert checks.unconverged({"run": curve}, "loss") is not None
    assert checks.unconverged({"run": curve}, "loss", log_loss=True) is None


def test_unconverged_names_the_run_that_improves_most() -> None:
    """ "a" improves by 10%, "b" by 5%; the evidence names "a" and records both."""
    curves = {"a": [(400, 10.0), (500, 9.0)], "b": [(400, 10.0), (500, 9.5)]}
    verdict = checks.unconverged(curves, "training loss")
    assert verdict is not None
    assert verdict.evidence == (
        "not measurable in this profile: 2 of 2 runs still improve (training loss 10.0% better "
        "over the last 20% of the steps in a); what would decide it: a longer run: if the "
        "improvement falls as 1/step, a improves by less than 2% after about 2,500 steps"
    )
    # a's 10% over the last fifth of 500 steps falls to 2% after 500 × 10% / 2% = 2500 steps
    assert verdict.numbers.pop("decides") == (
        "a longer run: if the improvement falls as 1/step, a improves by less than 2% after about "
        "2,500 steps"
    )
    _assert_numbers(
        verdict.numbers,
        {"still_improving": {"a": 0.1, "b": 0.05}, "converged_after_steps": 2500},
    )


# ------------------------------------------------------------------------------ the gap gate


def _two_pairs(slope: float, scatter: float) -> tuple[list, list]:
    """Two seed pairs validated at steps 9 and 10 (the last half of 10 steps holds both): the
    gaps (0.5 at step 9) rise by slope ± ``scatter`` from 9 to 10 in the two pairs. By hand:
    the pairs' moves over the window (5 steps) are 5 × (slope ± scatter), their mean 5 × slope,
    their sd 5 × scatter × √2, so se = 5 × scatter and t = slope / scatter with 1 degree of
    freedom; each pair's line passes through its two points (no residual); the gap at the last
    step is 0.5 + slope on average."""
    baseline = [[(9, 2.0), (10, 2.0)], [(9, 2.0), (10, 2.0)]]
    candidate = [
        [(9, 2.5), (10, 2.5 + slope + scatter)],
        [(9, 2.5), (10, 2.5 + slope - scatter)],
    ]
    return candidate, baseline


def test_gap_trend_by_hand_on_two_pairs_of_two_steps() -> None:
    trend = checks.gap_trend(*_two_pairs(0.2, 0.01))
    assert trend is not None
    assert (trend.points, trend.pairs, trend.df, trend.last_step) == (4, 2, 1, 10)
    assert trend.change == pytest.approx(1.0)
    assert trend.moves == pytest.approx((1.05, 0.95))
    assert trend.se == pytest.approx(0.05)
    assert trend.gap == pytest.approx(0.7)
    assert trend.noise == 0.0
    assert trend.still_to_move(0.5) == pytest.approx(1.0)
    assert trend.still_to_move(0.2) == pytest.approx(4.0)
    # t = 20 with 1 degree of freedom (Cauchy): two-sided p = 1 - 2 atan(20) / π
    assert trend.p == pytest.approx(1 - 2 * math.atan(20) / math.pi)


def test_gap_trend_is_untested_when_a_seed_pair_misses_a_curve() -> None:
    candidate, baseline = _two_pairs(0.2, 0.01)
    candidate.append([])
    baseline.append([(9, 2.0), (10, 2.0)])
    assert checks.gap_trend(candidate, baseline) is None


def test_the_gap_gate_names_the_comparison_with_the_smallest_p() -> None:
    """Both move (p = 0.013 and 0.006, below 2.5% each); "b" has the clearer trend (t = 100
    against t = 50) and is the one named."""
    comparisons = {"a": _two_pairs(0.2, 0.004), "b": _two_pairs(0.2, 0.002)}
    gate = checks.unsettled(comparisons, "validation NLL")
    assert gate is not None and "2 of 2 comparisons (b: by" in gate.evidence
    assert gate.numbers["gate_opens_after_steps"] == pytest.approx(10 * 1.0 / math.log(1.02))


def test_the_gap_gate_names_the_comparisons_it_cannot_test() -> None:
    candidate, baseline = _two_pairs(0.2, 0.01)
    gate = checks.unsettled(
        {"a": ([], []), "b": (candidate, baseline), "c": ([], [])}, "validation NLL"
    )
    decides = (
        "runs of both methods with the same seeds (two or more), validated at least twice over "
        "the last 50% of their steps"
    )
    assert gate is not None
    assert gate.numbers == {"gap_untested": ["a", "c"], "decides": decides}
    assert gate.evidence == (
        "not measurable in this profile: the validation NLL gap's trend cannot be tested in a, "
        "c (too few validation points in the last 50% of the steps, or fewer than two seed "
        f"pairs); what would decide it: {decides}"
    )


# ------------------------------------------------------------------------------ comparisons


@pytest.mark.parametrize(("shift", "words"), [(0.0, "better by 0.00;"), (0.5, "better by 0.50;")])
def test_at_least_as_good_says_better_for_a_mean_not_below(shift: float, words: str) -> None:
    """Paired seeds that differ by the same ``shift`` each: the deficit's bounds are −shift."""
    candidate = [80.0 + shift, 81.0 + shift, 82.0 + shift]
    verdict = checks.at_least_as_good(candidate, [80.0, 81.0, 82.0], 1.0, names=NAMES, paired=True)
    assert verdict.status == REPRODUCED and words in verdict.evidence
    assert verdict.numbers["deficit_bounds"] == [-shift, -shift]
    assert verdict.numbers["edge"] == {"statistic": -shift, "threshold": 1.0, "distance": 1 + shift}


def test_at_least_as_good_bounds_welch_s_deficit() -> None:
    """Three seeds a side, sd 1, equal means: Welch's se √(2/3), 4 df, t₀.₉₅ = 2.132; the
    deficit's upper bound 1.74 lies above a margin of 1 and its lower bound −1.74 below it."""
    verdict = checks.at_least_as_good([80.0, 81.0, 82.0], [80.0, 81.0, 82.0], 1.0, names=NAMES)
    reach = 2.131847 * math.sqrt(2 / 3)
    assert verdict.status == NOT_MEASURABLE
    assert verdict.numbers["deficit_bounds"] == pytest.approx([-reach, reach])
    assert verdict.numbers["p_refutes"] == pytest.approx(1 - _t_cdf_4(-1 / math.sqrt(2 / 3)))
    assert "(the estimate's distance 1 from the edge" in verdict.evidence
    at_2 = checks.at_least_as_good([80.0, 81.0, 82.0], [80.0, 81.0, 82.0], 2.0, names=NAMES)
    assert at_2.status == REPRODUCED  # 1.74 < 2


@pytest.mark.parametrize(
    ("shift", "status", "words"),
    [(0.0, NOT_MEASURABLE, "worse by 0.00;"), (0.5, NOT_REPRODUCED, "better by 0.50;")],
)
def test_worse_by_at_most_says_better_only_for_a_mean_above(
    shift: float, status: str, words: str
) -> None:
    """Paired, the same ``shift`` each seed: a deficit of exactly 0 lies on the edge (neither
    side shown), a candidate 0.5 better is shown not below."""
    candidate = [80.0 + shift, 81.0 + shift, 82.0 + shift]
    verdict = checks.worse_by_at_most(candidate, [80.0, 81.0, 82.0], 2.0, names=NAMES, paired=True)
    assert verdict.status == status and words in verdict.evidence


def test_worse_by_at_most_reads_a_lower_is_better_metric() -> None:
    """TER 22 against 20 in each seed: 2 points worse, inside (0, 3) with certainty; inside
    (0, 2) it is on the edge."""
    worse, base = [21.0, 22.0, 23.0], [19.0, 20.0, 21.0]
    verdict = checks.worse_by_at_most(
        worse, base, 3.0, higher_is_better=False, names=NAMES, paired=True
    )
    assert verdict.status == REPRODUCED
    assert verdict.numbers["gap"] == -2.0 and verdict.numbers["deficit_bounds"] == [2.0, 2.0]
    assert verdict.numbers["edge"] == {"statistic": 2.0, "threshold": 3.0, "distance": 1.0}
    at_edge = checks.worse_by_at_most(
        worse, base, 2.0, higher_is_better=False, names=NAMES, paired=True
    )
    assert at_edge.status == NOT_MEASURABLE


def test_significantly_below_records_its_bounds() -> None:
    verdict = checks.significantly_below([77.0, 78.0, 79.0], [79.0, 80.0, 81.0], names=NAMES)
    assert verdict.status == REPRODUCED
    assert verdict.evidence == (
        "entmax15 78.00 ± 1.00 (n=3) vs softmax 80.00 ± 1.00 (n=3), Welch: softmax − entmax15 "
        "+2, one-sided 95% bounds +0.259 / +3.74 (df 4.0)"
    )
    reach = 2.131847 * math.sqrt(2 / 3)
    assert verdict.numbers["bounds"] == pytest.approx([2 - reach, 2 + reach])
    assert verdict.numbers["p_refutes"] == pytest.approx(1 - P_TWO_BELOW)
    paired = checks.significantly_below(
        [77.0, 78.0, 79.5], [79.0, 80.0, 81.0], names=NAMES, paired=True
    )
    assert paired.numbers["paired"] and "paired by seed" in paired.evidence


# One sample of three, sd 1, two below (above) a value: t = ∓2√3 with 2 degrees of freedom.
P_AGAINST_VALUE = _t_cdf_2(-2 * math.sqrt(3))  # 0.037


@pytest.mark.parametrize(
    ("check", "values", "side"),
    [
        (checks.significantly_below_value, [1.0, 2.0, 3.0], "below"),
        (checks.significantly_above_value, [5.0, 6.0, 7.0], "above"),
    ],
)
def test_a_one_sample_test_against_a_value(
    check: Callable[..., checks.Verdict], values: list[float], side: str
) -> None:
    verdict = check(values, 4.0, names=("TER", "do nothing"))
    assert verdict.status == REPRODUCED
    mean = sum(values) / 3
    assert verdict.evidence == (
        f"TER {mean:.2f} ± 1.00 (n=3) vs do nothing 4.00: TER {side} do nothing by +2, one-sided "
        "95% bounds +0.314 / +3.69 (df 2.0) (one-sample)"
    )
    assert verdict.numbers["p_refutes"] == pytest.approx(1 - P_AGAINST_VALUE)


@pytest.mark.parametrize(
    ("check", "values", "status", "gap"),
    [
        (checks.significantly_below_value, [2.0] * 3, REPRODUCED, 1.0),
        (checks.significantly_above_value, [2.0] * 3, NOT_REPRODUCED, -1.0),
        (checks.significantly_below_value, [3.0] * 3, NOT_MEASURABLE, 0.0),  # on the edge
        (checks.significantly_above_value, [3.0] * 3, NOT_MEASURABLE, 0.0),
        (checks.significantly_above_value, [4.0] * 3, REPRODUCED, 1.0),
    ],
)
def test_seeds_without_spread_against_a_value_are_decided_by_their_side(
    check: Callable[..., checks.Verdict], values: list[float], status: str, gap: float
) -> None:
    verdict = check(values, 3.0)
    assert verdict.status == status and verdict.numbers["bounds"] == [gap, gap]


def test_a_test_against_a_value_names_the_seeds_it_lacks() -> None:
    verdict = checks.significantly_below_value([1.0, 2.0], 3.0, names=("TER", "do nothing"))
    assert verdict.status == NOT_MEASURABLE and "seeds per method TER: 2;" in verdict.evidence


@pytest.mark.parametrize(
    ("values", "status", "words"),
    [([2.0, 2.0, 2.0], REPRODUCED, "(at most 2)"), ([3.0, 3.0, 3.0], NOT_REPRODUCED, "(above 2)")],
)
def test_mean_at_most_includes_its_bound(values: list[float], status: str, words: str) -> None:
    verdict = checks.mean_at_most(values, 2.0, "calls")
    assert verdict.status == status
    assert verdict.evidence == f"calls {values[0]:.2f} ± 0.00 (n=3) {words}"
    edge = {"statistic": values[0], "threshold": 2.0, "distance": 2.0 - values[0]}
    assert verdict.numbers == {"values": values, "bound": 2.0, "edge": edge}


# ------------------------------------------------------------------------------ rounds
# Five rounds: the quartiles (inclusive method) are the second and the fourth smallest.

# What decides rounds that straddle a bound: rounds with less spread, not more of them.
QUIETER = (
    "timing rounds with less spread (a machine without other work, or a GPU profile); more "
    "rounds estimate the interquartile range better but do not narrow it"
)


@pytest.mark.parametrize(
    ("rounds", "status"),
    [
        ([0.75] * 5, REPRODUCED),  # on the lower edge of 1 ± 0.25
        ([1.25] * 5, REPRODUCED),  # on the upper edge
        ([1.5] * 5, NOT_REPRODUCED),  # wholly above
        ([0.5, 0.6, 0.7, 0.75, 0.8], NOT_MEASURABLE),  # IQR 0.6-0.75: reaches the lower edge
        ([1.2, 1.25, 1.3, 1.4, 1.5], NOT_MEASURABLE),  # IQR 1.25-1.4: reaches the upper edge
    ],
)
def test_ratio_near_one_counts_its_edges_inside_the_band(rounds: list[float], status: str) -> None:
    assert checks.ratio_near_one(rounds, 0.25, "ratio").status == status


@pytest.mark.parametrize(
    ("rounds", "edge"),
    [
        ([0.5, 0.6, 0.7, 0.75, 0.8], "0.75"),
        ([1.2, 1.25, 1.3, 1.4, 1.5], "1.25"),
        ([0.7, 0.75, 1.0, 1.3, 1.4], "1.25"),  # IQR 0.75-1.3: in at the bottom, out at the top
    ],
)
def test_ratio_near_one_names_the_edge_its_rounds_straddle(rounds: list[float], edge: str) -> None:
    verdict = checks.ratio_near_one(rounds, 0.25, "ratio")
    assert verdict.status == NOT_MEASURABLE
    assert verdict.evidence.endswith(
        f"; the rounds' interquartile range straddles {edge}: the rounds cannot tell whether the "
        f"ratio is within the band; what would decide it: {QUIETER}"
    )
    assert verdict.numbers.pop("decides") == QUIETER
    _assert_numbers(
        verdict.numbers,
        {"median": rounds[2], "quartiles": [rounds[1], rounds[3]], "rounds": rounds},
    )


def test_ratio_near_one_records_its_rounds() -> None:
    verdict = checks.ratio_near_one([0.9, 0.95, 1.0, 1.05, 1.1], 0.25, "train tokens/s ratio")
    assert verdict.status == REPRODUCED
    assert verdict.evidence == (
        "train tokens/s ratio median 1.00 (IQR 0.950–1.050) over 5 rounds; near 1 means within "
        "±0.25 (0.75–1.25)"
    )
    _assert_numbers(
        verdict.numbers,
        {"median": 1.0, "quartiles": [0.95, 1.05], "rounds": [0.9, 0.95, 1.0, 1.05, 1.1]},
    )


@pytest.mark.parametrize(
    ("rounds", "status"),
    [
        ([1.5] * 5, REPRODUCED),  # at the floor
        ([1.0, 1.2, 1.4, 1.5, 1.6], NOT_MEASURABLE),  # IQR 1.2-1.5 reaches the floor
        ([1.0, 1.1, 1.2, 1.3, 1.4], NOT_REPRODUCED),  # wholly below
    ],
)
def test_ratio_at_least_counts_its_floor_as_reached(rounds: list[float], status: str) -> None:
    verdict = checks.ratio_at_least(rounds, 1.5, "ratio")
    assert verdict.status == status
    if status == NOT_MEASURABLE:
        assert verdict.numbers.pop("decides") == QUIETER
    _assert_numbers(
        verdict.numbers,
        {"median": rounds[2], "quartiles": [rounds[1], rounds[3]], "rounds": rounds, "floor": 1.5},
    )


def test_ratio_at_least_says_where_its_rounds_straddle_the_floor() -> None:
    verdict = checks.ratio_at_least([1.0, 1.2, 1.4, 1.5, 1.6], 1.5, "a/b tokens/s")
    assert verdict.evidence == (
        "a/b tokens/s median 1.40 (IQR 1.200–1.500) over 5 rounds; at least 1.5 needed; the "
        "rounds' interquartile range straddles 1.5: the rounds cannot tell on which side the "
        f"ratio lies; what would decide it: {QUIETER}"
    )


def test_lowest_decides_between_two_variants() -> None:
    verdict = checks.lowest({"a": [0.5] * 5, "b": [1.0] * 5}, "a", "train speed")
    assert verdict.status == REPRODUCED
    assert verdict.evidence == (
        "train speed (median ratio to softmax over the rounds, IQR): a 0.50 (0.50–0.50), "
        "b 1.00 (1.00–1.00)"
    )
    assert verdict.numbers == {"order": ["a", "b"]}


def test_lowest_records_the_tie_it_cannot_break() -> None:
    rounds = {"a": [0.5, 0.6, 0.7, 0.8, 0.9], "b": [0.7, 0.8, 0.9, 1.0, 1.1], "c": [2.0] * 5}
    verdict = checks.lowest(rounds, "a", "train speed")
    assert verdict.status == NOT_MEASURABLE
    assert verdict.numbers == {"order": ["a", "b", "c"], "tie": ["a", "b"], "decides": QUIETER}
    assert verdict.evidence.endswith(
        "; a and b are within the rounds' spread (their interquartile ranges overlap): the "
        f"rounds cannot tell which is slower; what would decide it: {QUIETER}"
    )


# ------------------------------------------------------------------------------ what is missing
# Each check refuses to judge without the results it reads, naming them and why they are absent.

CHECKS_AND_THEIR_RESULTS = [
    (lambda r: nmt_checks.bleu_at_least_as_good(r, ["entmax15"], "softmax", 1.0), "bleu"),
    (lambda r: nmt_checks.bleu_a_little_below(r, "sparsemax", "softmax", 4.1), "bleu"),
    (lambda r: nmt_checks.speed_near_softmax(r, "topk", 0.1, 0.1), "speed"),
    (lambda r: nmt_checks.trains_at_least(r, "entmax15", 0.82), "speed"),
    (lambda r: nmt_checks.decodes_faster(r, "topk", "sparsemax", 1.5), "speed"),
    (lambda r: nmt_checks.slowest(r, "entmax_alpha"), "speed"),
    (lambda r: nmt_checks.alpha_modes(r, ["encoder"], ["decoder"], 1.5, 1.2), "alphas"),
    (lambda r: nmt_checks.heads_dense_then_sparse(r, 0.1, 0.35, 100), "alphas"),
    (
        lambda r: nmt_checks.heads_dense_then_sparse(
            Results(missing=r.missing, alpha_trajectories=[[(50, [1.5]), (100, [1.5])]]),
            0.1,
            0.35,
            100,
        ),
        "target_tokens",
    ),
    (lambda r: nmt_checks.sparse_heads_more_diverse(r, ["entmax15"], "softmax"), "heads"),
    (lambda r: nmt_checks.head_roles_exist(r, "entmax_alpha", ["bpe"], ["softmax"]), "heads"),
    (lambda r: nmt_checks.roles_more_confident(r, "entmax_alpha", "softmax", ["bpe"]), "heads"),
    (
        lambda r: nmt_checks.roles_more_confident(r, "entmax_alpha", "softmax", ["bpe"]),
        "role_confidence",
    ),
    (lambda r: nmt_checks.adaptive_sparsity(r, "entmax_alpha", "entmax15", "topk", 0.5), "heads"),
    (
        lambda r: nmt_checks.adaptive_sparsity(r, "entmax_alpha", "entmax15", "topk", 0.5),
        "density",
    ),
    (
        lambda r: lvm_checks.marginalization_matches_dense(
            r, "ssvae", "accuracy", "sparsemax", "dense", 0.01, 10
        ),
        "ssvae",
    ),
    (lambda r: lvm_checks.methods_below(r, "ssvae", "accuracy", ["sfe"], "dense"), "ssvae"),
    (lambda r: lvm_checks.nll_at_or_below(r, "bits", ["sparsemap"], ["sfe"], 0.1, [8]), "bits"),
    (lambda r: lvm_checks.calls_fall(r, "ssvae", "sparsemax", 1.5), "lvm_calls"),
    (lambda r: ape_checks.ape_below_do_nothing(r, ["bert"], "test"), "ape"),
    (lambda r: ape_checks.ape_above_do_nothing(r, ["bert"], "test"), "ape"),
    (lambda r: ape_checks.ape_bleu_above_do_nothing(r, ["bert"], "test"), "ape"),
    (lambda r: ape_checks.ape_bleu_above_do_nothing(r, ["bert"], "test"), "ape_bleu"),
    (lambda r: ape_checks.ape_ter_below(r, "bert", ["dual"], "test"), "ape"),
    (lambda r: ape_checks.ape_best_of(r, "bert", ["dual"], "test", 1.0), "ape"),
    (lambda r: ape_checks.ape_nearly_as_good(r, "bert", "dual", "test", 1.0), "ape"),
]


@pytest.mark.parametrize(("check", "result"), CHECKS_AND_THEIR_RESULTS)
def test_a_check_without_its_results_names_them(check: Check, result: str) -> None:
    verdict = check(Results(missing={result: "not in this record"}))
    assert verdict.status == NOT_MEASURABLE
    assert f"no results: {result} (not in this record)" in verdict.evidence


# ------------------------------------------------------------------------------ NMT

FLAT = [(100, 2.0), (200, 1.5), (300, 1.4), (400, 1.39), (500, 1.39)]
# Closes a gap to FLAT by 0.3 nats over the last half, exactly linearly.
CLOSING = [(100, 4.0), (200, 3.0), (300, 2.2), (400, 1.8), (500, 1.5)]


def _bleu(corpus_a: dict[str, list[float]], moving: str) -> Results:
    """BLEU on corpora "a" and "b" alike; on "a" every variant's validation curves are FLAT, on
    "b" ``moving``'s close the gap to the others'."""
    return Results(
        bleu={"a": corpus_a, "b": corpus_a},
        valid_nll={
            "a": {v: [FLAT] * 3 for v in corpus_a},
            "b": {v: [CLOSING if v == moving else FLAT] * 3 for v in corpus_a},
        },
    )


def test_a_bleu_comparison_waits_only_on_its_own_corpus() -> None:
    results = _bleu({"entmax15": [79.0, 80.0, 81.0], "softmax": [80.0, 81.0, 82.0]}, "entmax15")
    # margin 2% of softmax's 81: 1.62 BLEU against a deficit of 1, which the gap on "b"
    # (0.095 nats, still closing by 0.86) could flip
    verdict = nmt_checks.bleu_at_least_as_good(results, ["entmax15"], "softmax", 0.02)
    assert verdict.numbers["a/entmax15"]["status"] == REPRODUCED
    assert verdict.numbers["b/entmax15"]["status"] == NOT_MEASURABLE
    assert "a/entmax15: entmax15 80.00 ± 1.00 (n=3) vs softmax 81.00" in verdict.evidence
    results = _bleu({"sparsemax": [77.0, 78.0, 79.0], "softmax": [79.0, 80.0, 81.0]}, "sparsemax")
    verdict = nmt_checks.bleu_a_little_below(results, "sparsemax", "softmax", 2.0)
    assert verdict.numbers["a/sparsemax"]["status"] == REPRODUCED
    assert verdict.numbers["b/sparsemax"]["status"] == NOT_MEASURABLE
    assert "a/sparsemax: sparsemax 78.00 ± 1.00 (n=3) vs softmax 80.00" in verdict.evidence


def test_a_bleu_comparison_without_the_baselines_curves_is_not_measurable() -> None:
    results = Results(
        bleu={"a": {"entmax15": [80.0, 81.0, 82.0], "softmax": [80.0, 81.0, 82.0]}},
        valid_nll={"a": {"entmax15": [FLAT] * 3}},
    )
    verdict = nmt_checks.bleu_at_least_as_good(results, ["entmax15"], "softmax", 1.0)
    assert verdict.status == NOT_MEASURABLE and "cannot be tested in a/entmax15" in verdict.evidence


def test_matched_nll_steps_reach_the_baselines_last_value() -> None:
    """Softmax ends at 2.0 (after 3.0): each α-entmax seed's first step at or below 2.0. A
    corpus without softmax curves has no target."""
    results = Results(
        valid_nll={
            "x": {"entmax15": [[(1, 3.0)]]},
            "y": {
                "softmax": [[(1, 3.0), (2, 2.0)]],
                "entmax15": [[(1, 2.5), (2, 1.9)], [(1, 2.0), (2, 1.5)]],
            },
        }
    )
    assert nmt_checks.matched_nll_steps(results) == {"y": {"softmax": [2], "entmax15": [2, 1]}}


def _modes_results() -> Results:
    two_modes = [1.1 + 0.01 * (i % 5) for i in range(30)] + [
        1.9 - 0.01 * (i % 5) for i in range(30)
    ]
    return Results(
        final_alphas={
            "encoder": two_modes,
            "constant": [1.5] * 6,
            "decoder": [1.1, 1.3, 1.5, 1.7],  # as few as a modality test takes
        }
    )


def test_alpha_modes_judges_every_attention_type_it_can() -> None:
    verdict = nmt_checks.alpha_modes(
        _modes_results(), ["encoder"], ["constant", "decoder"], 1.5, 1.2
    )
    assert verdict.numbers["constant"] == {
        "status": NOT_MEASURABLE,
        "decides": "at least 4 learned α in constant, not all equal (more layers, heads or seeds)",
    }
    for kind in ("encoder", "decoder"):
        assert verdict.numbers[kind].keys() == {"status", "dip", "p_unimodal", "modes"}
    assert verdict.numbers["encoder"]["status"] == REPRODUCED
    assert verdict.numbers["encoder"]["modes"] == pytest.approx([1.12, 1.88], abs=0.01)
    assert verdict.numbers["decoder"]["status"] == REPRODUCED
    assert "for one mode (rejected at 0.05)" in verdict.evidence
    assert "for one mode (not rejected at 0.05)" in verdict.evidence


def _alpha_move(before: float, after: float) -> float:
    """A head's move read in its logit, by hand: α = 1.01 + 0.99 σ(w), times the steepest
    slope dα/dw = 0.99 / 4."""

    def logit(alpha: float) -> float:
        share = (alpha - 1.01) / 0.99
        return math.log(share / (1 - share))

    return abs(logit(after) - logit(before)) * 0.99 / 4


def _seed(before: list[float], after: list[float]) -> list[tuple[float, list[float]]]:
    return [(800, before), (1000, after)]


def _rising(*moves: float) -> Results:
    """Seeds of 6 heads at α 1.5 logged at 800, 900 and 1000, each seed's heads all rising
    linearly by its ``moves``."""
    return Results(
        alpha_trajectories=[
            [(t, [1.5 + move * (t - 800) / 200] * 6) for t in (800, 900, 1000)] for move in moves
        ]
    )


def _t_df2_p(moves: tuple[float, float, float]) -> float:
    """Two-sided p of a one-sample t-test of three values' mean, by hand: with df 2 the t
    distribution's tail is P(T > t) = (1 − t/√(t² + 2))/2."""
    mean = sum(moves) / 3
    sd = math.sqrt(sum((m - mean) ** 2 for m in moves) / 2)
    t = abs(mean) / (sd / math.sqrt(3))
    return 1 - t / math.sqrt(t * t + 2)


def test_the_alpha_gate_tests_the_seeds_common_moves() -> None:
    """Rule alpha_drift_test: each seed's mean α fitted by its line, the seeds' moves tested
    by a t-test (df = seeds − 1) at alpha_drift_level, beyond alpha_drift_material. One seed
    rising 0.003 (beyond 0.002) holds α back untested, 0.0015 does not; three seeds rising
    0.0025 / 0.003 / 0.0035 (p = 0.009) hold it back; 0.003 beside two seeds that did not move
    (mean 0.001), or 0.003 / 0.003 / −0.003, is too small; 0 / 0.003 / 0.006 (mean 0.003,
    p = 0.23) is not significant."""
    gate = nmt_checks._alpha_still_moving(_rising(0.003))
    assert gate is not None
    common = gate.numbers["alpha_common_drift"]
    assert common["moves"] == pytest.approx([0.003])
    assert common["p"] is None and common["blocks"] is True
    assert gate.numbers["alpha_drift"] == pytest.approx([_alpha_move(1.5, 1.503)])
    assert nmt_checks._alpha_still_moving(_rising(0.0015)) is None
    moves = (0.0025, 0.003, 0.0035)
    gate = nmt_checks._alpha_still_moving(_rising(*moves))
    assert gate is not None
    common = gate.numbers["alpha_common_drift"]
    assert common["moves"] == pytest.approx(list(moves))
    assert common["change"] == pytest.approx(0.003)
    assert common["p"] == pytest.approx(_t_df2_p(moves)) and _t_df2_p(moves) < 0.01
    for settled in ((0.003, 0.0, 0.0), (0.003, 0.003, -0.003), (0.0, 0.003, 0.006)):
        assert nmt_checks._alpha_still_moving(_rising(*settled)) is None
    assert _t_df2_p((0.0, 0.003, 0.006)) == pytest.approx(0.225, abs=1e-3)


def test_a_wobble_every_head_shares_is_scatter_about_the_seeds_line() -> None:
    """Three seeds of 8 heads at α 1.5, logged every 20 steps from 800 to 1000, every head of a
    seed shifted alike by −0.005, +0.00625, −0.00625, +0.005 at 800, 820, 980, 1000 (a shared
    wobble, zero-mean in time and without a slope: Σ(t − t̄)·shift = 0): every head rose by
    0.01 from the window's first logged α to its last, which the sign test rule
    alpha_drift_test replaced took for a drift in every seed (8 of 8, p = 2⁻⁷ < 5%/3, beyond
    0.002); each seed's line through its mean α does not move. A real rise of 0.01 in every
    seed, with the same wobble, holds α back."""
    wobble = {800: -0.005, 820: 0.00625, 980: -0.00625, 1000: 0.005}

    def seeds(rise: float) -> Results:
        return Results(
            alpha_trajectories=[
                [(t, [1.5 + wobble.get(t, 0.0) + rise * (t - 800) / 200] * 8) for t in steps]
                for steps in [range(800, 1001, 20)] * 3
            ]
        )

    assert nmt_checks._alpha_still_moving(seeds(0.0)) is None
    gate = nmt_checks._alpha_still_moving(seeds(0.01))
    assert gate is not None
    assert gate.numbers["alpha_common_drift"]["moves"] == pytest.approx([0.01] * 3)


def test_the_alpha_gate_gives_both_of_its_reasons() -> None:
    gate = nmt_checks._alpha_still_moving(Results(alpha_trajectories=[_seed([1.3] * 6, [1.5] * 6)]))
    assert gate is not None
    assert gate.evidence == (
        "not measurable in this profile: over the last 20% of the steps α still moves by "
        f"{_alpha_move(1.3, 1.5):.3f} on average per head (read in its logit; settled: at most "
        "0.02) and its heads still drift together (the mean α of a seed's heads rose by 0.2000 "
        "(its line's move per seed +0.2000; one seed with a line: no spread to test against; "
        "beyond 0.002 in α)); what would decide it: a longer run: if α's move falls as 1/step, "
        "it settles "
        # moves over the last fifth of 1000 steps falling as 1/step: the mean move per head
        # (0.21) within 0.02 at 1000 × 0.21 / 0.02, the common move 0.2 within 0.002 at
        # 1000 × 0.2 / 0.002 — the later
        "after about 100,000 steps, and its heads no longer drift one way together"
    )


def _dense_then_sparse(trajectory: list, tokens: list[float], steps: list[float]) -> Results:
    """One α trajectory, and runs of α-entmax on corpus "s" that trained ``tokens`` target tokens
    in ``steps`` steps (their validation curves end there)."""
    return Results(
        alpha_trajectories=[trajectory],
        target_tokens={"s": {"entmax_alpha": tokens}},
        valid_nll={"s": {"entmax_alpha": [[(n / 2, 2.0), (n, 1.9)] for n in steps]}},
    )


def test_dense_then_sparse_is_judged_at_exactly_its_length_with_its_magnitudes() -> None:
    """Dips / rebounds: head 0 0.2 / 0.4, head 1 0.12 / 0.5, head 2 0.2 / 0.32, head 3 none;
    α then stays (from 150 to 1000 steps: settled). At a dip of 0.15 and a rebound of 0.3 heads 0
    and 2 count; at 0.15 and 0.39 head 0 alone. The run trained 8000 target tokens in 1000
    steps: judged after 8000, not after 8001 (which 1000 × 8001 / 8000 steps would reach)."""
    after = [1.7, 1.88, 1.62, 1.5]
    trajectory = [
        (50, [1.5, 1.5, 1.5, 1.5]),
        (100, [1.3, 1.38, 1.3, 1.5]),
        (150, after),
        (800, after),
        (1000, after),
    ]
    results = _dense_then_sparse(trajectory, [8000.0], [1000])
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.15, 0.3, 8000)
    assert verdict.numbers == {"per_seed": [2], "counted_heads_still_moving": 0}
    assert verdict.status == REPRODUCED
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.15, 0.39, 8000)
    assert verdict.numbers == {"per_seed": [1], "counted_heads_still_moving": 0}
    assert verdict.status == REPRODUCED
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.15, 0.39, 8001)
    assert verdict.status == NOT_MEASURABLE
    _assert_numbers(
        verdict.numbers,
        {
            "target_tokens": [8000],
            "steps_needed": 1000.125,
            "decides": "a run of about 1,000 steps of this run's batches",
        },
    )


def _js(*means: float) -> list[dict[str, float | None]]:
    return [{"encoder.self": mean, "decoder.context": None} for mean in means]


def test_head_diversity_judges_each_variant_with_an_analysis() -> None:
    results = Results(js={"entmax15": _js(0.4, 0.41, 0.39), "softmax": _js(0.2, 0.21, 0.19)})
    verdict = nmt_checks.sparse_heads_more_diverse(results, ["sparsemax", "entmax15"], "softmax")
    assert verdict.numbers["sparsemax"] == {
        "status": NOT_MEASURABLE,
        "decides": "a head analysis of sparsemax and softmax",
    }
    assert verdict.numbers["entmax15"]["status"] == REPRODUCED
    assert "entmax15: softmax 0.20 ± 0.01 (n=3) vs entmax15 0.40" in verdict.evidence
    alone = Results(js={"entmax15": _js(0.4, 0.41, 0.39)})
    verdict = nmt_checks.sparse_heads_more_diverse(alone, ["entmax15"], "softmax")
    assert verdict.status == NOT_MEASURABLE and "no head analysis of entmax15" in verdict.evidence


def test_head_diversity_pairs_the_variants_by_seed() -> None:
    """Seeds far apart in JS, the variant a little above softmax within each: only the test
    paired by seed sees it."""
    results = Results(js={"entmax15": _js(0.11, 0.52, 0.909), "softmax": _js(0.1, 0.5, 0.9)})
    verdict = nmt_checks.sparse_heads_more_diverse(results, ["entmax15"], "softmax")
    assert verdict.status == REPRODUCED and "paired by seed" in verdict.evidence


def test_head_roles_skip_what_they_cannot_judge_and_count_a_single_head() -> None:
    """A role the corpus cannot show and one no model has are skipped; one softmax head with the
    previous-token role, none in α-entmax: not reproduced. Curves ending at the same step are
    the same length, whatever came before and wherever a corpus lacks a variant."""
    results = Results(
        roles={
            "entmax_alpha": {"bpe": [None], "none": [0, 0, 0], "previous": [0, 0, 0]},
            "softmax": {"bpe": [None], "none": [0, 0, 0], "previous": [1, 0, 0]},
        },
        valid_nll={
            "smoke": {
                "entmax_alpha": [[(100, 3.0), (200, 2.5)]],
                "softmax": [[(50, 3.1), (200, 2.6)]],
            },
            "other": {"softmax": [[(100, 3.0), (200, 2.4)]]},
        },
    )
    verdict = nmt_checks.head_roles_exist(
        results, "entmax_alpha", ["bpe", "none", "previous"], ["softmax"]
    )
    assert verdict.numbers["bpe"]["status"] == NOT_MEASURABLE
    assert verdict.numbers["none"]["status"] == NOT_MEASURABLE
    assert verdict.numbers["previous"] == {
        "status": NOT_REPRODUCED,
        "counts": {"entmax_alpha": [0, 0, 0], "softmax": [1, 0, 0]},
    }


def test_role_confidence_compares_the_roles_it_can() -> None:
    """α-entmax has no head analysis of its roles here; softmax holds the previous-token role."""
    results = Results(
        roles={"softmax": {"previous": [1, 1, 1], "rare": [0, 0, 0]}},
        role_confidence={
            "entmax_alpha": {"bpe": [None], "rare": [0.5] * 3, "previous": [0.9, 0.92, 0.91]},
            "softmax": {"bpe": [None], "rare": [0.5] * 3, "previous": [0.7, 0.72, 0.71]},
        },
    )
    verdict = nmt_checks.roles_more_confident(
        results, "entmax_alpha", "softmax", ["bpe", "rare", "previous"]
    )
    assert verdict.numbers["bpe"]["status"] == NOT_MEASURABLE
    assert verdict.numbers["rare"]["status"] == NOT_MEASURABLE
    assert verdict.numbers["previous"]["status"] == REPRODUCED
    assert "previous: softmax 0.71 ± 0.01 (n=3) vs entmax_alpha 0.91" in verdict.evidence


def test_adaptive_sparsity_names_what_each_part_compares() -> None:
    def seeds(heads: list[float], within: list[float]) -> list[dict[str, list[float | None]]]:
        return [{"heads": heads, "within_length_sd": within}] * 3

    results = Results(
        density={
            "entmax_alpha": seeds([0.2, 0.5, 0.8], [0.1, 0.2, 0.3]),
            "entmax15": seeds([0.5, 0.5, 0.5], [0.1, 0.1, 0.1]),
            "topk": seeds([0.5, 0.5, 0.5], [0.0, 0.0, 0.0]),
        }
    )
    verdict = nmt_checks.adaptive_sparsity(results, "entmax_alpha", "entmax15", "topk", 0.5)
    # keys at 0: 1 - 0.5 in both; within-length sd 0.2 (mean of 0.1, 0.2, 0.3) against 0.1
    assert (
        "sparse: keys at 0 0.500 ± 0.000 (n=3) vs 0.5 × 0.500 ± 0.000 (n=3) = 0.250; "
        in verdict.evidence
    )
    assert "; per head: entmax15 head-density sd 0.00 ± 0.00 (n=3) vs entmax_alpha" in (
        verdict.evidence
    )
    assert (
        "; per input, against entmax15: within-length density sd 0.200 ± 0.000 (n=3) vs 0.5 × "
        "0.100 ± 0.000 (n=3) = 0.050; per input, against topk: topk within-length sd 0.00 ± "
        "0.00 (n=3) vs entmax_alpha within-length sd 0.20 ± 0.00 (n=3), paired by seed"
    ) in verdict.evidence


# ------------------------------------------------------------------------------ latent variables


def test_lvm_checks_read_experiments_and_methods_without_training_curves() -> None:
    runs = {
        "sparsemax": [{"accuracy": a, "decoder_calls": 2.0} for a in (0.90, 0.91, 0.92)],
        "dense": [{"accuracy": a, "decoder_calls": 10.0} for a in (0.90, 0.91, 0.92)],
    }
    for curves in ({}, {"ssvae": {"dense": [FLAT] * 3}}):
        results = Results(lvm={"ssvae": runs}, lvm_curves=curves)
        verdict = lvm_checks.marginalization_matches_dense(
            results, "ssvae", "accuracy", "sparsemax", "dense", 0.01, 5
        )
        assert verdict.status == REPRODUCED
        assert "accuracy: sparsemax 0.91 ± 0.01 (n=3) vs dense 0.91" in verdict.evidence
    one_dense = Results(lvm={"ssvae": {**runs, "dense": runs["dense"][:1]}})
    verdict = lvm_checks.marginalization_matches_dense(
        one_dense, "ssvae", "accuracy", "sparsemax", "dense", 0.01, 5
    )
    assert verdict.status == NOT_MEASURABLE and "dense: 1" in verdict.evidence


def _bits(nll: float, d: int, drift: float | None = None, kl: float = 5.0) -> dict[str, float]:
    run = {"nll_bits_per_dim": nll, "latent_dim": d, "kl_nats": kl}
    return run if drift is None else {**run, "nll_estimate_drift": drift}


def test_nll_at_or_below_judges_each_latent_size_on_its_own_runs() -> None:
    """D = 2: an sfe run's estimate still fell 0.5 bits/dim: not measurable. D = 4: settled
    (a drift of exactly the bound 0.01 is settled, a run without one too), sparsemap's 1.1
    against sfe's 1.4, its collapsed run left out; the D = 2 runs, far from those, are not in."""
    results = Results(
        lvm={
            "bits": {
                "sparsemap": [_bits(v, 2) for v in (5.0, 5.1, 5.2)]
                + [_bits(v, 4) for v in (1.0, 1.1, 1.2)]
                + [_bits(0.0, 4, kl=0.5)],
                "sfe": [
                    *(_bits(0.1, 2, drift=0.5), _bits(0.2, 2), _bits(0.3, 2)),
                    *(_bits(1.3, 4, drift=0.01), _bits(1.4, 4), _bits(1.5, 4)),
                ],
            }
        }
    )
    verdict = lvm_checks.nll_at_or_below(results, "bits", ["sparsemap"], ["sfe"], 0.1, [2, 4])
    assert verdict.numbers["D=2"] == {
        "status": NOT_MEASURABLE,
        "unsettled": ["sfe seed #0 fell 0.50"],
        "decides": "more importance samples per test example (the thesis: 1,024)",
    }
    part = verdict.numbers["D=4 sparsemap"]
    assert part["status"] == REPRODUCED and part["gap"] == pytest.approx(0.3)
    assert part.keys() == {
        "status",
        "gap",
        "deficit_bounds",
        "margin",
        "paired",
        "p_refutes",
        "edge",
    }
    assert not part["paired"]  # sparsemap's collapsed seed is left out: the lists do not pair
    assert "D=4 sparsemap: sparsemap 1.10 ± 0.10 (n=3) vs sfe 1.40" in verdict.evidence
    assert "sparsemap seeds [6], sfe seeds [])" in verdict.evidence


def test_calls_fall_compares_the_first_and_the_last_fifth_of_each_curve() -> None:
    """Decoder calls 200/step, validated every 10 of 100 steps: the first fifth holds steps
    10-30 (20, 10, 6.67), the last 90-100 (2.22, 2); seeds are offset by 0, 0.1, 0.2. An
    experiment without curves, or without the method in its grid, is not measurable."""
    curves = [[(s, 200 / s + offset) for s in range(10, 101, 10)] for offset in (0.0, 0.1, 0.2)]
    first, last = (20 + 10 + 200 / 30) / 3 + 0.1, (200 / 90 + 2) / 2 + 0.1
    runs = {"sparsemax": [{"accuracy": 0.9}] * 3}
    results = Results(
        lvm={"ssvae": runs, "game": runs, "other": {}},
        lvm_calls={"game": {"sparsemax": curves}, "other": {"sparsemax": curves}},
    )
    verdict = lvm_checks.calls_fall(results, "ssvae", "sparsemax", 2.5)
    assert verdict.status == NOT_MEASURABLE
    verdict = lvm_checks.calls_fall(results, "other", "sparsemax", 2.5)
    assert verdict.status == NOT_MEASURABLE
    assert verdict.evidence.startswith("other: no sparsemax in the grid")
    verdict = lvm_checks.calls_fall(results, "game", "sparsemax", 2.5)
    assert verdict.status == REPRODUCED
    assert verdict.evidence.startswith(
        f"falls: sparsemax calls, last fifth {last:.2f} ± 0.10 (n=3) vs first fifth {first:.2f} "
        "± 0.10 (n=3)"
    )


# ------------------------------------------------------------------------------ APE


def test_ape_needs_every_system_scored() -> None:
    results = Results(ape={"bert": {"test": [20.0, 21.0, 22.0]}}, ape_do_nothing={"test": 25.0})
    verdict = ape_checks.ape_below_do_nothing(results, ["bert", "dual"], "test")
    assert verdict.status == NOT_MEASURABLE
    assert verdict.evidence == (
        "no dual scored on test in the APE grid; what would decide it: an APE grid that trains "
        "and scores dual on test"
    )


def test_ape_convergence_is_read_as_a_perplexity() -> None:
    """Without curves a system is judged; with an NLL of 0.20 → 0.19 nats (5% relative, 1% in
    perplexity) it is too; only a 5% move in perplexity holds it back."""
    scores = {"ape": {"bert": {"test": [20.0, 21.0, 22.0]}}, "ape_do_nothing": {"test": 25.0}}
    for curve, status in [
        (None, REPRODUCED),
        ([(400, 0.20), (500, 0.19)], REPRODUCED),
        ([(400, 0.25), (500, 0.20)], NOT_MEASURABLE),
    ]:
        curves = {} if curve is None else {"bert": [curve] * 3}
        results = Results(**scores, ape_valid_nll=curves)
        assert ape_checks.ape_below_do_nothing(results, ["bert"], "test").status == status


@pytest.mark.parametrize("with_curves", ["bert", "dual"])
def test_ape_comparisons_without_one_systems_curves_are_not_measurable(with_curves: str) -> None:
    results = Results(
        ape={"bert": {"test": [20.0, 21.0, 22.0]}, "dual": {"test": [23.0, 24.0, 25.0]}},
        ape_valid_nll={with_curves: [FLAT] * 3},
    )
    verdict = ape_checks.ape_ter_below(results, "bert", ["dual"], "test")
    assert (
        verdict.status == NOT_MEASURABLE and "cannot be tested in bert vs dual" in verdict.evidence
    )


@pytest.mark.parametrize(
    "check",
    [
        lambda r: ape_checks.ape_ter_below(r, "bert", ["dual"], "test"),
        lambda r: ape_checks.ape_best_of(r, "bert", ["dual"], "test", 1.0),
        lambda r: ape_checks.ape_nearly_as_good(r, "bert", "dual", "test", 1.0),
    ],
)
def test_ape_comparisons_name_the_systems(check: Check) -> None:
    results = Results(
        ape={"bert": {"test": [20.0, 21.0, 22.0]}, "dual": {"test": [23.0, 24.0, 25.0]}},
        ape_valid_nll={"bert": [FLAT] * 3, "dual": [FLAT] * 3},
    )
    verdict = check(results)
    assert verdict.status == REPRODUCED
    assert "dual: bert 21.00 ± 1.00 (n=3) vs dual 24.00 ± 1.00 (n=3)" in verdict.evidence


# ------------------------------------------------------------------------------ gates of checks

FALLING = [(100, 3.0), (200, 2.0), (300, 1.5), (400, 1.2), (500, 1.0)]  # 1.2 → 1.0 at the end


def test_role_confidence_waits_while_either_model_catches_up() -> None:
    results = Results(
        roles={"softmax": {"previous": [1, 1, 1]}},
        role_confidence={
            "entmax_alpha": {"previous": [0.9, 0.92, 0.91]},
            "softmax": {"previous": [0.7, 0.72, 0.71]},
        },
        valid_nll={"smoke": {"entmax_alpha": [FLAT] * 3, "softmax": [FLAT] * 3}},
    )
    verdict = nmt_checks.roles_more_confident(results, "entmax_alpha", "softmax", ["previous"])
    assert verdict.status == REPRODUCED
    results.valid_nll["smoke"]["entmax_alpha"] = [CLOSING] * 3
    verdict = nmt_checks.roles_more_confident(results, "entmax_alpha", "softmax", ["previous"])
    assert verdict.status == NOT_MEASURABLE and "gap still moves" in verdict.evidence


def test_role_confidence_needs_both_models_confidences() -> None:
    """A seed of one model without a confidence, or one model without any: not measurable."""
    results = Results(
        roles={"softmax": {"a": [1, 1, 1], "b": [1, 1, 1]}},
        role_confidence={
            "entmax_alpha": {"a": [None, 0.9, 0.9], "b": []},
            "softmax": {"a": [0.7] * 3, "b": [0.7] * 3},
        },
    )
    verdict = nmt_checks.roles_more_confident(results, "entmax_alpha", "softmax", ["a", "b"])
    decides = "a corpus with queries for the role (questions; words split by BPE)"
    assert verdict.evidence == (
        f"a: the corpus cannot show this role; what would decide it: {decides}; b: the corpus "
        f"cannot show this role; what would decide it: {decides}"
    )


def test_adaptive_sparsity_waits_while_a_compared_model_catches_up() -> None:
    def seeds(heads: list[float], within: list[float]) -> list[dict[str, list[float | None]]]:
        return [{"heads": heads, "within_length_sd": within}] * 3

    results = Results(
        density={
            "entmax_alpha": seeds([0.2, 0.5, 0.8], [0.1, 0.2, 0.3]),
            "entmax15": seeds([0.5, 0.5, 0.5], [0.1, 0.1, 0.1]),
            "topk": seeds([0.5, 0.5, 0.5], [0.0, 0.0, 0.0]),
        },
        valid_nll={"smoke": {v: [FLAT] * 3 for v in ("entmax_alpha", "entmax15", "topk")}},
    )
    # keys at 0: 0.5 against 1.0 × 0.5 (at its share exactly); within-length sd 0.2 against 0.1
    verdict = nmt_checks.adaptive_sparsity(results, "entmax_alpha", "entmax15", "topk", 1.0)
    assert verdict.status == REPRODUCED
    results.valid_nll["smoke"]["entmax_alpha"] = [CLOSING] * 3
    verdict = nmt_checks.adaptive_sparsity(results, "entmax_alpha", "entmax15", "topk", 1.0)
    parts = ("sparse", "per head", "per input, against entmax15", "per input, against topk")
    for part in parts:  # each compares with a model still catching up
        assert verdict.numbers[part]["status"] == NOT_MEASURABLE


def test_nll_at_or_below_waits_for_the_training_loss_to_settle() -> None:
    results = Results(
        lvm={"bits": {"sparsemap": [_bits(1.0, 4)] * 3, "sfe": [_bits(1.4, 4)] * 3}},
        lvm_curves={"bits": {"sparsemap": [FALLING] * 3, "sfe": [FLAT] * 3}},
    )
    verdict = lvm_checks.nll_at_or_below(results, "bits", ["sparsemap"], ["sfe"], 0.1, [4])
    assert verdict.status == NOT_MEASURABLE and "runs still improve" in verdict.evidence


def test_paired_results_of_different_lengths_are_refused() -> None:
    """Rounds, heads and logged α are paired one to one: a record where they differ in number is
    malformed and raises rather than being cut to the shorter."""
    speed = {
        "topk": {"train": [1.0] * 5, "inference": [1.0] * 5},
        "sparsemax": {"train": [1.0] * 5, "inference": [1.0] * 4},
    }
    with pytest.raises(ValueError, match="zip"):
        nmt_checks.decodes_faster(Results(speed=speed), "topk", "sparsemax", 1.5)
    with pytest.raises(ValueError, match="zip"):
        nmt_checks._alpha_still_moving(Results(alpha_trajectories=[_seed([1.5] * 6, [1.5] * 5)]))
    # α settled between 800 and 1000 (two heads each), one head logged at 50: the heads' series
    trajectory = [(50, [1.5]), (800, [1.5, 1.5]), (1000, [1.5, 1.5])]
    with pytest.raises(ValueError, match="zip"):
        nmt_checks.heads_dense_then_sparse(
            _dense_then_sparse(trajectory, [100.0], [1000]), 0.1, 0.3, 50
        )
    # two runs' target tokens, one run's curve
    results = _dense_then_sparse(trajectory[1:], [100.0, 100.0], [1000])
    with pytest.raises(ValueError, match="zip"):
        nmt_checks.heads_dense_then_sparse(results, 0.1, 0.3, 50)


# ------------------------------------------------------------------------------ the words
# What a verdict says: every reason a check cannot judge, and the gates' and speeds' wording.

SPEED = {
    "softmax": {"train": [1.0] * 5, "inference": [1.0] * 5},
    "topk": {"train": [0.5] * 5, "inference": [0.5] * 5},
}
SCORED = {"bert": {"test": [20.0, 21.0, 22.0]}}
CALLS = {
    "sparsemax": [{"accuracy": 0.9, "decoder_calls": 2.0}] * 3,
    "dense": [{"accuracy": 0.9, "decoder_calls": 10.0}] * 3,
}


def _drifting_seeds() -> Results:
    rising = _seed([1.5] * 7, [1.503] * 7)  # two seeds that moved alike: p = 0
    return Results(alpha_trajectories=[rising, rising], final_alphas={"encoder": [1.5] * 3})


WORDS = [
    (lambda: checks.mean_at_most([], 2.0, "calls"), "no calls"),
    (lambda: checks.ratio_near_one([], 0.1, "x"), "no measurement of x"),
    (lambda: checks.ratio_at_least([], 1.0, "x"), "no measurement of x"),
    (
        lambda: nmt_checks.bleu_at_least_as_good(Results(), ["entmax15"], "softmax", 1.0),
        "no NMT results",
    ),
    (
        lambda: nmt_checks.bleu_at_least_as_good(
            Results(bleu={"smoke": {"x": [1.0]}}), ["entmax15"], "softmax", 1.0
        ),
        "smoke: no entmax15, softmax in the NMT grid",
    ),
    (
        lambda: nmt_checks.decodes_faster(Results(), "topk", "sparsemax", 1.5),
        "topk, sparsemax not timed at inference",
    ),
    (
        lambda: nmt_checks.speed_near_softmax(Results(speed=SPEED), "topk", 0.1, 0.1),
        "train: train tokens/s ratio median 0.50 (IQR 0.500–0.500) over 5 rounds; near 1 means "
        "within ±0.1 (0.90–1.10); inference: inference tokens/s ratio median 0.50 (IQR "
        "0.500–0.500) over 5 rounds; near 1 means within ±0.1 (0.90–1.10)",
    ),
    (
        lambda: nmt_checks.decodes_faster(Results(speed=SPEED), "topk", "softmax", 1.5),
        "topk/softmax inference tokens/s median 0.50 (IQR 0.500–0.500) over 5 rounds; at least "
        "1.5 needed",
    ),
    (
        lambda: nmt_checks.slowest(Results(speed=SPEED), "topk"),
        "train: train speed (median ratio to softmax over the rounds, IQR): topk 0.50 "
        "(0.50–0.50), softmax 1.00 (1.00–1.00); inference: inference speed (median ratio to "
        "softmax over the rounds, IQR): topk 0.50 (0.50–0.50), softmax 1.00 (1.00–1.00)",
    ),
    (
        lambda: nmt_checks.alpha_modes(
            Results(final_alphas={"encoder": [1.5] * 3}), ["encoder"], [], 1.5, 1.2
        ),
        "encoder: 3 learned α in encoder",
    ),
    (
        lambda: nmt_checks.alpha_modes(_drifting_seeds(), ["encoder"], [], 1.5, 1.2),
        "not measurable in this profile: over the last 20% of the steps its heads still drift "
        "together (the mean α of a seed's heads rose by 0.0030 (its line's move per seed "
        "+0.0030 / +0.0030; p = 0 over 2 seeds (t, df 1) < 0.05; beyond 0.002 in α)); what "
        "would decide it: a longer run: if α's move falls as 1/step, it "
        "settles after about 1,500 steps, and its heads no longer drift one way together",
    ),
    (
        lambda: nmt_checks.heads_dense_then_sparse(Results(), 0.1, 0.35, 100),
        "no α-entmax model with an α trajectory",
    ),
    (
        lambda: nmt_checks.heads_dense_then_sparse(
            _dense_then_sparse([(50, [1.5]), (150, [1.5])], [100_000.0], [150]), 0.1, 0.35, 150_000
        ),
        # 150 steps of 100,000 tokens: 150 × 1.5 = 225 steps reach 150,000
        "not measurable in this profile: a run of entmax_alpha trained 0.1M target tokens (150 "
        "steps); the claim is judged, either way, after 0.15M; what would decide it: a run of "
        "about 225 steps of this run's batches",
    ),
    (
        lambda: nmt_checks.head_roles_exist(
            Results(roles={"a": {"r": [None], "s": [0]}, "b": {"r": [0], "s": [0]}}),
            "a",
            ["r", "s"],
            ["b"],
        ),
        "r: the corpus cannot show this role; what would decide it: a corpus with queries for "
        "the role (questions; words split by BPE); s: no model has such a head at these steps "
        "(heads per seed: a [0], b [0]): the corpus or the training length cannot show the role; "
        "what would decide it: a longer run, or a corpus on which some model forms the role",
    ),
    (
        lambda: nmt_checks.roles_more_confident(Results(), "a", "b", ["r"]),
        "no role confidences of a, b",
    ),
    (
        lambda: nmt_checks.roles_more_confident(
            Results(
                roles={"b": {"r": [0, 0, 0]}},
                role_confidence={"a": {"r": [0.5] * 3}, "b": {"r": [0.5] * 3}},
            ),
            "a",
            "b",
            ["r", "r"],
        ),
        "r: no head of a or b holds it at its threshold (heads per seed: a [], b [0, 0, 0]): no "
        "role confidence to compare",
    ),
    (
        lambda: nmt_checks.adaptive_sparsity(Results(), "a", "b", "c", 1.0),
        "no attention densities of a, b",
    ),
    (
        lambda: nmt_checks.bleu_at_least_as_good(
            Results(
                bleu={"s": {"a": [1.0] * 3, "b": [1.0] * 3}},
                valid_nll={"s": {"a": [CLOSING] * 3, "b": [FLAT] * 3}},
            ),
            ["a"],
            "b",
            1.0,
        ),
        "s/a: not measurable in this profile: the validation perplexity gap still moves",
    ),
    (
        lambda: lvm_checks.methods_below(Results(lvm={"ssvae": {}}), "ssvae", "x", ["a"], "b"),
        "ssvae: no a, b in the grid",
    ),
    (
        lambda: lvm_checks.methods_below(
            Results(lvm={"e": {"a": [], "b": []}}, lvm_curves={"e": {"a": [FALLING]}}),
            "e",
            "x",
            ["a"],
            "b",
        ),
        "not measurable in this profile: 1 of 1 runs still improve (training loss 16.7% better",
    ),
    (
        lambda: lvm_checks.calls_fall(Results(lvm={"e": {"a": []}}), "e", "a", 1.5),
        "no a calls curves; what would decide it: runs that log a's decoder calls",
    ),
    (
        lambda: lvm_checks.marginalization_matches_dense(
            Results(lvm={"e": CALLS}), "e", "accuracy", "sparsemax", "dense", 0.1, 5
        ),
        "; decoder calls: sparsemax decoder calls (of 10) 2.00 ± 0.00 (n=3) (at most 5)",
    ),
    (
        lambda: lvm_checks.nll_at_or_below(
            Results(lvm={"e": {"a": [_bits(1.0, 4, drift=0.5)], "b": [_bits(1.0, 4, drift=0.2)]}}),
            "e",
            ["a"],
            ["b"],
            0.1,
            [4],
        ),
        "D=4: not measurable in this profile: the importance-sampled NLL has not converged "
        "(bits/dim it fell from a quarter of the samples to all: a seed #0 fell 0.50, b seed #0 "
        "fell 0.20; settled: at most 0.01); what would decide it: more importance samples per "
        "test example (the thesis: 1,024)",
    ),
    (
        lambda: ape_checks.ape_below_do_nothing(Results(), ["bert", "dual"], "test"),
        "no bert, dual scored on test in the APE grid",
    ),
    (
        lambda: ape_checks.ape_below_do_nothing(Results(ape=SCORED), ["bert"], "test"),
        "no do-nothing score on test",
    ),
    (
        lambda: ape_checks.ape_below_do_nothing(
            Results(ape=SCORED, ape_do_nothing={"test": 25.0}, ape_valid_nll={"bert": [FALLING]}),
            ["bert"],
            "test",
        ),
        "bert: not measurable in this profile: 1 of 1 runs still improve (validation NLL 22.1% "
        "better",
    ),
    (
        lambda: ape_checks.ape_ter_below(
            Results(
                ape={**SCORED, "dual": {"test": [20.0, 21.0, 22.0]}},
                ape_valid_nll={"bert": [CLOSING] * 3, "dual": [FLAT] * 3},
            ),
            "bert",
            ["dual"],
            "test",
        ),
        "dual: not measurable in this profile: the validation NLL gap still moves in 1 of 1 "
        "comparisons (bert vs dual: by",
    ),
]


@pytest.mark.parametrize(("check", "words"), WORDS)
def test_a_verdict_says_why_in_its_own_words(
    check: Callable[[], checks.Verdict], words: str
) -> None:
    evidence = check().evidence
    assert evidence.startswith(words) or evidence.endswith(words), evidence


def test_the_gap_gate_says_what_moved_by_how_much_and_when_it_would_open() -> None:
    gate = checks.unsettled({"a": _two_pairs(0.2, 0.01)}, "validation NLL")
    assert gate is not None
    assert gate.evidence == (
        "not measurable in this profile: the validation NLL gap still moves in 1 of 1 "
        f"comparisons (a: by {math.expm1(1.0):.1%} in perplexity over the last 50% of the steps "
        "(mean of 2 seed pairs' moves, se 0.050 nats; p = 0.032 for a constant gap, level 0.05); "
        "if it closes as 1/step it moves 1.000 nats more, beyond 0.020 (2% in perplexity): "
        "training length, not the method, could decide the comparison; what would decide it: a "
        "longer run: if the gap closes as 1/step (its move still to come then falls as 1/T), the "
        "gate opens after about 505 steps"
    )


def test_the_gap_gate_names_the_share_of_the_gap_at_which_the_verdict_flips() -> None:
    """A verdict whose statistic 1.0 is 0.5 from its threshold flips when the gap moves by half
    of itself: 0.35 of the gap 0.7, still below the move to come (1.0)."""
    flipping = checks.verdict(True, "x", edge={"statistic": 1.0, "threshold": 1.5, "distance": 0.5})
    assert checks.flips_at(flipping) == pytest.approx(0.5)
    gate = checks.unsettled_each({"a": _two_pairs(0.2, 0.01)}, "validation NLL", {"a": flipping})
    assert gate["a"] is not None
    assert "beyond 0.350 (50% of the gap +0.700, where its verdict flips)" in gate["a"].evidence
    assert gate["a"].numbers["gap_trend"]["a"]["material"] == pytest.approx(0.35)
    # 1.0 from its threshold: flips only when the gap moves by 3.6 × 0.7 > 1.0, never seen
    far = checks.verdict(False, "x", edge={"statistic": 0.28, "threshold": 1.28, "distance": -1})
    assert checks.unsettled_each({"a": _two_pairs(0.2, 0.01)}, "x", {"a": far}) == {"a": None}
    # no edge, or not measurable: any move beyond still_improving
    assert checks.flips_at(checks.verdict(True, "x")) == 0.0
    assert checks.flips_at(checks.not_measurable("x", decides="y", edge={"statistic": 1})) == 0.0
    assert checks.flips_at(None) == 0.0


def test_all_of_refuses_no_parts_in_so_many_words() -> None:
    with pytest.raises(LearnableSparsityError, match=r"^all_of needs at least one part$"):
        checks.all_of({})


def test_a_unimodal_part_says_one_mode_was_expected() -> None:
    verdict = nmt_checks.alpha_modes(_modes_results(), [], ["decoder"], 1.5, 1.2)
    assert verdict.evidence.endswith("; expected one mode")


# ------------------------------------------------------------------------------ what decides it
# The new code of a62c4d8 and 4744eb6: the seeds a margin needs, the length a claim waits for,
# shares of 1.5-entmax, the speed floor, decoder calls' bound, several baselines, APE BLEU.

# The seeds a difference d needs at a pooled variance v over g groups: g (z₀.₉₅ + z₀.₈)² v / d²,
# (z₀.₉₅ + z₀.₈)² = (1.6449 + 0.8416)² = 6.1826, up to the next integer, at least 3.


@pytest.mark.parametrize(
    ("groups", "difference", "seeds"),
    [
        # variances 0.5 and 1 (mean 0.75): 2 × 6.1826 × 0.75 / 1² = 9.27, up to 10
        ([[1.0, 2.0], [1.0, 2.0, 3.0]], 1.0, 10),
        ([[1.0, 2.0, 3.0]], 1.0, 7),  # one group against a value: 6.18, up to 7
        ([[1.0, 2.0, 3.0]], -0.5, 25),  # 6.1826 / 0.25 = 24.7, whichever the sign
        ([[1.0, 1.1], [1.0, 1.1]], 1.0, 3),  # 2 × 6.18 × 0.005 = 0.06: at least 3
        ([[1.0], [1.0, 2.0]], 1.0, None),  # a group without a spread
        ([[1.0, 2.0], [1.0, 2.0]], 0.0, None),  # no difference to find
    ],
)
def test_seeds_for_is_the_normal_approximation_at_80_percent_power(
    groups: list[list[float]], difference: float, seeds: int | None
) -> None:
    assert checks.seeds_for(groups, difference) == seeds


def test_too_few_seeds_says_how_many_the_margin_needs() -> None:
    short = checks.too_few_seeds({"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}, 1.0)
    assert short is not None
    decides = (
        "about 10 seeds per method (a difference of 1 at the spread of these seeds, one-sided "
        "p < 0.05 with 80% power)"
    )
    assert short.evidence.endswith(f"needs 3; what would decide it: {decides}")
    assert short.numbers == {"seeds": {"a": 2}, "seeds_needed": 10, "decides": decides}
    # a difference of 1.2345 prints at 3 significant digits; 2 × 6.18 × 0.75 / 1.524 = 6.08 → 7
    short = checks.too_few_seeds({"a": [1.0, 2.0], "b": [1.0, 2.0, 3.0]}, 1.2345)
    assert short is not None and short.numbers["seeds_needed"] == 7
    assert "about 7 seeds per method (a difference of 1.23 at" in short.evidence
    # no difference, or a method without a spread: the 3 seeds a spread needs
    for groups, difference in (({"a": [1.0, 2.0]}, None), ({"a": [1.0], "b": [1.0, 2.0]}, 1.0)):
        short = checks.too_few_seeds(groups, difference)
        assert short is not None and short.numbers["seeds_needed"] == 3


@pytest.mark.parametrize(
    ("check", "seeds"),
    [
        # the claim's margin (or largest gap) decides: 2 × 6.18 × 0.75 / d²
        (lambda a, b: checks.at_least_as_good(a, b, 1.0), 10),  # 9.27
        (lambda a, b: checks.at_least_as_good(a, b, 0.75), 17),  # 16.5
        (lambda a, b: checks.worse_by_at_most(a, b, 0.75), 17),  # 16.5, not the measured 0.5's 38
        # the difference measured: |1.5 - 3| = 1.5, 9.27 / 2.25 = 4.1
        (lambda a, b: checks.significantly_below(a, [2.0, 3.0, 4.0]), 5),
        # one group against a value, |1.5 - 2|: 6.18 × 0.5 / 0.25 = 12.4
        (lambda a, b: checks.significantly_below_value(a, 2.0), 13),
        (lambda a, b: checks.significantly_above_value(a, 1.0), 13),
    ],
)
def test_each_comparison_says_the_seeds_its_difference_needs(
    check: Callable[[list[float], list[float]], checks.Verdict], seeds: int
) -> None:
    verdict = check([1.0, 2.0], [1.0, 2.0, 3.0])
    assert verdict.status == NOT_MEASURABLE and verdict.numbers["seeds_needed"] == seeds


def test_a_comparison_without_values_needs_three_seeds() -> None:
    for verdict in (
        checks.significantly_below([], [1.0, 2.0, 3.0]),
        checks.significantly_below_value([], 1.0),
    ):
        assert verdict.status == NOT_MEASURABLE and verdict.numbers["seeds_needed"] == 3


def test_unconverged_estimates_the_steps_of_the_run_that_improves_most() -> None:
    """b improves 10% over the last fifth of 1000 steps, a 5% of 500: b, after 1000 × 5."""
    curves = {"a": [(400, 10.0), (500, 9.5)], "b": [(100, 12.0), (800, 10.0), (1000, 9.0)]}
    verdict = checks.unconverged(curves, "loss")
    assert verdict is not None
    assert verdict.numbers["converged_after_steps"] == pytest.approx(5000)
    assert verdict.evidence.endswith("b improves by less than 2% after about 5,000 steps")


def test_dense_then_sparse_waits_for_its_shortest_run() -> None:
    """Runs of 6000 and 9000 tokens on corpus a (750 and 1000 steps), 4000 on b (500 steps),
    judged after 8000: the shortest, 4000 tokens in 500 steps, needs 500 × 8000 / 4000 = 1000
    steps (the other short one 750 × 8000 / 6000 = 1000 too, the longest 1000 × 8000 / 9000);
    softmax's runs are not read."""
    settled = [(50, [1.5]), (800, [1.5]), (1000, [1.5])]
    results = Results(
        alpha_trajectories=[settled],
        target_tokens={
            "a": {"entmax_alpha": [6000.0, 9000.0], "softmax": [1.0]},
            "b": {"entmax_alpha": [4000.0]},
        },
        valid_nll={
            "a": {"entmax_alpha": [[(750, 2.0)], [(1000, 2.0)]], "softmax": [[(1, 2.0)]]},
            "b": {"entmax_alpha": [[(500, 2.0)]]},
        },
    )
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 8000)
    assert verdict.status == NOT_MEASURABLE
    assert verdict.evidence == (
        "not measurable in this profile: a run of entmax_alpha trained 0.004M target tokens (500 "
        "steps); the claim is judged, either way, after 0.008M; what would decide it: a run of "
        "about 1,000 steps of this run's batches"
    )
    _assert_numbers(
        verdict.numbers,
        {
            "target_tokens": [6000, 9000, 4000],
            "steps_needed": 1000,
            "decides": "a run of about 1,000 steps of this run's batches",
        },
    )
    # 4000 tokens in 100 steps: 200 steps; the 6000-token run needs 1000, the lowest tokens decide
    results.valid_nll["b"]["entmax_alpha"] = [[(100, 2.0)]]
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 8000)
    assert verdict.numbers["steps_needed"] == pytest.approx(200)
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 4000)
    assert verdict.status == NOT_REPRODUCED  # α never moved; every run long enough


def test_dense_then_sparse_needs_the_runs_target_tokens() -> None:
    verdict = nmt_checks.heads_dense_then_sparse(
        Results(alpha_trajectories=[[(50, [1.5]), (100, [1.5])]]), 0.1, 0.35, 100
    )
    assert verdict.evidence == (
        "no entmax_alpha run with its target tokens; what would decide it: an NMT grid with "
        "entmax_alpha"
    )


def test_dense_then_sparse_waits_for_alpha_to_settle() -> None:
    """Long enough, but α rose from 1.3 to 1.5 over the last fifth."""
    trajectory = [(50, [1.5] * 6), (800, [1.3] * 6), (1000, [1.5] * 6)]
    verdict = nmt_checks.heads_dense_then_sparse(
        _dense_then_sparse(trajectory, [8000.0], [1000]), 0.1, 0.1, 8000
    )
    assert verdict.status == NOT_MEASURABLE and "α still moves by" in verdict.evidence


@pytest.mark.parametrize(
    ("values", "status"),
    [([0.3] * 3, REPRODUCED), ([0.29] * 3, NOT_REPRODUCED)],  # 0.5 × 0.6 = 0.3 exactly
)
def test_a_share_of_a_reference_includes_its_bound(values: list[float], status: str) -> None:
    verdict = nmt_checks._share_at_least(values, [0.6] * 3, 0.5, "keys at 0")
    assert verdict.status == status
    assert verdict.evidence == (
        f"keys at 0 {values[0]:.3f} ± 0.000 (n=3) vs 0.5 × 0.600 ± 0.000 (n=3) = 0.300"
    )
    edge = verdict.numbers.pop("edge")
    _assert_numbers(verdict.numbers, {"mean": values[0], "reference": 0.6, "share": 0.5})
    assert edge == pytest.approx(
        {"statistic": values[0], "threshold": 0.3, "distance": values[0] - 0.3}
    )


def test_a_share_of_a_reference_needs_three_seeds_of_each() -> None:
    for values, reference, short in (
        ([0.3] * 2, [0.6] * 3, "keys at 0: 2;"),
        ([0.3] * 3, [0.6] * 2, "reference keys at 0: 2;"),
    ):
        verdict = nmt_checks._share_at_least(values, reference, 0.5, "keys at 0")
        assert verdict.status == NOT_MEASURABLE and f"seeds per method {short}" in verdict.evidence


def _densities(heads: list[list[float]], within: list[list[float | None]]) -> list[dict]:
    return [{"heads": h, "within_length_sd": w} for h, w in zip(heads, within, strict=True)]


def test_adaptive_sparsity_without_a_trained_top_k_tests_against_its_closed_form() -> None:
    """Top-k not trained: its within-length sd is 0 by its closed form; α-entmax's seeds 0.1,
    0.2, 0.3 (a None left out) are above it at t = 2√3, p = 0.037. 1.5-entmax leaves 0.5 of the
    keys at 0 and spreads 0.3 within a length: at a share of 0.5, α-entmax's 0.25 of the keys
    and 0.2 of spread reach 0.25 (exactly) and 0.15; at a share of 0.6 the keys (0.3) fail."""
    results = Results(
        density={
            "entmax_alpha": _densities([[0.5, 1.0]] * 3, [[0.1, None], [0.2], [0.3]]),
            "entmax15": _densities([[0.5, 0.5]] * 3, [[0.3]] * 3),
        }
    )
    verdict = nmt_checks.adaptive_sparsity(results, "entmax_alpha", "entmax15", "topk", 0.5)
    assert verdict.status == REPRODUCED
    assert (
        "against topk: entmax_alpha within-length sd 0.20 ± 0.10 (n=3) vs topk (closed form, "
        "untrained) 0.00: entmax_alpha within-length sd above topk (closed form, untrained) by "
        "+0.2, one-sided 95% bounds +0.0314 / +0.369 (df 2.0) (one-sample)"
    ) in verdict.evidence
    numbers = verdict.numbers
    against_topk = numbers["per input, against topk"]
    assert against_topk["p_refutes"] == pytest.approx(1 - P_AGAINST_VALUE)
    _assert_numbers(
        {k: v for k, v in numbers["sparse"].items() if k not in ("status", "edge")},
        {"mean": 0.25, "reference": 0.5, "share": 0.5},
    )
    _assert_numbers(
        {
            k: v
            for k, v in numbers["per input, against entmax15"].items()
            if k not in ("status", "edge")
        },
        {"mean": 0.2, "reference": 0.3, "share": 0.5},
    )
    verdict = nmt_checks.adaptive_sparsity(results, "entmax_alpha", "entmax15", "topk", 0.6)
    assert verdict.numbers["sparse"]["status"] == NOT_REPRODUCED  # 0.25 < 0.3
    assert verdict.numbers["per input, against entmax15"]["status"] == REPRODUCED  # 0.2 ≥ 0.18


def test_trains_at_least_reads_the_training_rounds_of_its_variant() -> None:
    speed = {
        "entmax15": {"train": [0.8, 0.82, 0.85, 0.9, 0.95], "inference": [0.1] * 5},
        "softmax": {"train": [1.0] * 5},
    }
    verdict = nmt_checks.trains_at_least(Results(speed=speed), "entmax15", 0.82)
    assert verdict.status == REPRODUCED  # the first quartile, 0.82, at the floor
    assert verdict.evidence == (
        "entmax15 training tokens/s ratio median 0.85 (IQR 0.820–0.900) over 5 rounds; at least "
        "0.82 needed"
    )
    for absent in ({}, {"entmax15": {"inference": [1.0] * 5}}, {"entmax15": {"train": []}}):
        verdict = nmt_checks.trains_at_least(Results(speed=absent), "entmax15", 0.82)
        assert verdict.status == NOT_MEASURABLE
        assert verdict.evidence == (
            "entmax15 not timed in training; what would decide it: the speed stage timing entmax15"
        )


def _calls_results() -> Results:
    """Decoder calls 20, 10, 6 over the first fifth (steps 10-30) and 2 over the last (90-100),
    seeds offset by -0.5, 0, 0.5: a mean of 2 in the last fifth."""
    values = [20.0, 10.0, 6.0, 4.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0]
    curves = [[(10 * (i + 1), v + o) for i, v in enumerate(values)] for o in (-0.5, 0.0, 0.5)]
    return Results(
        lvm={"game": {"sparsemax": [{"accuracy": 0.9}] * 3}},
        lvm_calls={"game": {"sparsemax": curves}},
    )


@pytest.mark.parametrize(("bound", "status"), [(2.0, REPRODUCED), (1.99, NOT_REPRODUCED)])
def test_calls_fall_needs_the_last_fifth_at_most_its_bound(bound: float, status: str) -> None:
    verdict = lvm_checks.calls_fall(_calls_results(), "game", "sparsemax", bound)
    assert verdict.status == status
    assert verdict.numbers["falls"]["status"] == REPRODUCED
    assert verdict.numbers["very sparse"] == {
        "status": status,
        "values": [1.5, 2.0, 2.5],
        "bound": bound,
        "edge": {"statistic": 2.0, "threshold": bound, "distance": pytest.approx(bound - 2.0)},
    }
    side = "at most" if status == REPRODUCED else "above"
    assert verdict.evidence.endswith(
        f"very sparse: sparsemax calls, last fifth 2.00 ± 0.50 (n=3) ({side} {bound:g})"
    )


def test_calls_fall_waits_for_the_methods_training_loss() -> None:
    results = _calls_results()
    results.lvm_curves["game"] = {"sparsemax": [FALLING] * 3}
    verdict = lvm_checks.calls_fall(results, "game", "sparsemax", 2.0)
    assert verdict.status == NOT_MEASURABLE and "runs still improve" in verdict.evidence


def _several_baselines() -> Results:
    """D = 4: gumbel 1.1, sfe 1.4, nvil 0.6 (sd 0.1 each); nvil's fourth run collapsed."""
    return Results(
        lvm={
            "bits": {
                "gumbel": [_bits(v, 4) for v in (1.0, 1.1, 1.2)],
                "sfe": [_bits(v, 4) for v in (1.3, 1.4, 1.5)],
                "nvil": [_bits(v, 4) for v in (0.5, 0.6, 0.7)] + [_bits(0.0, 4, kl=0.5)],
            }
        }
    )


def test_nll_at_or_below_judges_each_candidate_against_each_baseline() -> None:
    verdict = lvm_checks.nll_at_or_below(
        _several_baselines(), "bits", ["gumbel"], ["sfe", "nvil"], 0.1, [4]
    )
    assert verdict.numbers.keys() == {"D=4 gumbel vs sfe", "D=4 gumbel vs nvil"}
    assert verdict.numbers["D=4 gumbel vs sfe"]["status"] == REPRODUCED
    assert verdict.numbers["D=4 gumbel vs sfe"]["gap"] == pytest.approx(0.3)
    assert verdict.numbers["D=4 gumbel vs nvil"]["gap"] == pytest.approx(-0.5)
    assert verdict.status == NOT_REPRODUCED
    assert verdict.evidence.startswith("fails for D=4 gumbel vs nvil — ")
    assert (
        "D=4 gumbel vs nvil: gumbel 1.10 ± 0.10 (n=3) vs nvil 0.60 ± 0.10 (n=3), Welch: worse "
        "by 0.50; deficit's one-sided 95% bounds 0.326 / 0.674 against the margin 0.1"
    ) in verdict.evidence
    assert "(left out as collapsed, KL < 1.0 nat: gumbel seeds [], nvil seeds [3])" in (
        verdict.evidence
    )
    assert "gumbel seeds [], sfe seeds [])" not in verdict.evidence


def test_nll_at_or_below_needs_every_baseline_settled_and_in_the_grid() -> None:
    results = _several_baselines()
    verdict = lvm_checks.nll_at_or_below(results, "bits", ["gumbel"], ["sfe", "x"], 0.1, [4])
    assert verdict.evidence.startswith("bits: no x in the grid")
    results.lvm_curves["bits"] = {"nvil": [FALLING]}
    verdict = lvm_checks.nll_at_or_below(results, "bits", ["gumbel"], ["sfe", "nvil"], 0.1, [4])
    assert verdict.status == NOT_MEASURABLE and "runs still improve" in verdict.evidence
    results = _several_baselines()
    results.lvm["bits"]["nvil"][0] = _bits(0.5, 4, drift=0.5)
    verdict = lvm_checks.nll_at_or_below(results, "bits", ["gumbel"], ["sfe", "nvil"], 0.1, [4])
    assert verdict.numbers["D=4"]["unsettled"] == ["nvil seed #0 fell 0.50"]


def _ape_bleu() -> Results:
    """TER that would fail above do-nothing (21 against 25), BLEU 6 ± 1 against 4."""
    return Results(
        ape=SCORED,
        ape_do_nothing={"test": 25.0},
        ape_bleu={"bert": {"test": [5.0, 6.0, 7.0]}},
        ape_do_nothing_bleu={"test": 4.0},
    )


def test_ape_bleu_reads_bleu_against_the_mt_outputs_bleu() -> None:
    verdict = ape_checks.ape_bleu_above_do_nothing(_ape_bleu(), ["bert"], "test")
    assert verdict.status == REPRODUCED
    assert verdict.evidence == (
        "bert: bert BLEU 6.00 ± 1.00 (n=3) vs do nothing 4.00: bert BLEU above do nothing by "
        "+2, one-sided 95% bounds +0.314 / +3.69 (df 2.0) (one-sample)"
    )
    assert ape_checks.ape_above_do_nothing(_ape_bleu(), ["bert"], "test").status == NOT_REPRODUCED
    verdict = ape_checks.ape_below_do_nothing(_ape_bleu(), ["bert"], "test")
    assert "bert: bert TER 21.00 ± 1.00 (n=3) vs do nothing 25.00" in verdict.evidence


def test_ape_bleu_needs_its_own_scores() -> None:
    results = _ape_bleu()
    results.ape_do_nothing_bleu.clear()
    verdict = ape_checks.ape_bleu_above_do_nothing(results, ["bert"], "test")
    assert verdict.evidence.startswith("no do-nothing score on test")
    results = _ape_bleu()
    results.ape_bleu["bert"] = {"dev": [5.0, 6.0, 7.0]}
    verdict = ape_checks.ape_bleu_above_do_nothing(results, ["bert"], "test")
    assert verdict.evidence.startswith("no bert scored on test in the APE grid")
    # TER is judged without BLEU scores
    results = _ape_bleu()
    results.missing["ape_bleu"] = "not scored"
    assert ape_checks.ape_below_do_nothing(results, ["bert"], "test").status == REPRODUCED


# Every "not measurable" ends with what would decide it, worded for the result it lacks.
DECIDES = [
    (lambda: checks.mean_at_most([], 2.0, "calls"), "no calls", "runs that record the calls"),
    (lambda: checks.ratio_near_one([], 0.1, "x"), "no measurement of x", "timing rounds of x"),
    (lambda: checks.ratio_at_least([], 1.0, "x"), "no measurement of x", "timing rounds of x"),
    (
        lambda: checks.lowest({"a": [1.0]}, "a", "w"),
        "w: needs a and at least one other variant",
        "timing rounds of a and another variant",
    ),
    (
        lambda: nmt_checks.bleu_at_least_as_good(Results(), ["entmax15"], "softmax", 0.1),
        "no NMT results",
        "an NMT grid",
    ),
    (
        lambda: nmt_checks.bleu_at_least_as_good(
            Results(bleu={"smoke": {"x": [1.0]}}), ["entmax15"], "softmax", 0.1
        ),
        "smoke: no entmax15, softmax in the NMT grid",
        "an NMT grid with entmax15, softmax",
    ),
    (
        lambda: nmt_checks.speed_near_softmax(Results(speed=SPEED), "entmax15", 0.1, 0.1),
        "entmax15 was not timed",
        "the speed stage timing entmax15",
    ),
    (
        lambda: nmt_checks.decodes_faster(Results(), "topk", "sparsemax", 1.5),
        "topk, sparsemax not timed at inference",
        "the speed stage timing topk, sparsemax",
    ),
    (
        lambda: nmt_checks.heads_dense_then_sparse(Results(), 0.1, 0.35, 100),
        "no α-entmax model with an α trajectory",
        "an NMT grid with entmax_alpha",
    ),
    (
        lambda: nmt_checks.head_roles_exist(Results(roles={"b": {}}), "a", ["r"], ["b"]),
        "no head analysis of a",
        "a head analysis of a",
    ),
    (
        lambda: nmt_checks.head_roles_exist(Results(roles={"a": {}}), "a", ["r"], ["b"]),
        "no head analysis of another attention variant than a",
        "a head analysis of another variant trained as long as a",
    ),
    (
        lambda: nmt_checks.head_roles_exist(
            Results(
                roles={"a": {"r": [1]}, "b": {"r": [1]}},
                valid_nll={"s": {"a": [[(100, 1.0)]], "b": [[(200, 1.0)]]}},
            ),
            "a",
            ["r"],
            ["b"],
        ),
        "the models trained for different lengths: {'a': {100}, 'b': {200}}",
        "a grid whose variants train for one length",
    ),
    (
        lambda: nmt_checks.roles_more_confident(Results(), "a", "b", ["r"]),
        "no role confidences of a, b",
        "a head analysis of a, b",
    ),
    (
        lambda: nmt_checks.roles_more_confident(
            Results(
                roles={"b": {"r": [0, 0, 0]}},
                role_confidence={"a": {"r": [0.5] * 3}, "b": {"r": [0.5] * 3}},
            ),
            "a",
            "b",
            ["r"],
        ),
        "r: no head of a or b holds it at its threshold (heads per seed: a [], b [0, 0, 0]): no "
        "role confidence to compare",
        "a longer run, or a corpus on which either model forms the role",
    ),
    (
        lambda: nmt_checks.adaptive_sparsity(Results(), "a", "b", "c", 1.0),
        "no attention densities of a, b",
        "a head analysis of a, b",
    ),
    (
        lambda: lvm_checks.methods_below(Results(lvm={"ssvae": {}}), "ssvae", "x", ["a"], "b"),
        "ssvae: no a, b in the grid",
        "a grid that trains a, b",
    ),
    (
        lambda: ape_checks.ape_below_do_nothing(Results(), ["bert", "dual"], "test"),
        "no bert, dual scored on test in the APE grid",
        "an APE grid that trains and scores bert, dual on test",
    ),
    (
        lambda: ape_checks.ape_below_do_nothing(Results(ape=SCORED), ["bert"], "test"),
        "no do-nothing score on test",
        "an APE evaluation that scores the MT output on test",
    ),
]


@pytest.mark.parametrize(("check", "reason", "decides"), DECIDES)
def test_a_not_measurable_says_what_would_decide_it(
    check: Callable[[], checks.Verdict], reason: str, decides: str
) -> None:
    verdict = check()
    assert verdict.status == NOT_MEASURABLE
    assert verdict.evidence == f"{reason}; what would decide it: {decides}"


def test_dense_then_sparse_reads_only_the_corpora_that_trained_its_variant() -> None:
    """Corpus b trained softmax alone (no curves recorded): no α-entmax run of b to wait for."""
    results = _dense_then_sparse([(50, [1.5]), (800, [1.5]), (1000, [1.5])], [8000.0], [1000])
    results.target_tokens["b"] = {"softmax": [1.0]}
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 8000)
    assert verdict.status == NOT_REPRODUCED  # α never moved


def test_dense_then_sparse_prints_millions_at_two_significant_digits() -> None:
    """1,350,000 tokens: 1.35 million, 1.4 at two digits (the double just above 1.35)."""
    trajectory = [(50, [1.5]), (100, [1.5])]
    results = _dense_then_sparse(trajectory, [1_350_000.0], [100])
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 2_000_000)
    assert "trained 1.4M target tokens (100 steps); the claim is judged, either way, after 2M;" in (
        verdict.evidence
    )
    results = _dense_then_sparse(trajectory, [1_000_000.0], [100])
    verdict = nmt_checks.heads_dense_then_sparse(results, 0.1, 0.35, 1_350_000)
    assert "trained 1M target tokens (100 steps); the claim is judged, either way, after 1.4M;" in (
        verdict.evidence
    )


def test_the_alpha_gate_without_a_common_drift_says_only_when_alpha_settles() -> None:
    """Three heads rise 1.3 → 1.5, three fall 1.7 → 1.5: α moves, but not one way (p = 1)."""
    gate = nmt_checks._alpha_still_moving(
        Results(alpha_trajectories=[_seed([1.3] * 3 + [1.7] * 3, [1.5] * 6)])
    )
    assert gate is not None and gate.numbers["alpha_common_drift"]["blocks"] is False
    move = (_alpha_move(1.3, 1.5) + _alpha_move(1.7, 1.5)) / 2
    assert gate.evidence.endswith(
        f"what would decide it: a longer run: if α's move falls as 1/step, it settles after about "
        f"{1000 * move / 0.02:,.0f} steps"
    )


# ------------------------------------------------------------------------------ α per head


def _turning(final: float, rise_from: float) -> list[tuple[float, list[float]]]:
    """One seed of ten heads settled at 1.6 and a head that fell from 1.6 to 1.2 and has
    risen to ``rise_from`` at step 800 and ``final`` at 1000 (the last fifth)."""
    steps = (0, 400, 600, 800, 1000)
    head = (1.6, 1.2, 1.2, rise_from, final)
    others = [(1.6,) * 5] * 10
    return [(s, [head[i], *(h[i] for h in others)]) for i, s in enumerate(steps)]


def test_a_dipped_head_that_could_still_rebound_into_the_count_holds_it_back() -> None:
    """Rebound 0.3 at 1000 (0.05 short of 0.35), up 0.1 over the last fifth: 0.4 more to come
    if its move falls as 1/step (× (1 − 0.2)/0.2), beyond its distance 0.05 from the edge."""
    (turns,) = [nmt_checks._HeadTurn.of(_turning(1.5, 1.4), 0.1, 0.35, 1)]
    head = turns[0]
    assert (head.dipped, head.counted) == (True, False)
    assert head.move == pytest.approx(0.1) and head.room == pytest.approx(0.05)
    assert head.beyond == checks.rule("alpha_settled")  # the other heads do not move: no noise
    assert head.could_turn() and not any(h.could_turn() for h in turns[1:])
    gate = nmt_checks._heads_could_turn([turns], found=False)
    assert gate is not None and gate.numbers["heads_could_turn"] == 1
    assert "1 head(s) could still rebound into the count (fastest: α moved +0.100" in gate.evidence
    assert "0.050 from the rebound's edge; if its move falls as 1/step it moves 0.400 more" in (
        gate.evidence
    )


def test_a_head_still_moving_away_from_its_edge_or_too_little_holds_nothing_back() -> None:
    # rising 0.01 (below alpha_settled), 0.04 short: 0.04 more to come would reach it, but the
    # move is no move
    slow = nmt_checks._HeadTurn.of(_turning(1.51, 1.5), 0.1, 0.35, 1)
    assert not slow[0].could_turn()
    # falling 0.1 while not counted: away from the edge
    away = nmt_checks._HeadTurn.of(_turning(1.4, 1.5), 0.1, 0.35, 1)
    assert not away[0].could_turn()
    # rising 0.05 but 0.25 short: 0.2 more cannot reach it
    short = nmt_checks._HeadTurn.of(_turning(1.3, 1.25), 0.1, 0.35, 1)
    assert not short[0].could_turn() and short[0].room == pytest.approx(0.25)


def test_every_counted_head_must_be_able_to_fall_out_before_the_count_waits() -> None:
    """Counted (rebound 0.45) and falling 0.1: could fall out (0.4 to come, 0.1 above the edge);
    a second counted head that is settled keeps the verdict."""
    falling = nmt_checks._HeadTurn.of(_turning(1.65, 1.75), 0.1, 0.35, 1)
    assert falling[0].counted and falling[0].could_turn()
    gate = nmt_checks._heads_could_turn([falling], found=True)
    assert gate is not None and "could still fall out of the count" in gate.evidence
    settled = nmt_checks._HeadTurn.of(_turning(1.65, 1.65), 0.1, 0.35, 1)
    assert settled[0].counted and not settled[0].could_turn()
    assert nmt_checks._heads_could_turn([falling, settled], found=True) is None


def test_only_counted_heads_decide_whether_a_found_count_could_fall() -> None:
    """A counted head that could fall out beside a dipped head never counted (which could not
    rebound): the count could fall, the uncounted head has no say (mutmut: `and dipped` as
    `or dipped`)."""
    falling = nmt_checks._HeadTurn.of(_turning(1.65, 1.75), 0.1, 0.35, 1)
    short = nmt_checks._HeadTurn.of(_turning(1.3, 1.25), 0.1, 0.35, 1)
    assert not short[0].counted and short[0].dipped and not short[0].could_turn()
    assert nmt_checks._heads_could_turn([falling, short], found=True) is not None


def test_a_counted_head_falling_too_little_to_fall_out_does_not_turn() -> None:
    """Counted, 0.15 above the edge (rebound 0.5), falling 0.03 over the last fifth: 0.12 more
    to come stays above it (mutmut: the sign −1 as −2 would see 0.24)."""
    head = nmt_checks._HeadTurn.of(_turning(1.7, 1.73), 0.1, 0.35, 1)[0]
    assert head.counted and head.room == pytest.approx(0.15)
    assert -head.tested > head.beyond and not head.could_turn()


# ------------------------------------------------------------------------------ pairing by seed

# Seeds that differ far more from one another than the methods do within a seed: only a test
# paired by seed sees the methods' difference (Welch's spread is the seeds', ~10 or ~0.2).
SPREAD_SEEDS = [40.0, 50.0, 60.0]


def test_ape_comparisons_pair_the_systems_by_seed() -> None:
    curves = {"bert": [FLAT] * 3, "dual": [FLAT] * 3}
    below = Results(
        ape={"bert": {"test": [39.1, 48.9, 59.0]}, "dual": {"test": SPREAD_SEEDS}},
        ape_valid_nll=curves,
    )
    verdict = ape_checks.ape_ter_below(below, "bert", ["dual"], "test")
    assert verdict.status == REPRODUCED and "paired by seed" in verdict.evidence
    close = Results(
        ape={"bert": {"test": [40.2, 50.1, 60.3]}, "dual": {"test": SPREAD_SEEDS}},
        ape_valid_nll=curves,
    )
    verdict = ape_checks.ape_best_of(close, "bert", ["dual"], "test", 1.0)
    assert verdict.status == REPRODUCED and "paired by seed" in verdict.evidence


def test_lvm_comparisons_pair_the_methods_by_seed_of_each_latent_size() -> None:
    accuracy = [0.5, 0.7, 0.9]
    below = (0.01, 0.011, 0.009)
    runs = {
        "sparsemax": [{"accuracy": a, "latent_dim": 8} for a in accuracy],
        "sfe": [{"accuracy": a - d, "latent_dim": 8} for a, d in zip(accuracy, below, strict=True)],
    }
    verdict = lvm_checks.methods_below(
        Results(lvm={"ssvae": runs}), "ssvae", "accuracy", ["sfe"], "sparsemax"
    )
    assert verdict.status == REPRODUCED and "paired by seed" in verdict.evidence
    # D = 8 pairs its three seeds; the runs of D = 16 beside them do not unpair them
    sparsemap = [_bits(n + 0.001, 8) for n in (1.0, 1.5, 2.0)] + [_bits(9.0, 16)] * 3
    # one run of D = 16 collapsed: D = 8's seeds still pair, read at D = 8 alone
    sfe = [_bits(n, 8) for n in (1.0, 1.5, 2.0)] + [_bits(1.0, 16, kl=0.0), _bits(5.0, 16)]
    sfe += [_bits(9.0, 16)]
    verdict = lvm_checks.nll_at_or_below(
        Results(lvm={"bits": {"sparsemap": sparsemap, "sfe": sfe}}),
        "bits",
        ["sparsemap"],
        ["sfe"],
        0.05,
        [8],
    )
    assert verdict.status == REPRODUCED and "paired by seed" in verdict.evidence


# ---------------------------------------------------------------------- the comparisons' edges

# Student's t quantile with 2 degrees of freedom, closed form: (2p − 1) / √(2p(1 − p)).
T95_DF2 = 0.9 / math.sqrt(2 * 0.95 * 0.05)  # 2.92


def _paired(deficits: tuple[float, float, float], base: float = 10.0) -> tuple[list, list]:
    """Three seeds, the candidate below the baseline by ``deficits`` (paired by seed)."""
    return [base - d for d in deficits], [base] * 3


def test_compare_defaults_to_higher_is_better_unpaired_and_welchs_df() -> None:
    c = checks.compare([1.0, 1.1, 1.2], [2.0, 2.5, 3.0])
    assert c.paired is False and c.text.endswith(", Welch") and c.better_by == pytest.approx(-1.4)
    va, vb = 0.01 / 3, 0.25 / 3  # each mean's variance
    assert c.df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 2))  # 2.16
    constant = checks.compare([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert (constant.se, constant.df) == (0.0, 4.0)  # no spread: n1 + n2 - 2


def test_a_bound_at_another_level_and_p_beyond_without_spread() -> None:
    c = checks.compare([2.0, 3.0, 4.0], [1.0, 2.0, 3.0], paired=True)  # +1 in every seed
    assert c.se == 0.0 and c.bound(lower=True, level=0.25) == 1.0
    assert (c.p_beyond(1.0, above=True), c.p_beyond(0.5, above=True)) == (1.0, 0.0)
    assert (c.p_beyond(1.0, above=False), c.p_beyond(2.0, above=False)) == (1.0, 0.0)
    spread = checks.compare([2.0, 2.9, 4.1], [1.0, 2.0, 3.0], paired=True)  # gains 1, 0.9, 1.1
    half_width = T95_DF2 * 0.1 / math.sqrt(3)
    assert spread.bound(lower=True) == pytest.approx(1.0 - half_width)
    assert spread.bound(lower=True, level=0.5) == pytest.approx(1.0)
    # t = 1 / (0.1 / √3) = 17.3: "better_by > 0" has p = 1 − F₂(17.3), small, not F₂(17.3)
    t = 1.0 / (0.1 / math.sqrt(3))
    assert spread.p_beyond(0.0, above=True) == pytest.approx(1 - _t_cdf_2(t))


def test_at_least_as_good_on_its_margin_and_its_deciding_bound() -> None:
    on_edge = checks.at_least_as_good(*_paired((1.0, 1.0, 1.0)), 1.0, paired=True)
    assert on_edge.status == NOT_MEASURABLE and "the estimate lies on the edge" in on_edge.evidence
    refuted = checks.at_least_as_good(*_paired((2.1, 2.0, 1.9)), 1.0, paired=True)
    reach = T95_DF2 * 0.1 / math.sqrt(3)
    assert refuted.status == NOT_REPRODUCED
    assert refuted.numbers["edge"] == pytest.approx(
        {"statistic": 2.0 - reach, "threshold": 1.0, "distance": 1.0 - (2.0 - reach)}
    )
    open_ = checks.at_least_as_good(*_paired((0.0, 1.0, 2.0)), 1.5, paired=True)
    assert open_.status == NOT_MEASURABLE
    gains = [-0.0, -1.0, -2.0]
    assert open_.numbers["seeds_needed"] == checks.seeds_for([gains], 0.5)  # |1.5 − 1|


def test_worse_by_at_most_on_every_side_of_its_interval() -> None:
    """'A little below': reproduced with both bounds inside (0, largest gap); the edge the
    nearer in absolute terms of the lower bound to 0 and the upper to the largest gap."""
    reach = T95_DF2 * 0.1 / math.sqrt(3)
    little = checks.worse_by_at_most(*_paired((0.4, 0.5, 0.6)), 2.0)
    assert little.status == REPRODUCED and little.numbers["paired"] is False
    little = checks.worse_by_at_most(*_paired((0.4, 0.5, 0.6)), 2.0, paired=True)
    assert little.status == REPRODUCED
    t = -0.5 / (0.1 / math.sqrt(3))
    _assert_numbers(
        little.numbers,
        {
            "gap": -0.5,
            "deficit_bounds": [0.5 - reach, 0.5 + reach],
            "largest_gap": 2.0,
            "paired": True,
            # "better than 0" (1 − F(t)) and "worse than the largest gap" (F((−0.5 + 2) / se))
            "p_refutes": min(1 - _t_cdf_2(t), _t_cdf_2((-0.5 + 2.0) / (0.1 / math.sqrt(3)))),
            "edge": {"statistic": 0.5, "threshold": 0.0, "distance": 0.5 - reach},
        },
    )
    too_far = checks.worse_by_at_most(*_paired((2.9, 3.0, 3.1)), 2.0, paired=True)
    assert too_far.status == NOT_REPRODUCED and too_far.numbers["largest_gap"] == 2.0
    # wide: the lower bound's distance from 0 (−2.71) is the nearer in absolute terms, the upper's
    # from the largest gap (−3.71) the smaller number
    wide = checks.worse_by_at_most(*_paired((-1.0, 1.5, 4.0)), 2.0, paired=True)
    half = T95_DF2 * 2.5 / math.sqrt(3)
    assert wide.status == NOT_MEASURABLE
    assert wide.numbers["edge"] == pytest.approx(
        {"statistic": 1.5, "threshold": 0.0, "distance": 1.5 - half}
    )
    assert wide.numbers["seeds_needed"] == checks.seeds_for([[1.0, -1.5, -4.0]], 0.5)


def test_a_heads_per_head_bound_is_its_seeds_noise_at_a_bonferroni_level() -> None:
    """_HeadTurn.of on four heads in α's middle: each head's move read in its logit, signed; the
    seed's noise the MAD of those moves × 1.4826; the bound that noise × the normal quantile of
    alpha_drift_level / (2 × heads × seeds), at least alpha_settled. Worked out here from the
    trajectory with alpha_movement (tests/analysis) and the normal quantile."""
    start = [1.5, 1.5, 1.5, 1.25]
    final = [1.6, 1.45, 1.58, 1.0]  # the last dips exactly 0.25 from its start
    steps = range(100, 1001, 100)
    trajectory = [
        (s, [a + (b - a) * (s - 100) / 900 for a, b in zip(start, final, strict=True)])
        for s in steps
    ]
    earlier = nmt_checks._window_start(trajectory)
    tested = [
        math.copysign(alpha_movement(a, b, 0.0), b - a) for a, b in zip(earlier, final, strict=True)
    ]
    centre = sorted(tested)[1:3]
    median = (centre[0] + centre[1]) / 2
    deviations = sorted(abs(m - median) for m in tested)
    noise = 1.4826 * (deviations[1] + deviations[2]) / 2
    level = checks.rule("alpha_drift_level") / (2 * 4 * 3)
    beyond = max(checks.rule("alpha_settled"), noise * float(stats.norm.isf(level)))
    turns = nmt_checks._HeadTurn.of(trajectory, 0.25, 0.5, seeds=3)
    assert [t.tested for t in turns] == pytest.approx(tested)
    assert all(t.beyond == pytest.approx(beyond) for t in turns)
    assert beyond > checks.rule("alpha_settled")  # the noise decides, not the floor
    assert [t.dipped for t in turns] == [False, False, False, True]
