r"""The tests behind the papers' qualitative claims, each on plain numbers (no files, no torch).

A check returns a :class:`Verdict`: ``reproduced``, ``not reproduced`` or ``not measurable``
(the results cannot decide: too few seeds, a method missing, runs still improving, collapsed
runs), with the evidence a reader needs to judge it (numbers, seeds, spread, the test used).

Every level, window and rule is claims.yaml's ``rules`` (:func:`rule`), with the commit and time
it was fixed. Comparative claims are decided by one-sided confidence bounds over seeds at rule
``significance`` — of the per-seed differences where both methods ran the same seeds (rule
``paired_seeds``), else Welch's:

* *at least as good as* / *matches* / *on par* / *nearly* (rule ``equivalence_test``,
  :func:`at_least_as_good`): non-inferiority — reproduced when the upper bound of the deficit
  lies below the margin, not reproduced when its lower bound lies above it, otherwise not
  measurable with the seeds that would decide it;
* *below* / *above* / *beats* (rule ``superiority_test``, :func:`significantly_below`): the
  bound of the difference beyond 0, refuted by the other bound on the wrong side of 0;
* *a little below* (:func:`worse_by_at_most`): the deficit's bounds inside (0, largest gap).

A claim is one family (rule ``multiplicity``, :func:`all_of`): it is reproduced only when every
part is (an intersection-union test, each at the level), refuted only by a part Holm's
procedure over the claim's refuting tests rejects, and its gap gates are Holm over its
comparisons (:func:`unsettled_each`). Each verdict's numbers carry its ``edge``: the statistic,
the threshold it is compared with and their distance. A comparison needs rule ``min_seeds``
seeds per method. Training length must not decide it:

* :func:`unsettled_each` — the *gap* between the compared methods' validation curves still has
  a trend over the last rule ``trend_window`` of the steps (:func:`gap_trend`: the gap of each
  pair of runs of the same seed fitted by its own line, the pairs' moves the replicates of a
  t-test at rule ``gap_trend_level``, Holm over a claim's comparisons; rule
  ``gap_trend_test``) whose move still to come if it closes as 1/step exceeds rule
  ``still_improving`` in perplexity and the share of the gap at which the comparison's verdict
  would flip (:func:`flips_at`, rule ``gap_materiality``): one method is still catching up by
  enough to decide it. Two models that improve in parallel compare settled: on a learnable task
  the NLL heads to 0 and never plateaus, but the ranking does;
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

from learnable_sparsity.claims.preregistered import Rule, parse_rules
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.extras import needs_extra
from learnable_sparsity.timing import quartiles, spreads_overlap

with needs_extra("pipeline", __name__):
    from scipy import stats

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable"
Status = Literal["reproduced", "not reproduced", "not measurable"]

# The rules in force for the verdicts being given: claims.yaml's ``rules``, with any values a
# caller overrides (:func:`rules_overridden`: the ±10% sensitivity of a verdict to a rule).
_OVERRIDES: ContextVar[Mapping[str, float | str]] = ContextVar("rules", default={})  # noqa: B039


# The rules of claims.yaml that name a test rather than a number, as this code implements them:
# a registry naming another (claims.yaml edited without the code) is refused before any verdict.
IMPLEMENTED = {
    "gap_trend_test": "seed pairs as replicates",
    "gap_materiality": "the verdict could flip",
    "alpha_head_test": "the heads a claim counts",
    "alpha_drift_test": "seeds' common moves as replicates",
    "equivalence_test": "non-inferiority bound",
    "superiority_test": "confidence bound",
    "multiplicity": "Holm per claim",
    "paired_seeds": "paired where the seeds match",
}


@cache
def registry() -> dict[str, Rule]:
    """The rules of ``claims.yaml`` (:func:`preregistered.parse_rules
    <learnable_sparsity.claims.preregistered.parse_rules>`), checked to name the tests this code
    implements (:data:`IMPLEMENTED`)."""
    text = resources.files(__package__).joinpath("claims.yaml").read_text("utf-8")
    rules = parse_rules(text)
    for name, implemented in IMPLEMENTED.items():
        named = rules[name].value if name in rules else None
        if named != implemented:
            raise LearnableSparsityError(
                f"claims.yaml: rule {name!r} names {named!r}, but the checks implement "
                f"{implemented!r}"
            )
    return rules


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
    """The trend of per-seed-pair gaps over the last rule ``trend_window`` of the steps, with
    the seed pairs as the replicates (rule ``gap_trend_test``): each pair's gap fitted by its
    own line, ``moves`` the fitted move of each pair's gap across the window (slope × the
    window's width, in the curves' units), ``change`` their mean, ``se`` its standard error over
    the pairs and ``p`` the two-sided p-value of "mean move = 0" (t with ``df`` = pairs − 1);
    ``gap`` the pairs' mean fitted gap at their last step, ``noise`` the pooled sd of the
    checkpoints about their pairs' lines (0 where each pair has two points), from ``points``
    gaps of ``pairs`` seed pairs, the curves ending at ``last_step``."""

    change: float
    se: float
    gap: float
    noise: float
    p: float
    points: int
    pairs: int
    df: int
    last_step: float
    moves: tuple[float, ...] = ()

    def still_to_move(self, window: float) -> float:
        """The gap's move still to come if it closes as 1/step: g(t) = g∞ + c/t moves by
        −c/T · w/(1 − w) over the last ``window`` w of T steps and by −c/T from T on, i.e.
        ``change`` × (1 − w)/w."""
        return abs(self.change) * (1 - window) / window


def _pair_line(points: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least-squares line through one pair's (step, gap) points: its slope, its fitted gap at
    the last step and its residual sum of squares; None below two distinct steps."""
    steps = [t for t, _ in points]
    mean_t = statistics.fmean(steps)
    mean_g = statistics.fmean(g for _, g in points)
    spread = sum((t - mean_t) ** 2 for t in steps)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (g - mean_g) for t, g in points) / spread
    residual = sum((g - mean_g - slope * (t - mean_t)) ** 2 for t, g in points)
    return slope, mean_g + slope * (max(steps) - mean_t), residual


