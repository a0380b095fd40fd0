"""The claim checks of the NMT works: BLEU, speed, learned α, head diversity, roles, sparsity.

Each check is a function ``(results, **args, **thresholds) ->
:class:`~learnable_sparsity.claims.checks.Verdict``` registered in :data:`CHECKS` (collected by
:mod:`learnable_sparsity.claims.catalog`) under the name ``claims.yaml`` uses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from learnable_sparsity.analysis.alpha import (
    MIN_MODALITY_VALUES,
    alpha_movement,
    modality,
    softmax_then_sparser,
)
from learnable_sparsity.claims import checks
from learnable_sparsity.claims.checks import (
    Verdict,
    all_of,
    missing_results,
    not_measurable,
    verdict,
)
from learnable_sparsity.claims.results import Results
from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from scipy import stats

# Learned α has settled (rule ``alpha_settled``) when its heads moved by at most 0.02 on average
# over the last window of the steps — read in the logit
# (:func:`learnable_sparsity.analysis.alpha.alpha_movement`) — and when their mean α did not
# drift one way over the seeds (rule ``alpha_drift_test``, :class:`_CommonDrift`): heads that all
# drift a little (the bible record: 215 of 216 fell over the last fifth) are α still falling. The
# rules, their history and the gate's simulated false-block rate and power: claims.yaml,
# docs/claims.md.


# What decides a role the corpus has no query for (no questions for the interrogation head, no
# word split into BPE pieces for the merging head).
CORPUS_WITH_THE_ROLE = "a corpus with queries for the role (questions; words split by BPE)"

NmtPair = tuple[str, str, list[float], list[float]]


def _nmt_pairs(
    results: Results, variants: Sequence[str], baseline: str
) -> dict[str, NmtPair] | Verdict:
    """corpus/variant → (corpus, variant, variant's BLEU, baseline's BLEU), or a verdict."""
    missing = missing_results(results.missing, "bleu")
    if missing:
        return missing
    if not results.bleu:
        return not_measurable("no NMT results", decides="an NMT grid")
    pairs = {}
    for corpus, by_variant in results.bleu.items():
        for variant in variants:
            absent = [v for v in (variant, baseline) if v not in by_variant]
            if absent:
                return not_measurable(
                    f"{corpus}: no {', '.join(absent)} in the NMT grid",
                    decides=f"an NMT grid with {', '.join(absent)}",
                )
            pairs[f"{corpus}/{variant}"] = (
                corpus,
                variant,
                by_variant[variant],
                by_variant[baseline],
            )
    return pairs


def matched_nll_steps(
    results: Results, baseline: str = "softmax"
) -> dict[str, dict[str, list[float | None]]]:
    """Corpus → variant → the step at which each seed's validation NLL first reached the
    baseline's final validation NLL (its mean over seeds); None where it never did. Comparing
    variants at matched validation NLL shows how much of a gap is training length."""
    matched: dict[str, dict[str, list[float | None]]] = {}
    for corpus, curves in results.valid_nll.items():
        finals = [curve[-1][1] for curve in curves.get(baseline, []) if curve]
        if not finals:
            continue
        target = statistics.fmean(finals)
        matched[corpus] = {
            variant: [checks.steps_to_reach(curve, target) for curve in seeds]
            for variant, seeds in curves.items()
        }
    return matched


def _catching_up_each(
    results: Results,
    pairs: Sequence[tuple[str, str]],
    verdicts: Mapping[tuple[str, str], Verdict] | None = None,
) -> dict[tuple[str, str], Verdict | None]:
    """Per (variant, baseline) of ``pairs``: "not measurable" while the two still close (or
    open) the gap between their validation perplexities on some corpus by enough to flip the
    pair's verdict in ``verdicts`` (without one: by more than rule ``still_improving``). The
    pairs' gap trends on every corpus are one claim's family (:func:`checks.unsettled_each`)."""
    verdicts = verdicts or {}
    names = {
        f"{corpus}/{variant} vs {baseline}": (curves, variant, baseline)
        for corpus, curves in results.valid_nll.items()
        for variant, baseline in pairs
    }
    gates = checks.unsettled_each(
        {
            name: (curves.get(variant, []), curves.get(baseline, []))
            for name, (curves, variant, baseline) in names.items()
        },
        "validation perplexity",
        {name: verdicts.get((variant, baseline)) for name, (_, variant, baseline) in names.items()},
    )
    return {
        (variant, baseline): next(
            (
                gate
                for name, gate in gates.items()
                if gate and name.endswith(f"/{variant} vs {baseline}")
            ),
            None,
        )
        for variant, baseline in pairs
    }


def _catching_up(results: Results, variant: str, baseline: str) -> Verdict | None:
    """ "Not measurable" while ``variant`` and ``baseline`` still close (or open) the gap between
    their validation perplexities (:func:`_catching_up_each` of the one pair)."""
    return _catching_up_each(results, [(variant, baseline)])[(variant, baseline)]


def _gated(
    results: Results,
    pairs: dict[str, NmtPair],
    baseline: str,
    compare: Callable[[NmtPair], Verdict],
) -> Verdict:
    """Every corpus/variant pair's ``compare`` verdict unless the gap gate against ``baseline``
    holds it back: one claim's family (:func:`checks.unsettled_each`), each gap material by what
    would flip its pair's verdict."""
    verdicts = {name: compare(pair) for name, pair in pairs.items()}
    gates = checks.unsettled_each(
        {
            name: (
                results.valid_nll.get(corpus, {}).get(variant, []),
                results.valid_nll.get(corpus, {}).get(baseline, []),
            )
            for name, (corpus, variant, _, _) in pairs.items()
        },
        "validation perplexity",
        verdicts,
    )
    return all_of({name: gates[name] or verdicts[name] for name in pairs})


