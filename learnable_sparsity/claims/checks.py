r"""The tests behind the papers' qualitative claims, each on plain numbers (no files, no torch).

A check returns a :class:`Verdict`: ``reproduced``, ``not reproduced`` or ``not measurable``
(the results cannot decide: too few seeds, a method missing, runs still improving, collapsed
runs), with the evidence a reader needs to judge it (numbers, seeds, spread, the test used).

Comparative claims are tested over seeds with Welch's t-test (unequal variances), one-sided, at
rule ``significance``:

* *at least as good as* ("within seed noise of"): the candidate is **not** significantly worse
  than the baseline, and its mean is within a stated ``margin`` of it — with three seeds the
  test alone has little power, so the margin keeps a large gap from passing as noise;
* *below* / *above*: the difference in the stated direction is significant.

A comparison needs rule ``min_seeds`` seeds per method. Training length must not decide it:

* :func:`unsettled` — the *gap* between the compared methods' validation curves still has a
  trend over the last rule ``trend_window`` of the steps (:func:`gap_trend`: the gap of each pair
  of runs of the same seed regressed on the step, one intercept per pair and a common slope,
  tested against the scatter of the pairs around their lines — checkpoint and seed noise — at
  rule ``gap_trend_level``, Bonferroni over a claim's comparisons) that moves it by more than
  one checkpoint's scatter and rule ``still_improving`` in perplexity: one method is still
  catching up. Two models that improve in parallel compare settled: on a learnable task the NLL
  heads to 0 and never plateaus, but the ranking does;
* :func:`unconverged` — a run's own curve still improves by more than rule ``still_improving``
  (for a claim about one model's final state, or curves of different losses that cannot be
  subtracted).

Either makes the comparison "not measurable in this profile". Every "not measurable" says what
would decide it (:func:`not_measurable`'s ``decides``), from the run's own noise where it can: the
seeds a margin needs at the spread measured (:func:`seeds_for`), the steps after which a gate is
expected to open.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal

from scipy import stats

from learnable_sparsity.claims.preregistered import Rule, parse_rules
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.timing import quartiles, spreads_overlap

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable"
Status = Literal["reproduced", "not reproduced", "not measurable"]

# The rules in force for the verdicts being given: claims.yaml's ``rules``, with any values a
# caller overrides (:func:`rules_overridden`: the ±10% sensitivity of a verdict to a rule).
_OVERRIDES: ContextVar[Mapping[str, float | str]] = ContextVar("rules", default={})  # noqa: B039


@cache
def registry() -> dict[str, Rule]:
    """The rules of ``claims.yaml`` (:func:`preregistered.parse_rules
    <learnable_sparsity.claims.preregistered.parse_rules>`)."""
    text = resources.files(__package__).joinpath("claims.yaml").read_text("utf-8")
    return parse_rules(text)


def rule(name: str) -> Any:
    """The value of rule ``name`` in force: an override, else the registry's."""
    overrides = _OVERRIDES.get()
    if name in overrides:
        return overrides[name]
    rules = registry()
    if name not in rules:
        raise LearnableSparsityError(f"claims.yaml has no rule {name!r}")
    return rules[name].value


@contextmanager
def rules_overridden(values: Mapping[str, float | str]) -> Iterator[None]:
    """Give verdicts under ``values`` in place of the registry's rules of those names."""
    unknown = sorted(set(values) - set(registry()))
    if unknown:
        raise LearnableSparsityError(f"no such rules in claims.yaml: {unknown}")
    token = _OVERRIDES.set({**_OVERRIDES.get(), **values})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def min_seeds() -> int:
    """Fewest seeds per method for a comparison (rule ``min_seeds``)."""
    return int(rule("min_seeds"))


# What decides a speed verdict whose rounds straddle its bound: their interquartile range is the
# spread of single rounds, which more rounds estimate better but do not narrow.
QUIETER_ROUNDS = (
    "timing rounds with less spread (a machine without other work, or a GPU profile); more "
    "rounds estimate the interquartile range better but do not narrow it"
)