def line_move(points: Sequence[tuple[float, float]], width: float) -> float | None:
    """The move over ``width`` steps of the least-squares line through (step, value)
    ``points`` (None below two distinct steps)."""
    line = _pair_line(points) if points else None
    return None if line is None else line[0] * width


def gap_trend(
    candidate: Sequence[Curve], baseline: Sequence[Curve], *, window: float | None = None
) -> Trend | None:
    """Whether the gap between two methods' curves still moves, with the seed pairs as the
    replicates.

    Runs are paired by seed (candidate[i] with baseline[i]: the same seed, the same data order);
    at every step both log in the last ``window`` of the steps, the pair's gap is
    g_i(t) = candidate_i(t) − baseline_i(t), fitted by its own line a_i + b_i·t. Each pair's move
    m_i = b_i × the window's width is one replicate: a checkpoint wobble shared by a seed's two
    runs cancels in g_i, and a pair's own drift is one value, not as many as it has checkpoints.
    The test is a one-sample t-test of the mean move over the pairs (df = pairs − 1). None when
    fewer than two pairs have two steps in the window (no spread of moves to test against).
    """
    window = rule("trend_window") if window is None else window
    pairs = list(zip(candidate, baseline, strict=False))
    if not pairs or not all(c and b for c, b in pairs):
        return None
    last_step = max(curve[-1][0] for pair in pairs for curve in pair)
    start = last_step * (1 - window)
    gaps = []
    for cand, base in pairs:
        base_at = {step: value for step, value in base if step > start}
        gaps.append([(step, value - base_at[step]) for step, value in cand if step in base_at])
    return replicate_trend(gaps, window * last_step, last_step)


def replicate_trend(
    series: Sequence[Sequence[tuple[float, float]]], width: float, last_step: float
) -> Trend | None:
    """The trend of replicated series (a seed pair's gap, a seed's mean α): each series' points
    fitted by its own line a_i + b_i·t, its move m_i = b_i × ``width`` one replicate, and a
    one-sample t-test of the mean move over the series (df = series − 1; p = 0 where every
    series moved alike by a non-zero amount, 1 where none moved). None when fewer than two
    series have two distinct steps (no spread of moves to test against)."""
    lines, points, residual = [], 0, 0.0
    for values in series:
        line = _pair_line(values) if values else None
        if line is not None:
            lines.append(line)
            points += len(values)
            residual += line[2]
    if len(lines) < 2:
        return None
    moves = tuple(slope * width for slope, _, _ in lines)
    change, df = statistics.fmean(moves), len(moves) - 1
    se = statistics.stdev(moves) / math.sqrt(len(moves))
    constant = 0.0 if change != 0 else 1.0  # series that all moved alike: no spread to test
    p = float(2 * stats.t.sf(abs(change) / se, df)) if se > 0 else constant
    left = points - 2 * len(lines)
    noise = math.sqrt(residual / left) if left > 0 else 0.0
    gap = statistics.fmean(end for _, end, _ in lines)
    return Trend(change, se, gap, noise, p, points, len(lines), df, last_step, moves)


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