def _of_baseline(share: float, baseline: Sequence[float]) -> float:
    """``share`` of the baseline's mean BLEU, in BLEU points: a margin carried across corpora
    whose scores differ (the papers score 26–35 BLEU, the smoke corpus ~90, the bible ~16)."""
    return share * statistics.fmean(baseline)


def bleu_at_least_as_good(
    results: Results, variants: Sequence[str], baseline: str, margin: float
) -> Verdict:
    """Each variant's BLEU within seed noise of the baseline's (:func:`checks.at_least_as_good`)
    and at most ``margin`` × the baseline's mean BLEU below it, on every corpus, once the gap
    between their validation perplexities has settled."""
    pairs = _nmt_pairs(results, variants, baseline)
    if isinstance(pairs, Verdict):
        return pairs
    return _gated(
        results,
        pairs,
        baseline,
        lambda pair: checks.at_least_as_good(
            pair[2], pair[3], _of_baseline(margin, pair[3]), names=(pair[1], baseline), paired=True
        ),
    )


def bleu_a_little_below(
    results: Results, variant: str, baseline: str, largest_gap: float
) -> Verdict:
    """The variant's BLEU significantly below the baseline's, by at most ``largest_gap`` × the
    baseline's mean BLEU."""
    pairs = _nmt_pairs(results, [variant], baseline)
    if isinstance(pairs, Verdict):
        return pairs
    return _gated(
        results,
        pairs,
        baseline,
        lambda pair: checks.worse_by_at_most(
            pair[2],
            pair[3],
            _of_baseline(largest_gap, pair[3]),
            names=(variant, baseline),
            paired=True,
        ),
    )


def speed_near_softmax(
    results: Results, variant: str, train_tolerance: float, inference_tolerance: float
) -> Verdict:
    """Training and inference tokens/s of the variant within 1 ± the phase's tolerance of
    softmax's (:func:`checks.ratio_near_one` on the rounds' ratios)."""
    missing = missing_results(results.missing, "speed")
    if missing:
        return missing
    if variant not in results.speed:
        return not_measurable(
            f"{variant} was not timed", decides=f"the speed stage timing {variant}"
        )
    rounds = results.speed[variant]
    tolerances = {"train": train_tolerance, "inference": inference_tolerance}
    return all_of(
        {
            phase: checks.ratio_near_one(rounds[phase], tolerance, f"{phase} tokens/s ratio")
            for phase, tolerance in tolerances.items()
        }
    )


def trains_at_least(results: Results, variant: str, at_least: float) -> Verdict:
    """The variant's training tokens/s ratio to softmax's, round by round, at least
    ``at_least`` (:func:`checks.ratio_at_least`)."""
    missing = missing_results(results.missing, "speed")
    if missing:
        return missing
    rounds = results.speed.get(variant, {}).get("train")
    if not rounds:
        return not_measurable(
            f"{variant} not timed in training", decides=f"the speed stage timing {variant}"
        )
    return checks.ratio_at_least(rounds, at_least, f"{variant} training tokens/s ratio")