Curve = Sequence[tuple[float, float]]  # (step, value) pairs of a lower-is-better curve


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict: ``status``, the ``evidence`` in words and its ``numbers``."""

    status: Status
    evidence: str
    numbers: dict[str, object] = field(default_factory=dict)


def not_measurable(reason: str, *, decides: str, **numbers: object) -> Verdict:
    """ "Not measurable" because ``reason``, and what would decide it (``decides``: a length, a
    number of seeds, a result to record), both in the evidence and ``numbers["decides"]``."""
    evidence = f"{reason}; what would decide it: {decides}"
    return Verdict(NOT_MEASURABLE, evidence, {**numbers, "decides": decides})


def missing_results(missing: Mapping[str, str], *names: str) -> Verdict | None:
    """ "Not measurable", naming each of ``names`` that ``missing`` (result → why it is absent)
    holds; None when none is missing."""
    absent = [f"{name} ({missing[name]})" for name in names if name in missing]
    if not absent:
        return None
    return not_measurable(
        f"no results: {'; '.join(absent)}",
        decides="a run whose stages write them (a record kept before a result existed cannot)",
    )


def verdict(holds: bool, evidence: str, **numbers: object) -> Verdict:
    return Verdict(REPRODUCED if holds else NOT_REPRODUCED, evidence, dict(numbers))


# ------------------------------------------------------------------------------ statistics


def describe(values: Sequence[float], digits: int = 2) -> str:
    """``mean ± sd (n=…)``; the sd is the sample standard deviation over seeds."""
    if not values:
        return "no values"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f} (n=1)"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f} (n={len(values)})"


def beside(value: float, bound: float) -> str:
    """|``value``| with as many decimals (2 to 6) as show on which side of ``bound`` it lies:
    0.0056 beside a margin of 0.0063, not 0.01."""
    value = abs(value)
    for decimals in range(2, 7):
        if f"{value:.{decimals}f}" != f"{bound:.{decimals}f}":
            break
    return f"{value:.{decimals}f}"


def welch_p(a: Sequence[float], b: Sequence[float], alternative: str) -> float:
    """p-value of Welch's t-test of mean(a) − mean(b) with H1 ``less`` or ``greater``.

    When both samples have no spread the test is undefined; the difference of the means then
    decides (p = 0 when it lies in the direction of H1, else 1). When one has none, Welch's
    statistic and degrees of freedom are those of a one-sample t-test of the other against its
    constant, which is computed as such (the same p, without scipy's precision warning on a
    constant sample).
    """
    if alternative not in ("less", "greater"):
        raise LearnableSparsityError(
            f"alternative must be 'less' or 'greater', got {alternative!r}"
        )
    if len(a) < 2 or len(b) < 2:
        raise LearnableSparsityError(
            f"Welch's test needs 2+ values per side, got {len(a)}, {len(b)}"
        )
    constant_a, constant_b = statistics.pvariance(a) == 0, statistics.pvariance(b) == 0
    if constant_a and constant_b:
        difference = statistics.fmean(a) - statistics.fmean(b)
        toward = difference < 0 if alternative == "less" else difference > 0
        return 0.0 if toward else 1.0
    if constant_b:
        return float(stats.ttest_1samp(a, b[0], alternative=alternative).pvalue)
    if constant_a:
        flipped = "greater" if alternative == "less" else "less"
        return float(stats.ttest_1samp(b, a[0], alternative=flipped).pvalue)
    return float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)


def seeds_for(groups: Sequence[Sequence[float]], difference: float) -> int | None:
    """Seeds per method for a one-sided test at rule ``significance`` to find ``difference`` with
    rule ``power``, at the spread of ``groups`` (their pooled sample variance): the normal
    approximation n = g (z₁₋ₐ + z_power)² (sd ÷ difference)² for g groups (2: two methods, 1: one
    against a fixed value), at least rule ``min_seeds``; None when a group has fewer than 2 values
    (no spread to go by) or ``difference`` is 0."""
    if difference == 0 or any(len(group) < 2 for group in groups):
        return None
    variance = statistics.fmean(statistics.variance(group) for group in groups)
    z = stats.norm.ppf(1 - rule("significance")) + stats.norm.ppf(rule("power"))
    return max(min_seeds(), math.ceil(len(groups) * z * z * variance / difference**2))


def too_few_seeds(
    groups: Mapping[str, Sequence[float]], difference: float | None = None
) -> Verdict | None:
    """ "Not measurable" when a method is missing or has fewer than rule ``min_seeds`` seeds;
    what decides it: the seeds :func:`seeds_for` finds for ``difference`` (the claim's margin)
    where every method has a spread, else rule ``min_seeds``."""
    short = {name: len(values) for name, values in groups.items() if len(values) < min_seeds()}
    if not short:
        return None
    counts = ", ".join(f"{name}: {n}" for name, n in short.items())
    needed = seeds_for(list(groups.values()), difference) if difference else None
    decides = (
        f"about {needed} seeds per method (a difference of {difference:.3g} at the spread of "
        f"these seeds, one-sided p < {rule('significance')} with {rule('power'):.0%} power)"
        if needed
        else f"{min_seeds()} seeds per method, whose spread then gives how many the claim needs"
    )
    return not_measurable(
        f"not measurable in this profile: seeds per method {counts}; the test over seeds needs "
        f"{min_seeds()}",
        decides=decides,
        seeds=short,
        seeds_needed=needed or min_seeds(),
    )


def still_improving(curve: Sequence[tuple[float, float]], *, log_loss: bool = False) -> float:
    """Relative improvement (a lower-is-better curve) of the mean of the last
    rule ``convergence_window`` of the steps over the mean of the window before it (positive:
    still improving); 0 for a curve too short to tell. ``curve`` is (step, value) pairs.

    ``log_loss``: the values are a log-loss per token (NLL in nats), compared as perplexities,
    exp(old − new) − 1: the NLL of a learnable task heads to 0, where its relative change never
    settles, while its perplexity does.
    """
    windows = _window_means(curve)
    if windows is None:
        return 0.0
    old, new = windows
    if log_loss:
        return math.expm1(old - new)
    return (old - new) / max(abs(old), 1e-12)


def _window_means(curve: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(mean of the window before the last, mean of the last rule ``convergence_window`` of the
    steps); None for a curve too short to tell."""
    if len(curve) < 2:
        return None
    last_step = curve[-1][0]
    width = rule("convergence_window") * last_step
    recent = [v for s, v in curve if s > last_step - width]
    before = [v for s, v in curve if last_step - 2 * width < s <= last_step - width]
    if not before:  # sparse curves (validation every k steps): the point just before the window
        earlier = [v for s, v in curve if s <= last_step - width]
        before = earlier[-1:]
    if not recent or not before:
        return None
    return statistics.fmean(before), statistics.fmean(recent)


@dataclass(frozen=True)
class Trend:
    """The common slope of per-seed gaps over the last rule ``trend_window`` of the steps:
    ``change`` = slope × the window's width (the fitted move of the gap across it, in the
    curves' units), ``noise`` the residual sd (one checkpoint's scatter of a pair's gap about its
    line), ``p`` the two-sided p-value of "slope = 0", from ``points`` gaps of ``pairs`` seed
    pairs with ``df`` residual degrees of freedom, the curves ending at ``last_step``."""

    change: float
    noise: float
    p: float
    points: int
    pairs: int
    df: int
    last_step: float


def gap_trend(
    candidate: Sequence[Curve], baseline: Sequence[Curve], *, window: float | None = None
) -> Trend | None:
    """Whether the gap between two methods' curves still moves, tested against its own scatter.

    Runs are paired by seed (candidate[i] with baseline[i]: the same seed, the same data order);
    at every step both log in the last ``window`` of the steps, the pair's gap is
    g_i(t) = candidate_i(t) − baseline_i(t). The model g_i(t) = a_i + b·t + ε (one intercept per
    pair, one slope) is fitted by least squares; b's t-statistic uses the residual variance, i.e.
    the scatter of checkpoints and seeds about the fitted lines, with n − pairs − 1 degrees of
    freedom. None when they are fewer than 1 (too few steps or pairs to test a trend).
    """
    window = rule("trend_window") if window is None else window
    pairs = list(zip(candidate, baseline, strict=False))
    if not pairs or not all(c and b for c, b in pairs):
        return None
    last_step = max(curve[-1][0] for pair in pairs for curve in pair)
    start = last_step * (1 - window)
    steps, gaps, groups = [], [], []
    for index, (cand, base) in enumerate(pairs):
        base_at = {step: value for step, value in base if step > start}
        for step, value in cand:
            if step in base_at:
                steps.append(step)
                gaps.append(value - base_at[step])
                groups.append(index)
    used = sorted(set(groups))
    df = len(gaps) - len(used) - 1
    if df < 1:
        return None
    centred_t, centred_g = [], []
    for group in used:
        ts = [t for t, g in zip(steps, groups, strict=True) if g == group]
        gs = [v for v, g in zip(gaps, groups, strict=True) if g == group]
        mean_t, mean_g = statistics.fmean(ts), statistics.fmean(gs)
        centred_t += [t - mean_t for t in ts]
        centred_g += [v - mean_g for v in gs]
    spread = sum(t * t for t in centred_t)
    if spread == 0:
        return None
    slope = sum(t * g for t, g in zip(centred_t, centred_g, strict=True)) / spread
    residual = sum((g - slope * t) ** 2 for t, g in zip(centred_t, centred_g, strict=True))
    if residual == 0:
        p = 0.0 if slope != 0 else 1.0
    else:
        t_stat = slope / math.sqrt(residual / df / spread)
        p = float(2 * stats.t.sf(abs(t_stat), df))
    noise = math.sqrt(residual / df)
    return Trend(slope * window * last_step, noise, p, len(gaps), len(used), df, last_step)


def steps_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first step at which a lower-is-better curve is at or below ``target`` (None: never)."""
    return next((step for step, value in curve if value <= target), None)


def _still_moving(amounts: Mapping[str, float]) -> tuple[dict[str, float], str]:
    """The amounts above rule ``still_improving`` and the name of the largest ("" if none)."""
    moving = {name: amount for name, amount in amounts.items() if amount > rule("still_improving")}
    return moving, max(moving, key=moving.__getitem__, default="")


def unconverged(
    curves: Mapping[str, Sequence[tuple[float, float]]], what: str, *, log_loss: bool = False
) -> Verdict | None:
    """ "Not measurable" when a run's curve still improves by more than rule ``still_improving``
    (:func:`still_improving`; ``log_loss``: as a perplexity)."""
    gains = {name: still_improving(curve, log_loss=log_loss) for name, curve in curves.items()}
    moving, worst = _still_moving(gains)
    if not moving:
        return None
    # As for the gap: an improvement that falls as 1/step over a window of T's last fifth
    # falls as 1/T, below the rule still_improving after T · (gain ÷ it) steps.
    settles_after = curves[worst][-1][0] * moving[worst] / rule("still_improving")
    return not_measurable(
        f"not measurable in this profile: {len(moving)} of {len(gains)} runs still improve "
        f"({what} {moving[worst]:.1%} better over the last {rule('convergence_window'):.0%} of "
        f"the steps in {worst})",
        decides=(
            f"a longer run: if the improvement falls as 1/step, {worst} improves by less than "
            f"{rule('still_improving'):.0%} after about {settles_after:,.0f} steps"
        ),
        still_improving=moving,
        converged_after_steps=settles_after,
    )


def unsettled(
    comparisons: Mapping[str, tuple[Sequence[Curve], Sequence[Curve]]], what: str
) -> Verdict | None:
    """ "Not measurable" when, in a comparison (name → candidate's validation NLL curves,
    baseline's), the gap still moves: its trend (:func:`gap_trend`) differs from 0 at
    rule ``gap_trend_level`` divided by the number of comparisons, and its fitted move over the
    window is larger than both one checkpoint's scatter and rule ``still_improving`` in
    perplexity (the tolerance a single curve's improvement gets); or when too few validation
    points are there to test a trend. The NLL gap is the log of a perplexity ratio: its move is
    shown as one. What would decide it: if the gap closes as 1/step, its move over the last half
    of T steps falls as 1/T, so the gate is expected to open after T·(move ÷ what it may move)
    steps (``gate_opens_after_steps``), a longer profile's length to aim for."""
    level = rule("gap_trend_level") / max(len(comparisons), 1)
    trends = {
        name: gap_trend(candidate, baseline) for name, (candidate, baseline) in comparisons.items()
    }
    untested = [name for name, trend in trends.items() if trend is None]
    if untested:
        return not_measurable(
            f"not measurable in this profile: the {what} gap's trend cannot be tested in "
            f"{', '.join(untested)} (too few validation points in the last "
            f"{rule('trend_window'):.0%} of the steps, or no two runs of the same seed)",
            decides=(
                "runs of both methods with the same seeds, validated at least three times "
                f"over the last {rule('trend_window'):.0%} of their steps"
            ),
            gap_untested=untested,
        )
    material = math.log1p(rule("still_improving"))
    moving = {
        name: trend
        for name, trend in trends.items()
        if trend.p < level and abs(trend.change) > max(trend.noise, material)
    }
    numbers = {
        name: {"change": trend.change, "noise": trend.noise, "p": trend.p, "points": trend.points}
        for name, trend in trends.items()
    }
    if not moving:
        return None
    worst = min(moving, key=lambda name: moving[name].p)
    trend = moving[worst]
    opens_after = trend.last_step * abs(trend.change) / max(trend.noise, material)
    return not_measurable(
        f"not measurable in this profile: the {what} gap still moves in {len(moving)} of "
        f"{len(trends)} comparisons ({worst}: by {math.expm1(abs(trend.change)):.1%} in "
        f"perplexity over the last {rule('trend_window'):.0%} of the steps, beyond "
        f"{rule('still_improving'):.0%} and a checkpoint's scatter of {trend.noise:.3f} nats; p = "
        f"{trend.p:.3f} < {level:.3g} for a constant gap, {trend.points} points): training "
        "length, not the method, would decide the comparison",
        decides=(
            "a longer run: if the gap closes as 1/step (its move over the last half then falls "
            f"as 1/T), the gate opens after about {opens_after:,.0f} steps"
        ),
        gap_trend=numbers,
        gate_opens_after_steps=opens_after,
    )


# ------------------------------------------------------------------------------ comparisons


@dataclass(frozen=True)
class Comparison:
    """A candidate against a baseline over seeds: ``better_by`` the difference of the means in
    the metric's good direction (> 0: the candidate is better), ``p_worse`` the one-sided Welch
    p-value of "the candidate is worse", ``text`` both as mean ± sd (n)."""

    better_by: float
    p_worse: float
    text: str


def compare(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
    difference: float | None = None,
) -> Comparison | Verdict:
    """The :class:`Comparison`, or "not measurable" when a side has too few seeds (saying how
    many would tell ``difference``, the claim's margin — by default the difference measured —
    where both sides have a spread)."""
    if difference is None and candidate and baseline:
        difference = abs(statistics.fmean(candidate) - statistics.fmean(baseline))
    short = too_few_seeds(dict(zip(names, (candidate, baseline), strict=True)), difference)
    if short:
        return short
    sign = 1 if higher_is_better else -1
    return Comparison(
        better_by=sign * (statistics.fmean(candidate) - statistics.fmean(baseline)),
        p_worse=welch_p(candidate, baseline, "less" if higher_is_better else "greater"),
        text=f"{names[0]} {describe(candidate)} vs {names[1]} {describe(baseline)}",
    )


def at_least_as_good(
    candidate: Sequence[float],
    baseline: Sequence[float],
    margin: float,
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
) -> Verdict:
    """Reproduced when the candidate is not significantly worse than the baseline (one-sided
    Welch) and its mean is no more than ``margin`` worse."""
    c = compare(
        candidate, baseline, higher_is_better=higher_is_better, names=names, difference=margin
    )
    if isinstance(c, Verdict):
        return c
    evidence = (
        f"{c.text}: {'better' if c.better_by >= 0 else 'worse'} by {beside(c.better_by, margin)} "
        f"(margin {margin:.3g}); Welch one-sided p = {c.p_worse:.3f} for '{names[0]} worse'"
    )
    holds = c.p_worse >= rule("significance") and c.better_by >= -margin
    return verdict(holds, evidence, gap=c.better_by, p=c.p_worse, margin=margin)


def nearly_as_good(
    candidate: Sequence[float],
    baseline: Sequence[float],
    margin: float,
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
) -> Verdict:
    """ "Nearly as good": the candidate may trail the baseline by up to ``margin`` (a gap the
    publication itself reports). Reproduced when its mean trails by at most ``margin`` and it is
    not significantly further behind (one-sided Welch against the baseline moved ``margin`` in
    the candidate's favour)."""
    toward_candidate = -margin if higher_is_better else margin
    handicapped = [value + toward_candidate for value in baseline]
    c = compare(
        candidate, handicapped, higher_is_better=higher_is_better, names=names, difference=margin
    )
    if isinstance(c, Verdict):
        return c
    gap = c.better_by - margin  # the candidate's advantage over the baseline itself
    evidence = (
        f"{names[0]} {describe(candidate)} vs {names[1]} {describe(baseline)}: "
        f"{'better' if gap >= 0 else 'worse'} by {beside(gap, margin)} "
        f"(nearly: at most {margin:.3g} worse); "
        f"Welch one-sided p = {c.p_worse:.3f} for '{names[0]} more than {margin:.3g} worse'"
    )
    holds = c.p_worse >= rule("significance") and c.better_by >= 0
    return verdict(holds, evidence, gap=gap, p=c.p_worse, margin=margin)


def worse_by_at_most(
    candidate: Sequence[float],
    baseline: Sequence[float],
    largest_gap: float,
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
) -> Verdict:
    """ "A little below": the candidate is significantly worse (one-sided Welch), by no more than
    ``largest_gap`` in the mean."""
    c = compare(
        candidate, baseline, higher_is_better=higher_is_better, names=names, difference=largest_gap
    )
    if isinstance(c, Verdict):
        return c
    evidence = (
        f"{c.text}: {'worse' if c.better_by <= 0 else 'better'} by "
        f"{beside(c.better_by, largest_gap)} (a little: at most {largest_gap:.3g}); Welch "
        f"one-sided p = {c.p_worse:.3f} for '{names[0]} worse'"
    )
    holds = c.p_worse < rule("significance") and -c.better_by <= largest_gap
    return verdict(holds, evidence, gap=c.better_by, p=c.p_worse, largest_gap=largest_gap)


def significantly_below(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    names: tuple[str, str] = ("candidate", "baseline"),
) -> Verdict:
    """The candidate's mean is significantly below the baseline's (one-sided Welch)."""
    c = compare(candidate, baseline, names=names)
    if isinstance(c, Verdict):
        return c
    evidence = f"{c.text}: Welch one-sided p = {c.p_worse:.3f} for '{names[0]} below {names[1]}'"
    return verdict(c.p_worse < rule("significance"), evidence, p=c.p_worse)


def _against_value(
    values: Sequence[float], value: float, *, below: bool, names: tuple[str, str]
) -> Verdict:
    """One-sided one-sample t-test of the mean of ``values`` (seeds) against a number without
    seed variance (a deterministic baseline), below it or above it; with no spread among the
    seeds the mean's side of the value decides (p = 0 or 1)."""
    short = too_few_seeds(
        {names[0]: values}, abs(statistics.fmean(values) - value) if values else None
    )
    if short:
        return short
    side = "below" if below else "above"
    if statistics.pvariance(values) == 0:
        mean = statistics.fmean(values)
        p = 0.0 if (mean < value if below else mean > value) else 1.0
    else:
        alternative = "less" if below else "greater"
        p = float(stats.ttest_1samp(values, value, alternative=alternative).pvalue)
    evidence = (
        f"{names[0]} {describe(values)} vs {names[1]} {value:.2f}: one-sample t-test one-sided "
        f"p = {p:.3f} for '{names[0]} {side} {names[1]}'"
    )
    return verdict(p < rule("significance"), evidence, p=p)


def significantly_below_value(
    values: Sequence[float], value: float, *, names: tuple[str, str] = ("candidate", "value")
) -> Verdict:
    """The mean of ``values`` (seeds) significantly below ``value``, a number without seed
    variance (:func:`_against_value`)."""
    return _against_value(values, value, below=True, names=names)


def significantly_above_value(
    values: Sequence[float], value: float, *, names: tuple[str, str] = ("candidate", "value")
) -> Verdict:
    """The mean of ``values`` (seeds) significantly above ``value`` (:func:`_against_value`)."""
    return _against_value(values, value, below=False, names=names)


def mean_at_most(values: Sequence[float], bound: float, what: str) -> Verdict:
    """The mean of ``values`` (seeds) at most ``bound``: a published level the claim must not
    exceed (a cost such as decoder calls); no values: not measurable."""
    if not values:
        return not_measurable(f"no {what}", decides=f"runs that record the {what}")
    mean = statistics.fmean(values)
    return verdict(
        mean <= bound,
        f"{what} {describe(values)} ({'at most' if mean <= bound else 'above'} {bound:g})",
        values=list(values),
        bound=bound,
    )


def all_of(parts: Mapping[str, Verdict]) -> Verdict:
    """One verdict from several: not reproduced if any part is (a decided failure outranks a
    part the results cannot decide), else not measurable if any part is, else reproduced."""
    if not parts:
        raise LearnableSparsityError("all_of needs at least one part")
    lines = "; ".join(f"{name}: {part.evidence}" for name, part in parts.items())
    numbers = {name: {"status": part.status, **part.numbers} for name, part in parts.items()}
    failed = [name for name, part in parts.items() if part.status == NOT_REPRODUCED]
    if failed:
        return Verdict(NOT_REPRODUCED, f"fails for {', '.join(failed)} — {lines}", numbers)
    blocked = [name for name, part in parts.items() if part.status == NOT_MEASURABLE]
    if blocked:
        return Verdict(NOT_MEASURABLE, lines, numbers)
    return Verdict(REPRODUCED, lines, numbers)


def ratio_near_one(rounds: Sequence[float], tolerance: float, name: str) -> Verdict:
    """The rounds' ratio lies within 1 ± ``tolerance``: reproduced when the interquartile range
    of the rounds (:func:`learnable_sparsity.timing.quartiles`) lies inside the band, not reproduced
    when it lies wholly outside; where it straddles an edge the rounds cannot tell, as in
    :func:`lowest`: not measurable."""
    if not rounds:
        return not_measurable(f"no measurement of {name}", decides=f"timing rounds of {name}")
    median = statistics.median(rounds)
    q1, q3 = quartiles(rounds)
    low, high = 1 - tolerance, 1 + tolerance
    evidence = (
        # three digits: at two, a quartile of 0.847 would read as 0.85, inside a band it is not
        f"{name} median {median:.2f} (IQR {q1:.3f}–{q3:.3f}) over {len(rounds)} rounds; near 1 "
        f"means within ±{tolerance} ({low:.2f}–{high:.2f})"
    )
    numbers = {"median": median, "quartiles": [q1, q3], "rounds": list(rounds)}
    inside, outside = low <= q1 and q3 <= high, q3 < low or q1 > high
    if not (inside or outside):
        edge = low if q1 < low else high
        return not_measurable(
            f"{evidence}; the rounds' interquartile range straddles {edge:.2f}: the rounds "
            "cannot tell whether the ratio is within the band",
            decides=QUIETER_ROUNDS,
            **numbers,
        )
    return verdict(inside, evidence, **numbers)


def ratio_at_least(rounds: Sequence[float], floor: float, name: str) -> Verdict:
    """The per-round ratio is at least ``floor``: reproduced when the interquartile range of the
    rounds lies at or above it, not reproduced when it lies wholly below, not measurable when it
    straddles it (as :func:`ratio_near_one`)."""
    if not rounds:
        return not_measurable(f"no measurement of {name}", decides=f"timing rounds of {name}")
    median = statistics.median(rounds)
    q1, q3 = quartiles(rounds)
    evidence = (
        f"{name} median {median:.2f} (IQR {q1:.3f}–{q3:.3f}) over {len(rounds)} rounds; "
        f"at least {floor:g} needed"
    )
    numbers = {"median": median, "quartiles": [q1, q3], "rounds": list(rounds), "floor": floor}
    if q1 < floor <= q3:
        return not_measurable(
            f"{evidence}; the rounds' interquartile range straddles {floor:g}: the rounds cannot "
            "tell on which side the ratio lies",
            decides=QUIETER_ROUNDS,
            **numbers,
        )
    return verdict(q1 >= floor, evidence, **numbers)


def lowest(rounds: Mapping[str, Sequence[float]], name: str, what: str) -> Verdict:
    """``name`` has the lowest median of the per-round ``rounds`` (e.g. ratios to softmax in
    each round), and the interquartile ranges of its rounds and of the nearest other's do not
    overlap (:func:`learnable_sparsity.timing.spreads_overlap`). Where they overlap the rounds
    cannot order the two: not measurable (a tie within noise is neither reproduced nor refuted)."""
    rounds = {key: values for key, values in rounds.items() if values}
    if name not in rounds or len(rounds) < 2:
        return not_measurable(
            f"{what}: needs {name} and at least one other variant",
            decides=f"timing rounds of {name} and another variant",
        )
    medians = {key: statistics.median(values) for key, values in rounds.items()}
    order = sorted(medians, key=medians.__getitem__)
    listing = ", ".join(_with_quartiles(k, medians[k], rounds[k]) for k in order)
    evidence = f"{what} (median ratio to softmax over the rounds, IQR): {listing}"
    nearest = order[1] if order[0] == name else order[0]
    if spreads_overlap(rounds[name], rounds[nearest]):
        return not_measurable(
            f"{evidence}; {name} and {nearest} are within the rounds' spread (their "
            "interquartile ranges overlap): the rounds cannot tell which is slower",
            decides=QUIETER_ROUNDS,
            order=order,
            tie=[name, nearest],
        )
    return verdict(order[0] == name, evidence, order=order)


def _with_quartiles(key: str, median: float, values: Sequence[float]) -> str:
    q1, q3 = quartiles(values)
    return f"{key} {median:.2f} ({q1:.2f}–{q3:.2f})"


def finite(values: Sequence[float]) -> list[float]:
    """The finite values (a diverged run's NaN would poison every mean)."""
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