def holm(pvalues: Mapping[str, float], level: float) -> set[str]:
    """The names whose null hypotheses Holm's step-down procedure rejects at family-wise
    ``level``: sorted by p, the i-th smallest (from 0) of m is rejected while every p up to it
    is at most level ÷ (m − i)."""
    rejected: set[str] = set()
    ordered = sorted(pvalues, key=pvalues.__getitem__)
    for i, name in enumerate(ordered):
        if pvalues[name] > level / (len(ordered) - i):
            break
        rejected.add(name)
    return rejected


def _undecidable(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.status == NOT_MEASURABLE


def flips_at(verdict: Verdict | None) -> float:
    """The share of the validation-NLL gap by which the gap must move for ``verdict`` to flip
    (rule ``gap_materiality``): the verdict's statistic read as proportional to the gap, it
    reaches its threshold when the gap moves by |distance| ÷ |statistic| of itself (its
    ``edge``). 0 — any material move could decide it — for no verdict, a "not measurable" one
    or one without an edge."""
    if verdict is None or _undecidable(verdict):
        return 0.0
    edge = verdict.numbers.get("edge")
    if not isinstance(edge, Mapping) or not edge.get("statistic"):
        return 0.0
    return abs(float(edge["distance"])) / abs(float(edge["statistic"]))


@dataclass(frozen=True)
class _GapFamily:
    """The gap trends of one claim's comparisons (:func:`gap_trend`; None: untestable), the
    names whose trend moves and the family's description. A trend moves when Holm's procedure
    over the tested trends at rule ``gap_trend_level`` rejects "no trend" and the move still to
    come if the gap closes as 1/step (:meth:`Trend.still_to_move`) is material: beyond rule
    ``still_improving`` in perplexity and at least the share of the gap at which the
    comparison's verdict would flip (:func:`flips_at`, rule ``gap_materiality``)."""

    trends: dict[str, Trend | None]
    moving: list[str]
    family: str
    bounds: dict[str, float]

    @classmethod
    def of(
        cls,
        comparisons: Mapping[str, tuple[Sequence[Curve], Sequence[Curve]]],
        verdicts: Mapping[str, Verdict | None],
    ) -> _GapFamily:
        trends = {name: gap_trend(cand, base) for name, (cand, base) in comparisons.items()}
        tested = {name: trend for name, trend in trends.items() if trend is not None}
        level, window = rule("gap_trend_level"), rule("trend_window")
        significant = holm({name: trend.p for name, trend in tested.items()}, level)
        floor = math.log1p(rule("still_improving"))
        bounds = {
            name: max(floor, flips_at(verdicts.get(name)) * abs(trend.gap))
            for name, trend in tested.items()
        }
        moving = [
            name
            for name, trend in tested.items()
            if name in significant and trend.still_to_move(window) > bounds[name]
        ]
        family = (
            f"Holm over the claim's {len(trends)} gap trends at {level:g}"
            if len(trends) > 1
            else f"level {level:g}"
        )
        return cls(trends, moving, family, bounds)

    def untested(self, names: Sequence[str], what: str) -> Verdict:
        window = rule("trend_window")
        return not_measurable(
            f"not measurable in this profile: the {what} gap's trend cannot be tested in "
            f"{', '.join(names)} (too few validation points in the last {window:.0%} of the "
            "steps, or fewer than two seed pairs)",
            decides=(
                "runs of both methods with the same seeds (two or more), validated at least "
                f"twice over the last {window:.0%} of their steps"
            ),
            gap_untested=list(names),
        )

    def _material(self, name: str) -> str:
        """What makes a move of comparison ``name`` material, in words."""
        trend, bound = self.trends[name], self.bounds[name]
        if trend is None or bound <= math.log1p(rule("still_improving")):
            return f"{rule('still_improving'):.0%} in perplexity"
        return f"{bound / abs(trend.gap):.0%} of the gap {trend.gap:+.3f}, where its verdict flips"

    def moves(self, names: Sequence[str], what: str) -> Verdict:
        """ "Not measurable" for the moving comparisons ``names``, naming the one with the
        smallest p."""
        trends = {name: trend for name in names if (trend := self.trends[name]) is not None}
        worst = min(trends, key=lambda name: trends[name].p)
        trend, bound = trends[worst], self.bounds[worst]
        window = rule("trend_window")
        still = trend.still_to_move(window)
        opens_after = trend.last_step * still / bound
        where = f"{len(names)} of {len(self.trends)} comparisons ({worst}: "
        return not_measurable(
            f"not measurable in this profile: the {what} gap still moves in {where}by "
            f"{math.expm1(abs(trend.change)):.1%} in perplexity over the last {window:.0%} of "
            f"the steps (mean of {trend.pairs} seed pairs' moves, se {trend.se:.3f} nats; "
            f"p = {trend.p:.3f} for a constant gap, {self.family}); if it closes as 1/step it "
            f"moves {still:.3f} nats more, beyond {bound:.3f} ({self._material(worst)}): "
            "training length, not the method, could decide the comparison",
            decides=(
                "a longer run: if the gap closes as 1/step (its move still to come then "
                f"falls as 1/T), the gate opens after about {opens_after:,.0f} steps"
            ),
            gap_trend={
                name: {
                    "change": t.change,
                    "se": t.se,
                    "gap": t.gap,
                    "noise": t.noise,
                    "p": t.p,
                    "points": t.points,
                    "pairs": t.pairs,
                    "material": self.bounds[name],
                }
                for name, t in self.trends.items()
                if t is not None
            },
            gate_opens_after_steps=opens_after,
        )


def unsettled_each(
    comparisons: Mapping[str, tuple[Sequence[Curve], Sequence[Curve]]],
    what: str,
    verdicts: Mapping[str, Verdict | None] | None = None,
) -> dict[str, Verdict | None]:
    """Per comparison (name → candidate's validation NLL curves, baseline's): "not measurable"
    when the gap still moves, None when it does not. The comparisons are one claim's family:
    a gap moves when Holm's procedure over their trends (:func:`gap_trend`, the seed pairs as
    replicates) at rule ``gap_trend_level`` rejects "no trend" for it and the move still to
    come if it closes as 1/step could decide the comparison: more than rule
    ``still_improving`` in perplexity (the tolerance a single curve's improvement gets) and at
    least the share of the gap at which its verdict in ``verdicts`` (name → the comparison's
    verdict, judged on the runs as they are) would flip (:func:`flips_at`). A gap whose trend
    cannot be tested is not measurable too, unless its verdict already is (it says why). The
    NLL gap is the log of a perplexity ratio: its move is shown as one. What would decide it:
    the move still to come falls as 1/T, so the gate is expected to open after
    T·(move ÷ what it may move) steps (``gate_opens_after_steps``), a longer profile's length
    to aim for."""
    verdicts = verdicts or {}
    gaps = _GapFamily.of(comparisons, verdicts)
    return {
        name: (
            # a comparison already not measurable (too few seeds) says so itself
            None
            if trend is None and _undecidable(verdicts.get(name))
            else gaps.untested([name], what)
            if trend is None
            else gaps.moves([name], what)
            if name in gaps.moving
            else None
        )
        for name, trend in gaps.trends.items()
    }


def unsettled(
    comparisons: Mapping[str, tuple[Sequence[Curve], Sequence[Curve]]], what: str
) -> Verdict | None:
    """One gate for all ``comparisons`` (one family, as :func:`unsettled_each`, every move
    beyond rule ``still_improving`` material): "not measurable" naming the comparisons whose
    trend cannot be tested, else those whose gap still moves (the one with the smallest p
    first); None when every gap has settled."""
    gaps = _GapFamily.of(comparisons, {})
    untested = [name for name, trend in gaps.trends.items() if trend is None]
    if untested:
        return gaps.untested(untested, what)
    return gaps.moves(gaps.moving, what) if gaps.moving else None


# ------------------------------------------------------------------------------ comparisons


@dataclass(frozen=True)
class Comparison:
    """A candidate against a baseline over seeds: ``better_by`` the difference of the means in
    the metric's good direction (> 0: the candidate is better), its standard error ``se`` and
    degrees of freedom ``df`` — of the per-seed differences where the seeds are ``paired``
    (the same seeds in both, rule ``paired_seeds``), else Welch's —, ``spread`` the groups whose
    variance gives the seeds a difference needs, ``text`` both sides as mean ± sd (n)."""

    better_by: float
    se: float
    df: float
    paired: bool
    spread: tuple[Sequence[float], ...]
    text: str

    def bound(self, lower: bool, level: float | None = None) -> float:
        """The one-sided confidence bound of ``better_by`` at ``level`` (default: rule
        ``significance``), the lower or the upper."""
        level = rule("significance") if level is None else level
        reach = float(stats.t.ppf(1 - level, self.df)) * self.se if self.se > 0 else 0.0
        return self.better_by - reach if lower else self.better_by + reach

    def p_beyond(self, value: float, above: bool) -> float:
        """One-sided p-value of "``better_by`` > ``value``" (``above``) or "< ``value``"
        against its complement."""
        if self.se == 0:
            return 0.0 if (self.better_by > value if above else self.better_by < value) else 1.0
        t_stat = (self.better_by - value) / self.se
        return float(stats.t.sf(t_stat, self.df) if above else stats.t.cdf(t_stat, self.df))

    def seeds_to_decide(self, difference: float) -> int | None:
        """Seeds per method at which a bound would clear ``difference`` with rule ``power``."""
        return seeds_for(self.spread, difference)


def compare(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
    difference: float | None = None,
    paired: bool = False,
) -> Comparison | Verdict:
    """The :class:`Comparison`, paired when ``paired`` (the lists are the same seeds in the
    same order) and they are as long; or "not measurable" when a side has too few seeds (saying
    how many would tell ``difference``, the claim's margin — by default the difference
    measured — where both sides have a spread)."""
    if difference is None and candidate and baseline:
        difference = abs(statistics.fmean(candidate) - statistics.fmean(baseline))
    short = too_few_seeds(dict(zip(names, (candidate, baseline), strict=True)), difference)
    if short:
        return short
    sign = 1 if higher_is_better else -1
    text = f"{names[0]} {describe(candidate)} vs {names[1]} {describe(baseline)}"
    paired = paired and len(candidate) == len(baseline)
    if paired:
        gains = [sign * (c - b) for c, b in zip(candidate, baseline, strict=True)]
        se = statistics.stdev(gains) / math.sqrt(len(gains))
        return Comparison(
            statistics.fmean(gains), se, len(gains) - 1, True, (gains,), f"{text}, paired by seed"
        )
    va, vb = (
        statistics.variance(candidate) / len(candidate),
        statistics.variance(baseline) / len(baseline),
    )
    se = math.sqrt(va + vb)
    df = (
        (va + vb) ** 2 / (va**2 / (len(candidate) - 1) + vb**2 / (len(baseline) - 1))
        if se > 0
        else float(len(candidate) + len(baseline) - 2)
    )
    better_by = sign * (statistics.fmean(candidate) - statistics.fmean(baseline))
    return Comparison(better_by, se, df, False, (candidate, baseline), f"{text}, Welch")


def _bounds_text(c: Comparison, what: str) -> str:
    level = rule("significance")
    low, high = c.bound(lower=True), c.bound(lower=False)
    return (
        f"{what} {c.better_by:+.3g}, one-sided {1 - level:.0%} bounds {low:+.3g} / {high:+.3g} "
        f"(df {c.df:.1f})"
    )


def _undecided(evidence: str, c: Comparison, distance: float, **numbers: object) -> Verdict:
    """ "Not measurable": the confidence interval holds the edge; the seeds per method at which
    a bound would clear it by ``distance`` (the estimate's distance from the edge)."""
    needed = c.seeds_to_decide(distance) if distance else None
    decides = (
        f"about {needed} seeds per method (the estimate's distance {distance:.3g} from the edge "
        f"at the spread of these seeds, one-sided {rule('significance'):g}, "
        f"{rule('power'):.0%} power)"
        if needed
        else "more seeds: the estimate lies on the edge"
    )
    return not_measurable(
        f"{evidence}: the confidence bounds lie on both sides of the edge",
        decides=decides,
        **numbers,
        seeds_needed=needed,
    )


def at_least_as_good(
    candidate: Sequence[float],
    baseline: Sequence[float],
    margin: float,
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
    paired: bool = False,
) -> Verdict:
    """Non-inferiority (rule ``equivalence_test``): the candidate's deficit D = −better_by is
    below ``margin`` with confidence — reproduced when the one-sided upper bound of D at rule
    ``significance`` is below the margin, not reproduced when the lower bound is above it
    (``p_refutes``: the p-value of "D > margin"), otherwise not measurable, saying the seeds at
    which a bound would clear the margin. A true deficit equal to the margin is reproduced with
    probability at most the level."""
    c = compare(
        candidate,
        baseline,
        higher_is_better=higher_is_better,
        names=names,
        difference=margin,
        paired=paired,
    )
    if isinstance(c, Verdict):
        return c
    deficit, upper, lower = -c.better_by, -c.bound(lower=True), -c.bound(lower=False)
    deciding = lower if lower > margin else upper
    evidence = (
        f"{c.text}: {'better' if c.better_by >= 0 else 'worse'} by {beside(c.better_by, margin)}; "
        f"deficit's one-sided {1 - rule('significance'):.0%} bounds {lower:.3g} / {upper:.3g} "
        f"against the margin {margin:.3g} (df {c.df:.1f})"
    )
    numbers = {
        "gap": c.better_by,
        "deficit_bounds": [lower, upper],
        "margin": margin,
        "paired": c.paired,
        "p_refutes": c.p_beyond(-margin, above=False),
        # the bound that decides: the lower where it refutes, else the upper
        "edge": {"statistic": deciding, "threshold": margin, "distance": margin - deciding},
    }
    if upper < margin:
        return verdict(True, evidence, **numbers)
    if lower > margin:
        return verdict(False, evidence, **numbers)
    return _undecided(evidence, c, abs(margin - deficit), **numbers)


def worse_by_at_most(
    candidate: Sequence[float],
    baseline: Sequence[float],
    largest_gap: float,
    *,
    higher_is_better: bool = True,
    names: tuple[str, str] = ("candidate", "baseline"),
    paired: bool = False,
) -> Verdict:
    """ "A little below": the deficit D is above 0 and below ``largest_gap``, each with
    confidence (both one-sided bounds at rule ``significance``: an intersection-union test).
    Not reproduced when a bound shows it outside (D < 0 or D > ``largest_gap``); otherwise not
    measurable."""
    c = compare(
        candidate,
        baseline,
        higher_is_better=higher_is_better,
        names=names,
        difference=largest_gap,
        paired=paired,
    )
    if isinstance(c, Verdict):
        return c
    deficit, upper, lower = -c.better_by, -c.bound(lower=True), -c.bound(lower=False)
    evidence = (
        f"{c.text}: {'worse' if c.better_by <= 0 else 'better'} by "
        f"{beside(c.better_by, largest_gap)}; deficit's one-sided "
        f"{1 - rule('significance'):.0%} bounds {lower:.3g} / {upper:.3g} (a little: above 0, "
        f"at most {largest_gap:.3g}; df {c.df:.1f})"
    )
    edge = min((lower, 0.0), (largest_gap - upper, largest_gap), key=lambda pair: abs(pair[0]))
    numbers = {
        "gap": c.better_by,
        "deficit_bounds": [lower, upper],
        "largest_gap": largest_gap,
        "paired": c.paired,
        "p_refutes": min(c.p_beyond(0, above=True), c.p_beyond(-largest_gap, above=False)),
        "edge": {"statistic": deficit, "threshold": edge[1], "distance": edge[0]},
    }
    if lower > 0 and upper < largest_gap:
        return verdict(True, evidence, **numbers)
    if upper < 0 or lower > largest_gap:
        return verdict(False, evidence, **numbers)
    distance = min(abs(deficit), abs(largest_gap - deficit))
    return _undecided(evidence, c, distance, **numbers)


def significantly_below(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    names: tuple[str, str] = ("candidate", "baseline"),
    paired: bool = False,
) -> Verdict:
    """Superiority (rule ``superiority_test``): the candidate's mean below the baseline's —
    reproduced when the one-sided upper bound of candidate − baseline at rule ``significance``
    is below 0, not reproduced when its lower bound is above 0 (``p_refutes``), otherwise not
    measurable with the seeds that would decide it."""
    c = compare(candidate, baseline, names=names, paired=paired, higher_is_better=False)
    if isinstance(c, Verdict):
        return c
    # better_by = baseline − candidate here: "below" is the good direction
    evidence = f"{c.text}: {_bounds_text(c, f'{names[1]} − {names[0]}')}"
    return _by_the_gains_bounds(c, evidence, paired=c.paired)


def _by_the_gains_bounds(c: Comparison, evidence: str, **extra: object) -> Verdict:
    """Reproduced when the lower confidence bound of the gain (``c.better_by``, the good
    direction) is above 0, not reproduced when its upper bound is below 0, otherwise not
    measurable with the seeds that would decide it; the bounds, ``extra``, the p-value against
    the claim and the distance of the deciding bound from 0 go with the verdict."""
    numbers = {
        "gap": c.better_by,
        "bounds": [c.bound(lower=True), c.bound(lower=False)],
        **extra,
        "p_refutes": c.p_beyond(0, above=False),
        "edge": {
            "statistic": c.bound(lower=True),
            "threshold": 0.0,
            "distance": c.bound(lower=True),
        },
    }
    if c.bound(lower=True) > 0:
        return verdict(True, evidence, **numbers)
    if c.bound(lower=False) < 0:
        return verdict(False, evidence, **numbers)
    return _undecided(evidence, c, abs(c.better_by), **numbers)


def _against_value(
    values: Sequence[float], value: float, *, below: bool, names: tuple[str, str]
) -> Verdict:
    """The mean of ``values`` (seeds) below or above a number without seed variance (a
    deterministic baseline): the one-sample confidence bounds of mean − value, as
    :func:`significantly_below` (with no spread among the seeds the mean's side decides)."""
    short = too_few_seeds(
        {names[0]: values}, abs(statistics.fmean(values) - value) if values else None
    )
    if short:
        return short
    sign = -1 if below else 1  # the good direction of mean − value
    gains = [sign * (v - value) for v in values]
    c = Comparison(
        statistics.fmean(gains),
        statistics.stdev(gains) / math.sqrt(len(gains)),
        len(gains) - 1,
        False,
        (gains,),
        f"{names[0]} {describe(values)} vs {names[1]} {value:.2f}",
    )
    side = "below" if below else "above"
    evidence = f"{c.text}: {_bounds_text(c, f'{names[0]} {side} {names[1]} by')} (one-sample)"
    return _by_the_gains_bounds(c, evidence)


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
        edge={"statistic": mean, "threshold": bound, "distance": bound - mean},
    )