def decodes_faster(results: Results, variant: str, other: str, at_least: float) -> Verdict:
    """The variant's inference tokens/s over the other's, round by round (both ratios to the
    softmax of the same round), at least ``at_least`` (:func:`checks.ratio_at_least`)."""
    missing = missing_results(results.missing, "speed")
    if missing:
        return missing
    absent = [v for v in (variant, other) if not results.speed.get(v, {}).get("inference")]
    if absent:
        return not_measurable(
            f"{', '.join(absent)} not timed at inference",
            decides=f"the speed stage timing {', '.join(absent)}",
        )
    ratios = [
        mine / theirs
        for mine, theirs in zip(
            results.speed[variant]["inference"], results.speed[other]["inference"], strict=True
        )
    ]
    return checks.ratio_at_least(ratios, at_least, f"{variant}/{other} inference tokens/s")


def slowest(results: Results, variant: str) -> Verdict:
    """The variant has the lowest tokens/s ratio to softmax in training and in inference, by
    more than the rounds' spread (:func:`checks.lowest`: a tie within it is not measurable)."""
    missing = missing_results(results.missing, "speed")
    if missing:
        return missing
    return all_of(
        {
            phase: checks.lowest(
                {v: r[phase] for v, r in results.speed.items()}, variant, f"{phase} speed"
            )
            for phase in ("train", "inference")
        }
    )


def alpha_modes(
    results: Results,
    bimodal: Sequence[str],
    unimodal: Sequence[str],
    upper_mode_at_least: float,
    lower_mode_at_most: float,
) -> Verdict:
    """The learned α pooled over layers and seeds, per attention type (:func:`modality`): in the
    ``bimodal`` types Hartigan's dip test rejects one mode (p < rule ``significance``) and the
    two modes lie where the claim puts them (the upper at least ``upper_mode_at_least``, the
    lower at most ``lower_mode_at_most``); in the ``unimodal`` types it does not reject one
    mode. Judged once α has settled and the α-entmax models no longer catch up with softmax."""
    blocked = (
        missing_results(results.missing, "alphas")
        or _alpha_still_moving(results)
        or _catching_up(results, "entmax_alpha", "softmax")
    )
    if blocked:
        return blocked
    parts = {}
    for kind, expect in [(k, True) for k in bimodal] + [(k, False) for k in unimodal]:
        alphas = results.final_alphas.get(kind, [])
        if len(alphas) < MIN_MODALITY_VALUES or max(alphas) == min(alphas):
            parts[kind] = not_measurable(
                f"{len(alphas)} learned α in {kind}",
                decides=(
                    f"at least {MIN_MODALITY_VALUES} learned α in {kind}, not all equal (more "
                    "layers, heads or seeds)"
                ),
            )
            continue
        found = modality(alphas)
        level = checks.rule("significance")
        multimodal = found.p_unimodal < level
        low, high = found.modes
        text = (
            f"dip test over {found.n} heads: dip {found.dip:.3f}, p = {found.p_unimodal:.3f} "
            f"for one mode ({'rejected' if multimodal else 'not rejected'} at {level:g}); "
            f"two-component modes {low:.2f} and {high:.2f}"
        )
        numbers = {"dip": found.dip, "p_unimodal": found.p_unimodal, "modes": [low, high]}
        if expect:
            placed = high >= upper_mode_at_least and low <= lower_mode_at_most
            where = (
                f"; expected two modes, the upper at least {upper_mode_at_least:g} and the "
                f"lower at most {lower_mode_at_most:g}"
            )
            parts[kind] = verdict(multimodal and placed, text + where, **numbers)
        else:
            parts[kind] = verdict(not multimodal, text + "; expected one mode", **numbers)
    return all_of(parts)


def _in_window(
    trajectory: Sequence[tuple[float, Sequence[float]]],
) -> Sequence[tuple[float, Sequence[float]]]:
    """The logged (step, heads' α) from the one nearest rule ``convergence_window`` of the steps
    before the last on."""
    start = trajectory[-1][0] * (1 - checks.rule("convergence_window"))
    first = min(range(len(trajectory)), key=lambda i: abs(trajectory[i][0] - start))
    return trajectory[first:]


def _window_start(trajectory: Sequence[tuple[float, Sequence[float]]]) -> Sequence[float]:
    """The heads' α logged nearest rule ``convergence_window`` of the steps before the last."""
    return _in_window(trajectory)[0][1]


@dataclass(frozen=True)
class _CommonDrift:
    """The common move of α over the last rule ``convergence_window`` of the steps (rule
    ``alpha_drift_test``): each seed's mean α over its heads at every step it logged in the
    window, fitted by its own line; ``moves`` the lines' moves across the window (in α), the
    seeds the replicates of a two-sided one-sample t-test of their mean ``change`` (``p``,
    df = seeds − 1; None below two seeds with a line: no spread to test against). A wobble
    every head of a seed shares at a checkpoint, zero-mean in time, is noise about its seed's
    line, and a seed's own drift is one value, not as many as it has heads. It holds α back
    (``blocks``) when ``p`` is below rule ``alpha_drift_level`` — untested (one seed), by any
    such move — and the mean move exceeds rule ``alpha_drift_material`` in α."""

    moves: tuple[float, ...]
    change: float
    p: float | None
    blocks: bool

    @classmethod
    def of(cls, trajectories: Sequence[Sequence[tuple[float, Sequence[float]]]]) -> _CommonDrift:
        last_step = max(trajectory[-1][0] for trajectory in trajectories)
        width = checks.rule("convergence_window") * last_step
        series = [
            [(step, statistics.fmean(alphas)) for step, alphas in _in_window(trajectory)]
            for trajectory in trajectories
        ]
        trend = checks.replicate_trend(series, width, last_step)
        if trend is None:
            moves = tuple(m for s in series if (m := checks.line_move(s, width)) is not None)
            change, p = (statistics.fmean(moves) if moves else 0.0), None
        else:
            moves, change, p = trend.moves, trend.change, trend.p
        significant = p is None or p < checks.rule("alpha_drift_level")
        return cls(
            moves, change, p, significant and abs(change) > checks.rule("alpha_drift_material")
        )

    def describe(self) -> str:
        """The drift in words, for a verdict's evidence."""
        way = "rose" if self.change > 0 else "fell"
        moves = " / ".join(f"{move:+.4f}" for move in self.moves)
        tested = (
            f"p = {self.p:.2g} over {len(self.moves)} seeds (t, df {len(self.moves) - 1}) < "
            f"{checks.rule('alpha_drift_level'):g}"
            if self.p is not None
            else "one seed with a line: no spread to test against"
        )
        return (
            f"the mean α of a seed's heads {way} by {abs(self.change):.4f} (its line's move per "
            f"seed {moves}; {tested}; beyond {checks.rule('alpha_drift_material'):g} in α)"
        )

    def numbers(self) -> dict[str, object]:
        """The drift's numbers, for a verdict's."""
        return {
            "moves": list(self.moves),
            "change": self.change,
            "p": self.p,
            "blocks": self.blocks,
        }


def _alpha_still_moving(results: Results) -> Verdict | None:
    """ "Not measurable" while the learned α still moves: in some seed, between the α logged
    last and the α logged rule ``convergence_window`` of the steps earlier, its heads moved by
    more than rule ``alpha_settled`` on average (:func:`alpha_movement`), or the heads' mean α
    still drifts one way over the seeds (:class:`_CommonDrift`, rule ``alpha_drift_test``: each
    seed's line through its mean α at every logged step of the window, the seeds' moves tested
    at rule ``alpha_drift_level`` and beyond rule ``alpha_drift_material`` — a drift too small
    to matter, every head falling 0.001, 20× below settled, is no reason to wait)."""
    drifts, last_steps = [], []
    trajectories = [t for t in results.alpha_trajectories if len(t) >= 2]
    window, settled = checks.rule("convergence_window"), checks.rule("alpha_settled")
    for trajectory in trajectories:
        last_step, last = trajectory[-1]
        last_steps.append(last_step)
        earlier = _window_start(trajectory)
        moves = [alpha_movement(a, b, settled) for a, b in zip(earlier, last, strict=True)]
        drifts.append(statistics.fmean(moves))
    common = _CommonDrift.of(trajectories) if trajectories else None
    drifting = common is not None and common.blocks
    moving = [d for d in drifts if d > settled]
    if not moving and not drifting:
        return None
    reasons = []
    # If α's move over the last fifth falls as 1/step (as a closing gap's), it is within
    # alpha_settled after T · (move ÷ alpha_settled) steps, its common move within
    # alpha_drift_material after T · (move ÷ alpha_drift_material).
    material = checks.rule("alpha_drift_material")
    settles_after = max(last_steps) * max(
        max(moving, default=0.0) / settled, abs(common.change) / material if drifting else 0.0
    )
    decides = (
        f"a longer run: if α's move falls as 1/step, it settles after about "
        f"{settles_after:,.0f} steps"
        + (", and its heads no longer drift one way together" if drifting else "")
    )
    if moving:
        reasons.append(
            f"α still moves by {max(moving):.3f} on average per head (read in its logit; settled: "
            f"at most {settled:g})"
        )
    if drifting:
        reasons.append(f"its heads still drift together ({common.describe()})")
    return not_measurable(
        f"not measurable in this profile: over the last {window:.0%} of the "
        f"steps {' and '.join(reasons)}",
        decides=decides,
        alpha_drift=drifts,
        alpha_common_drift=common.numbers() if common else {},
    )