def all_of(parts: Mapping[str, Verdict]) -> Verdict:
    """One verdict from several: not reproduced if any part is (a decided failure outranks a
    part the results cannot decide), else not measurable if any part is, else reproduced.

    The parts are one claim's family (rule ``multiplicity``): a part refuted by a test
    (``p_refutes`` in its numbers) stays refuted only when Holm's procedure over the family's
    refuting tests at rule ``significance`` rejects it; otherwise the results cannot decide it.
    Reproduced needs every part (an intersection-union test: each at the level, no correction)."""
    if not parts:
        raise LearnableSparsityError("all_of needs at least one part")
    refutable = {
        name: float(part.numbers["p_refutes"])  # type: ignore[arg-type]
        for name, part in parts.items()
        if "p_refutes" in part.numbers
    }
    level = rule("significance")
    refuted = holm(refutable, level)
    family = (
        f"one family of {len(refutable)} tests, Holm at {level:g}" if len(refutable) > 1 else ""
    )
    parts = {
        name: (
            not_measurable(
                f"{part.evidence}; not refuted within the claim's {family} (p = "
                f"{refutable[name]:.3f})",
                decides="more seeds (the family's refuting test at its Holm level)",
                **part.numbers,
            )
            if part.status == NOT_REPRODUCED and name in refutable and name not in refuted
            else part
        )
        for name, part in parts.items()
    }
    lines = "; ".join(f"{name}: {part.evidence}" for name, part in parts.items())
    if family:
        lines += f" [{family}]"
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