def _too_short(results: Results, variant: str, judged_after_target_tokens: float) -> Verdict | None:
    """ "Not measurable" while a run of ``variant`` trained fewer target tokens than the
    pre-registered length after which the claim is judged — found or not: a verdict that waits
    only when it goes one way is biased. Says the steps a run of this batch would need."""
    missing = missing_results(results.missing, "target_tokens")
    if missing:
        return missing
    runs = [
        (tokens, curve[-1][0])
        for corpus, by_variant in results.target_tokens.items()
        for tokens, curve in zip(
            by_variant.get(variant, []),
            results.valid_nll.get(corpus, {}).get(variant, []),
            strict=True,
        )
    ]
    if not runs:
        return not_measurable(
            f"no {variant} run with its target tokens", decides=f"an NMT grid with {variant}"
        )
    short = [(tokens, steps) for tokens, steps in runs if tokens < judged_after_target_tokens]
    if not short:
        return None
    tokens, steps = min(short)
    needed = steps * judged_after_target_tokens / tokens
    return not_measurable(
        f"not measurable in this profile: a run of {variant} trained {tokens / 1e6:.2g}M target "
        f"tokens ({steps:g} steps); the claim is judged, either way, after "
        f"{judged_after_target_tokens / 1e6:.2g}M",
        decides=f"a run of about {needed:,.0f} steps of this run's batches",
        target_tokens=[tokens for tokens, _ in runs],
        steps_needed=needed,
    )


def heads_dense_then_sparse(
    results: Results, min_dip: float, min_rebound: float, judged_after_target_tokens: float
) -> Verdict:
    """Some head's α first falls toward softmax by at least ``min_dip`` and then rises by at
    least ``min_rebound`` (:func:`softmax_then_sparser`), in any seed, once every α-entmax model
    trained ``judged_after_target_tokens`` and its α has settled (:func:`_alpha_still_moving`:
    a head still rising might pass later, one still falling might undo a rebound)."""
    missing = missing_results(results.missing, "alphas")
    if missing:
        return missing
    trajectories = [t for t in results.alpha_trajectories if t]
    if not trajectories:
        return not_measurable(
            "no α-entmax model with an α trajectory", decides="an NMT grid with entmax_alpha"
        )
    blocked = _too_short(results, "entmax_alpha", judged_after_target_tokens) or (
        _alpha_still_moving(results)
    )
    if blocked:
        return blocked
    seeds = len(trajectories)
    heads = [_HeadTurn.of(trajectory, min_dip, min_rebound, seeds) for trajectory in trajectories]
    counts = [sum(head.counted for head in seed) for seed in heads]
    turning = _heads_could_turn(heads, sum(counts) > 0)
    if turning:
        return turning
    moving = sum(h.counted and abs(h.tested) > h.beyond for seed in heads for h in seed)
    return verdict(
        sum(counts) > 0,
        f"heads whose α fell by ≥ {min_dip:g} and then rose by ≥ {min_rebound:g}, per seed: "
        f"{counts}"
        + (
            f"; {moving} of them still move beyond the per-head bound over the last "
            f"{checks.rule('convergence_window'):.0%} of the steps, toward no edge that would "
            "undo the count"
            if moving
            else ""
        ),
        per_seed=counts,
        counted_heads_still_moving=moving,
    )


# The median absolute deviation of normal noise is 0.6745 of its sd: 1/0.6745 turns one into
# the other (a robust estimate of the heads' noise that a few moving heads do not inflate).
MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class _HeadTurn:
    """One head's α trajectory as ``heads_dense_then_sparse`` reads it: whether it dipped by
    ``min_dip`` and whether it is ``counted`` (:func:`softmax_then_sparser`), its ``move`` over
    the last rule ``convergence_window`` of the steps, the ``room`` its final α has before its
    count would change (above the rebound's edge when counted, below it when not) and the move
    ``beyond`` which its move read in its logit, ``tested``, says it still moves (its seed's
    per-head test)."""

    dipped: bool
    counted: bool
    move: float
    room: float
    beyond: float
    tested: float

    @classmethod
    def of(
        cls,
        trajectory: Sequence[tuple[float, Sequence[float]]],
        min_dip: float,
        min_rebound: float,
        seeds: int,
    ) -> list[_HeadTurn]:
        """The seed's heads. A head still moves (rule ``alpha_head_test``) when its move read
        in its logit (:func:`alpha_movement`, signed: the noise of a head near a bound of α is
        then the same as that of one in the middle) is beyond rule ``alpha_settled`` and beyond
        its seed's heads' noise — the median absolute deviation of their moves ×
        :data:`MAD_TO_SD` — times the normal quantile of rule ``alpha_drift_level``
        two-sided, Bonferroni over every head of every seed."""
        earlier = _window_start(trajectory)
        heads = list(zip(*(alphas for _, alphas in trajectory), strict=True))
        tested = [
            math.copysign(alpha_movement(before, head[-1], 0.0), head[-1] - before)
            for head, before in zip(heads, earlier, strict=True)
        ]
        centre = statistics.median(tested)
        noise = MAD_TO_SD * statistics.median(abs(m - centre) for m in tested)
        level = checks.rule("alpha_drift_level") / (2 * len(heads) * seeds)
        beyond = max(checks.rule("alpha_settled"), noise * float(stats.norm.isf(level)))
        turns = []
        for head, before, read in zip(heads, earlier, tested, strict=True):
            lowest, final = min(head), head[-1]
            counted = softmax_then_sparser(list(head), min_dip=min_dip, min_rebound=min_rebound)
            room = abs(final - (lowest + min_rebound))
            dipped = lowest <= head[0] - min_dip
            turns.append(cls(dipped, counted, final - before, room, beyond, read))
        return turns

    def could_turn(self) -> bool:
        """Whether the head's count could change before its α settles (rule
        ``alpha_head_test``): it dipped, still moves (``tested`` beyond ``beyond``) toward the
        edge of its count, and its move still to come if the move falls as 1/step — ``move`` ×
        (1 − w)/w over the last w of the steps, as for the gap — reaches the edge."""
        window = checks.rule("convergence_window")
        sign = -1 if self.counted else 1
        ahead = sign * self.move * (1 - window) / window
        return self.dipped and sign * self.tested > self.beyond and ahead >= self.room


def _heads_could_turn(heads: Sequence[Sequence[_HeadTurn]], found: bool) -> Verdict | None:
    """ "Not measurable" while the heads a verdict of :func:`heads_dense_then_sparse` counts
    could still change it (rule ``alpha_head_test``): when heads were ``found``, every counted
    head could still fall out of its count; when none was, some head that dipped could still
    rebound into it (:meth:`_HeadTurn.could_turn`). A mean move over all heads cannot see one
    such head among hundreds."""
    candidates = [h for seed in heads for h in seed if h.counted == found and h.dipped]
    turning = [h for h in candidates if h.could_turn()]
    if not turning or (found and len(turning) < len(candidates)):
        return None
    fastest = max(turning, key=lambda h: abs(h.move))
    way = "fall out of" if found else "rebound into"
    window = checks.rule("convergence_window")
    return not_measurable(
        f"not measurable in this profile: {len(turning)} head(s) could still {way} the count "
        f"(fastest: α moved {fastest.move:+.3f} over the last {window:.0%} of the steps, "
        f"{abs(fastest.tested):.3f} read in its logit, beyond its seed's per-head bound "
        f"{fastest.beyond:.3f}; {fastest.room:.3f} from the "
        f"rebound's edge; if its move falls as 1/step it moves "
        f"{abs(fastest.move) * (1 - window) / window:.3f} more)",
        decides="a longer run, until the heads that could change the count settle",
        heads_could_turn=len(turning),
    )


def _mean_over_blocks(per_seed: list[dict[str, float | None]]) -> list[float]:
    """Per seed, the mean over blocks of the blocks' mean JS (blocks without a value left out)."""
    means = [[value for value in blocks.values() if value is not None] for blocks in per_seed]
    return [statistics.fmean(values) for values in means if values]


def sparse_heads_more_diverse(results: Results, variants: Sequence[str], baseline: str) -> Verdict:
    """Mean Jensen–Shannon divergence between the heads of a block, averaged over blocks, per
    seed: each sparse variant's significantly above the baseline's (one-sided, paired by seed),
    once neither still catches up with the other in validation perplexity."""
    blocked = missing_results(results.missing, "heads")
    if blocked:
        return blocked
    parts = {
        variant: (
            checks.significantly_below(
                _mean_over_blocks(results.js[baseline]),
                _mean_over_blocks(results.js[variant]),
                names=(baseline, variant),
                paired=True,
            )
            if variant in results.js and baseline in results.js
            else not_measurable(
                f"no head analysis of {variant} and {baseline}",
                decides=f"a head analysis of {variant} and {baseline}",
            )
        )
        for variant in variants
    }
    gates = _catching_up_each(
        results,
        [(variant, baseline) for variant in variants],
        {(variant, baseline): parts[variant] for variant in variants},
    )
    analysed = baseline in results.js
    return all_of(
        {
            v: (gates[(v, baseline)] or parts[v]) if analysed and v in results.js else parts[v]
            for v in variants
        }
    )


def _trained_steps(results: Results, variants: Sequence[str]) -> dict[str, set[float]]:
    """Variant → the last validation step of its runs (the length each trained)."""
    return {
        variant: {curve[-1][0] for c in results.valid_nll.values() for curve in c.get(variant, [])}
        for variant in variants
    }


def head_roles_exist(
    results: Results, variant: str, roles: Sequence[str], baselines: Sequence[str]
) -> Verdict:
    """Each role has a head in some seed of the variant, judged against the ``baselines``
    (the other attention variants) the grid trained as long: a role the variant has is
    reproduced; one it lacks while a baseline has it is not (the corpus and the length can grow
    the role); one no model has is not measurable (the corpus or the length cannot show it), as
    is a role the corpus has no query for. Baselines the grid did not train are left out (a
    profile of softmax, 1.5-entmax and α-entmax is judged against the first two); with none
    trained there is nothing to judge against."""
    blocked = missing_results(results.missing, "heads")
    if blocked:
        return blocked
    if variant not in results.roles:
        return not_measurable(
            f"no head analysis of {variant}", decides=f"a head analysis of {variant}"
        )
    baselines = [b for b in baselines if b in results.roles]
    if not baselines:
        return not_measurable(
            f"no head analysis of another attention variant than {variant}",
            decides=f"a head analysis of another variant trained as long as {variant}",
        )
    lengths = _trained_steps(results, [variant, *baselines])
    if len(set().union(*lengths.values())) > 1:
        return not_measurable(
            f"the models trained for different lengths: {lengths}",
            decides="a grid whose variants train for one length",
        )
    parts = {}
    for role in roles:
        counts = {v: results.roles[v].get(role, []) for v in (variant, *baselines)}
        if any(not c or any(n is None for n in c) for c in counts.values()):
            parts[role] = not_measurable(
                "the corpus cannot show this role", decides=CORPUS_WITH_THE_ROLE
            )
            continue
        listing = ", ".join(f"{v} {c}" for v, c in counts.items())
        holders = [v for v, c in counts.items() if sum(c) > 0]
        if not holders:
            parts[role] = not_measurable(
                f"no model has such a head at these steps (heads per seed: {listing}): the "
                "corpus or the training length cannot show the role",
                decides="a longer run, or a corpus on which some model forms the role",
            )
            continue
        parts[role] = verdict(
            variant in holders,
            f"heads per seed: {listing}",
            counts=counts,
        )
    return all_of(parts)


def roles_more_confident(
    results: Results, variant: str, baseline: str, roles: Sequence[str]
) -> Verdict:
    """Per role, the confidence of the variant's strongest head for it (per seed) significantly
    above the baseline's (one-sided, paired by seed), once neither catches up with the other.

    A role that no head of either model holds (at the role's threshold, in any seed) has no
    confidence to compare: the strongest heads are then heads without the role."""
    blocked = missing_results(results.missing, "heads") or missing_results(
        results.missing, "role_confidence"
    )
    if blocked:
        return blocked
    absent = [v for v in (variant, baseline) if v not in results.role_confidence]
    if absent:
        return not_measurable(
            f"no role confidences of {', '.join(absent)}",
            decides=f"a head analysis of {', '.join(absent)}",
        )
    gate = _catching_up(results, variant, baseline)
    if gate:
        return gate
    parts = {}
    for role in roles:
        mine, theirs = (results.role_confidence[v].get(role, []) for v in (variant, baseline))
        if not mine or not theirs or None in mine or None in theirs:
            parts[role] = not_measurable(
                "the corpus cannot show this role", decides=CORPUS_WITH_THE_ROLE
            )
            continue
        held = {v: results.roles.get(v, {}).get(role) or [] for v in (variant, baseline)}
        if not any(count for counts in held.values() for count in counts):
            parts[role] = not_measurable(
                f"no head of {variant} or {baseline} holds it at its threshold (heads per seed: "
                + ", ".join(f"{v} {counts}" for v, counts in held.items())
                + "): no role confidence to compare",
                decides="a longer run, or a corpus on which either model forms the role",
            )
            continue
        parts[role] = checks.significantly_below(
            theirs, mine, names=(baseline, variant), paired=True
        )
    return all_of(parts)


def adaptive_sparsity(
    results: Results,
    variant: str,
    fixed_alpha: str,
    fixed_support: str,
    share_of_fixed_alpha: float,
) -> Verdict:
    """The variant's attention is sparse and adapts per head and per input, per seed:

    * sparse: the share of the keys it leaves at 0 (1 − its mean density over heads), averaged
      over seeds, at least ``share_of_fixed_alpha`` of ``fixed_alpha``'s (1.5-entmax, the
      sparse mapping of fixed α): a near-softmax model (density 0.99) is not "actually sparse";
    * per head: the spread (population sd) of its heads' densities significantly above
      ``fixed_alpha``'s, whose α is the same in every head;
    * per input: its heads' mean density spread between inputs of one length at least
      ``share_of_fixed_alpha`` of ``fixed_alpha``'s (a spread of 0.001 adapts to nothing), and
      significantly above ``fixed_support``'s, whose support is fixed by k at each length.
      Where the grid did not train ``fixed_support``, its closed form: top-k keeps min(k, n) of
      the n keys of every query, so its density is a function of the length and spreads by 0
      within one.

    Each comparison with a trained model waits until neither catches up with the other, and
    needs rule ``min_seeds`` seeds of each."""
    blocked = missing_results(results.missing, "heads") or missing_results(
        results.missing, "density"
    )
    if blocked:
        return blocked
    absent = [v for v in (variant, fixed_alpha) if v not in results.density]
    if absent:
        return not_measurable(
            f"no attention densities of {', '.join(absent)}",
            decides=f"a head analysis of {', '.join(absent)}",
        )

    def per_seed(name: str, statistic: Callable[[list[float]], float], key: str) -> list[float]:
        return [
            statistic([v for v in seed[key] if v is not None]) for seed in results.density[name]
        ]

    def zeroed(name: str) -> list[float]:
        return [1 - density for density in per_seed(name, statistics.fmean, "heads")]

    mean, spread = statistics.fmean, statistics.pstdev
    within, within_fixed = (
        per_seed(name, mean, "within_length_sd") for name in (variant, fixed_alpha)
    )
    trained = [fixed_alpha, *([fixed_support] if fixed_support in results.density else [])]
    gates = _catching_up_each(results, [(variant, other) for other in trained])
    gate = gates[(variant, fixed_alpha)]
    if fixed_support in results.density:
        against_fixed_support = gates[(variant, fixed_support)] or (
            checks.significantly_below(
                per_seed(fixed_support, mean, "within_length_sd"),
                within,
                names=(f"{fixed_support} within-length sd", f"{variant} within-length sd"),
                paired=True,
            )
        )
    else:
        against_fixed_support = checks.significantly_above_value(
            within,
            0.0,
            names=(f"{variant} within-length sd", f"{fixed_support} (closed form, untrained)"),
        )
    parts = {
        "sparse": gate
        or _share_at_least(zeroed(variant), zeroed(fixed_alpha), share_of_fixed_alpha, "keys at 0"),
        "per head": gate
        or checks.significantly_below(
            per_seed(fixed_alpha, spread, "heads"),
            per_seed(variant, spread, "heads"),
            names=(f"{fixed_alpha} head-density sd", f"{variant} head-density sd"),
            paired=True,
        ),
        f"per input, against {fixed_alpha}": gate
        or _share_at_least(within, within_fixed, share_of_fixed_alpha, "within-length density sd"),
        f"per input, against {fixed_support}": against_fixed_support,
    }
    return all_of(parts)


def _share_at_least(
    values: Sequence[float], reference: Sequence[float], share: float, what: str
) -> Verdict:
    """The mean of ``values`` (seeds) at least ``share`` × the mean of ``reference``'s, each
    over rule ``min_seeds`` seeds at least."""
    short = checks.too_few_seeds({what: values, f"reference {what}": reference})
    if short:
        return short
    mine, theirs = statistics.fmean(values), statistics.fmean(reference)
    return verdict(
        mine >= share * theirs,
        f"{what} {checks.describe(values, 3)} vs {share:g} × {checks.describe(reference, 3)} "
        f"= {share * theirs:.3f}",
        mean=mine,
        reference=theirs,
        share=share,
        edge={"statistic": mine, "threshold": share * theirs, "distance": mine - share * theirs},
    )


# The checks of the NMT works, in the order of claims.yaml's families.
CHECKS = (
    bleu_at_least_as_good,
    bleu_a_little_below,
    speed_near_softmax,
    trains_at_least,
    decodes_faster,
    slowest,
    alpha_modes,
    heads_dense_then_sparse,
    sparse_heads_more_diverse,
    head_roles_exist,
    roles_more_confident,
    adaptive_sparsity,
)
