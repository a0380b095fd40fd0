"""The claim checks on a run's :class:`~components.claims.results.Results`, and the claims of
``claims.yaml`` they evaluate.

A check is a function ``(results, **args, **thresholds) -> Verdict`` registered in
:data:`CHECKS` under the name ``claims.yaml`` uses. Where a result is missing (a stage not run, a
variant not in the grid, a record kept before the result existed) the verdict is "not
measurable", naming what is missing. Every gate that holds a verdict back (training still
deciding a comparison, too short a run) holds it back whichever way the result points: a claim
is never reproduced on a run that would not have been allowed to refute it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from components.analysis.alpha import (
    MIN_MODALITY_VALUES,
    alpha_movement,
    modality,
    softmax_then_sparser,
)
from components.claims import checks
from components.claims.checks import (
    SIGNIFICANCE,
    Verdict,
    all_of,
    not_measurable,
    verdict,
)
from components.claims.preregistered import Claim, OutOfScope, parse_claims
from components.claims.results import Results
from components.reporting.lvm_tables import COLLAPSED_KL_NATS, UNSETTLED_NLL_BITS

# Learned α has settled when its heads moved by at most 0.02 on average over the last window of
# the steps — read in the logit (:func:`components.analysis.alpha.alpha_movement`) —: 2% of the
# range (1, 2] it lives in, well below the gap between the modes it reads.
ALPHA_SETTLED = 0.02


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: Verdict


def _missing(results: Results, *names: str) -> Verdict | None:
    absent = [f"{name} ({results.missing[name]})" for name in names if name in results.missing]
    return not_measurable(f"no results: {'; '.join(absent)}") if absent else None


# ------------------------------------------------------------------------------ NMT


NmtPair = tuple[str, str, list[float], list[float]]


def _nmt_pairs(
    results: Results, variants: Sequence[str], baseline: str
) -> dict[str, NmtPair] | Verdict:
    """corpus/variant → (corpus, variant, variant's BLEU, baseline's BLEU), or a verdict."""
    missing = _missing(results, "bleu")
    if missing:
        return missing
    if not results.bleu:
        return not_measurable("no NMT results")
    pairs = {}
    for corpus, by_variant in results.bleu.items():
        for variant in variants:
            absent = [v for v in (variant, baseline) if v not in by_variant]
            if absent:
                return not_measurable(f"{corpus}: no {', '.join(absent)} in the NMT grid")
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


def _catching_up(
    results: Results, variant: str, baseline: str, corpora: Sequence[str] | None = None
) -> Verdict | None:
    """ "Not measurable" while ``variant`` and ``baseline`` still close (or open) the gap between
    their validation perplexities, on ``corpora`` (None: every corpus)."""
    return checks.unsettled(
        {
            f"{corpus}/{variant}": (curves.get(variant, []), curves.get(baseline, []))
            for corpus, curves in results.valid_nll.items()
            if corpora is None or corpus in corpora
        },
        "validation perplexity",
        log_loss=True,
    )


def bleu_at_least_as_good(
    results: Results, variants: Sequence[str], baseline: str, margin: float
) -> Verdict:
    """Each variant's BLEU within seed noise of the baseline's (:func:`checks.at_least_as_good`),
    on every corpus, once every run has converged."""
    pairs = _nmt_pairs(results, variants, baseline)
    if isinstance(pairs, Verdict):
        return pairs
    parts = {}
    for name, (corpus, variant, bleu, base) in pairs.items():
        parts[name] = _catching_up(results, variant, baseline, [corpus]) or (
            checks.at_least_as_good(bleu, base, margin, names=(variant, baseline))
        )
    return all_of(parts)


def bleu_a_little_below(
    results: Results, variant: str, baseline: str, largest_gap: float
) -> Verdict:
    """The variant's BLEU significantly below the baseline's, by at most ``largest_gap``."""
    pairs = _nmt_pairs(results, [variant], baseline)
    if isinstance(pairs, Verdict):
        return pairs
    parts = {}
    for name, (corpus, _, bleu, base) in pairs.items():
        parts[name] = _catching_up(results, variant, baseline, [corpus]) or (
            checks.worse_by_at_most(bleu, base, largest_gap, names=(variant, baseline))
        )
    return all_of(parts)


def speed_near_softmax(
    results: Results, variant: str, train_tolerance: float, inference_tolerance: float
) -> Verdict:
    """Training and inference tokens/s of the variant within 1 ± the phase's tolerance of
    softmax's (:func:`checks.ratio_near_one` on the rounds' ratios)."""
    missing = _missing(results, "speed")
    if missing:
        return missing
    if variant not in results.speed:
        return not_measurable(f"{variant} was not timed")
    rounds = results.speed[variant]
    tolerances = {"train": train_tolerance, "inference": inference_tolerance}
    return all_of(
        {
            phase: checks.ratio_near_one(rounds[phase], tolerance, f"{phase} tokens/s ratio")
            for phase, tolerance in tolerances.items()
        }
    )


def decodes_faster(results: Results, variant: str, other: str, at_least: float) -> Verdict:
    """The variant's inference tokens/s over the other's, round by round (both ratios to the
    softmax of the same round), at least ``at_least`` (:func:`checks.ratio_at_least`)."""
    missing = _missing(results, "speed")
    if missing:
        return missing
    absent = [v for v in (variant, other) if not results.speed.get(v, {}).get("inference")]
    if absent:
        return not_measurable(f"{', '.join(absent)} not timed at inference")
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
    missing = _missing(results, "speed")
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
    ``bimodal`` types Hartigan's dip test rejects one mode (p < :data:`SIGNIFICANCE`) and the
    two modes lie where the claim puts them (the upper at least ``upper_mode_at_least``, the
    lower at most ``lower_mode_at_most``); in the ``unimodal`` types it does not reject one
    mode. Judged once α has settled and the α-entmax models no longer catch up with softmax."""
    blocked = (
        _missing(results, "alphas")
        or _alpha_still_moving(results)
        or _catching_up(results, "entmax_alpha", "softmax")
    )
    if blocked:
        return blocked
    parts = {}
    for kind, expect in [(k, True) for k in bimodal] + [(k, False) for k in unimodal]:
        alphas = results.final_alphas.get(kind, [])
        if len(alphas) < MIN_MODALITY_VALUES or max(alphas) == min(alphas):
            parts[kind] = not_measurable(f"{len(alphas)} learned α in {kind}")
            continue
        found = modality(alphas)
        multimodal = found.p_unimodal < SIGNIFICANCE
        low, high = found.modes
        text = (
            f"dip test over {found.n} heads: dip {found.dip:.3f}, p = {found.p_unimodal:.3f} "
            f"for one mode ({'rejected' if multimodal else 'not rejected'} at {SIGNIFICANCE}); "
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


def _alpha_still_moving(results: Results) -> Verdict | None:
    """ "Not measurable" while the learned α still moves: the mean over heads of
    :func:`alpha_movement` between the α logged last and the α logged
    :data:`checks.CONVERGENCE_WINDOW` of the steps earlier is above :data:`ALPHA_SETTLED` in
    some seed."""
    drifts = []
    for trajectory in results.alpha_trajectories:
        if len(trajectory) < 2:
            continue
        last_step, last = trajectory[-1]
        start = last_step * (1 - checks.CONVERGENCE_WINDOW)
        earlier = min(trajectory, key=lambda entry: abs(entry[0] - start))[1]
        moves = [alpha_movement(a, b, ALPHA_SETTLED) for a, b in zip(earlier, last, strict=True)]
        drifts.append(statistics.fmean(moves))
    moving = [d for d in drifts if d > ALPHA_SETTLED]
    if not moving:
        return None
    return not_measurable(
        f"not measurable in this profile: α still moves by {max(moving):.3f} on average per "
        f"head over the last {checks.CONVERGENCE_WINDOW:.0%} of the steps (read in its logit; "
        f"settled: at most {ALPHA_SETTLED}); a longer profile decides it",
        alpha_drift=drifts,
    )


def _too_short(steps: Sequence[float], judged_after_steps: float, what: str) -> Verdict | None:
    """ "Not measurable" while a run is shorter than the pre-registered length after which the
    claim is judged — found or not: a verdict that waits only when it goes one way is biased."""
    short = [s for s in steps if s < judged_after_steps]
    if not short:
        return None
    return not_measurable(
        f"not measurable in this profile: {what} trained {min(short):g} steps; the claim is "
        f"judged, either way, after {judged_after_steps:g}",
        steps=list(steps),
    )


def heads_dense_then_sparse(
    results: Results, min_dip: float, min_rebound: float, judged_after_steps: float
) -> Verdict:
    """Some head's α first falls toward softmax by at least ``min_dip`` and then rises by at
    least ``min_rebound`` (:func:`softmax_then_sparser`), in any seed, once every α-entmax model
    trained ``judged_after_steps``."""
    missing = _missing(results, "alphas")
    if missing:
        return missing
    trajectories = [t for t in results.alpha_trajectories if t]
    if not trajectories:
        return not_measurable("no α-entmax model with an α trajectory")
    blocked = _too_short([t[-1][0] for t in trajectories], judged_after_steps, "the α-entmax")
    if blocked:
        return blocked
    counts = [
        sum(
            softmax_then_sparser(list(head), min_dip=min_dip, min_rebound=min_rebound)
            for head in zip(*(alphas for _, alphas in trajectory), strict=True)
        )
        for trajectory in trajectories
    ]
    return verdict(
        sum(counts) > 0,
        f"heads whose α fell by ≥ {min_dip:g} and then rose by ≥ {min_rebound:g}, per seed: "
        f"{counts}",
        per_seed=counts,
    )


def _mean_over_blocks(per_seed: list[dict[str, float | None]]) -> list[float]:
    """Per seed, the mean over blocks of the blocks' mean JS (blocks without a value left out)."""
    means = [[value for value in blocks.values() if value is not None] for blocks in per_seed]
    return [statistics.fmean(values) for values in means if values]


def sparse_heads_more_diverse(results: Results, variants: Sequence[str], baseline: str) -> Verdict:
    """Mean Jensen–Shannon divergence between the heads of a block, averaged over blocks, per
    seed: each sparse variant's significantly above the baseline's (one-sided Welch), once
    neither still catches up with the other in validation perplexity."""
    blocked = _missing(results, "heads")
    if blocked:
        return blocked
    parts = {}
    for variant in variants:
        if variant not in results.js or baseline not in results.js:
            parts[variant] = not_measurable(f"no head analysis of {variant} and {baseline}")
            continue
        parts[variant] = _catching_up(results, variant, baseline) or checks.significantly_below(
            _mean_over_blocks(results.js[baseline]),
            _mean_over_blocks(results.js[variant]),
            names=(baseline, variant),
        )
    return all_of(parts)


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
    blocked = _missing(results, "heads")
    if blocked:
        return blocked
    if variant not in results.roles:
        return not_measurable(f"no head analysis of {variant}")
    baselines = [b for b in baselines if b in results.roles]
    if not baselines:
        return not_measurable(f"no head analysis of another attention variant than {variant}")
    lengths = _trained_steps(results, [variant, *baselines])
    if len(set().union(*lengths.values())) > 1:
        return not_measurable(f"the models trained for different lengths: {lengths}")
    parts = {}
    for role in roles:
        counts = {v: results.roles[v].get(role, []) for v in (variant, *baselines)}
        if any(not c or any(n is None for n in c) for c in counts.values()):
            parts[role] = not_measurable("the corpus cannot show this role")
            continue
        listing = ", ".join(f"{v} {c}" for v, c in counts.items())
        holders = [v for v, c in counts.items() if sum(c) > 0]
        if not holders:
            parts[role] = not_measurable(
                f"no model has such a head at these steps (heads per seed: {listing}): the "
                "corpus or the training length cannot show the role"
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
    above the baseline's (one-sided Welch), once neither catches up with the other.

    A role that no head of either model holds (at the role's threshold, in any seed) has no
    confidence to compare: the strongest heads are then heads without the role."""
    blocked = _missing(results, "heads") or _missing(results, "role_confidence")
    if blocked:
        return blocked
    absent = [v for v in (variant, baseline) if v not in results.role_confidence]
    if absent:
        return not_measurable(f"no role confidences of {', '.join(absent)}")
    gate = _catching_up(results, variant, baseline)
    if gate:
        return gate
    parts = {}
    for role in roles:
        mine, theirs = (results.role_confidence[v].get(role, []) for v in (variant, baseline))
        if not mine or not theirs or None in mine or None in theirs:
            parts[role] = not_measurable("the corpus cannot show this role")
            continue
        held = {v: results.roles.get(v, {}).get(role) or [] for v in (variant, baseline)}
        if not any(count for counts in held.values() for count in counts):
            parts[role] = not_measurable(
                f"no head of {variant} or {baseline} holds it at its threshold (heads per seed: "
                + ", ".join(f"{v} {counts}" for v, counts in held.items())
                + "): no role confidence to compare"
            )
            continue
        parts[role] = checks.significantly_below(theirs, mine, names=(baseline, variant))
    return all_of(parts)


def adaptive_sparsity(
    results: Results, variant: str, fixed_alpha: str, fixed_support: str, density_below: float
) -> Verdict:
    """The variant's attention is sparse and adapts per head and per input, per seed:

    * sparse: its mean density over heads significantly below ``density_below`` (softmax's 1);
    * per head: the spread (population sd) of its heads' densities significantly above
      ``fixed_alpha``'s, whose α is the same in every head;
    * per input: its heads' mean density spread between inputs of one length significantly above
      ``fixed_support``'s, whose support is fixed by k at each length. Where the grid did not
      train ``fixed_support``, its closed form: top-k keeps min(k, n) of the n keys of every
      query, so its density is a function of the length and spreads by 0 within one.

    Each comparison with a trained model waits until neither catches up with the other."""
    blocked = _missing(results, "heads") or _missing(results, "density")
    if blocked:
        return blocked
    absent = [v for v in (variant, fixed_alpha) if v not in results.density]
    if absent:
        return not_measurable(f"no attention densities of {', '.join(absent)}")

    def per_seed(name: str, statistic: Callable[[list[float]], float], key: str) -> list[float]:
        return [
            statistic([v for v in seed[key] if v is not None]) for seed in results.density[name]
        ]

    mean, spread = statistics.fmean, statistics.pstdev
    parts = {
        "sparse": checks.significantly_below_value(
            per_seed(variant, mean, "heads"), density_below, names=(variant, "dense")
        ),
        "per head": _catching_up(results, variant, fixed_alpha)
        or checks.significantly_below(
            per_seed(fixed_alpha, spread, "heads"),
            per_seed(variant, spread, "heads"),
            names=(f"{fixed_alpha} head-density sd", f"{variant} head-density sd"),
        ),
        "per input": _catching_up(results, variant, fixed_support)
        or checks.significantly_below(
            per_seed(fixed_support, mean, "within_length_sd"),
            per_seed(variant, mean, "within_length_sd"),
            names=(f"{fixed_support} within-length sd", f"{variant} within-length sd"),
        )
        if fixed_support in results.density
        else checks.significantly_above_value(
            per_seed(variant, mean, "within_length_sd"),
            0.0,
            names=(f"{variant} within-length sd", f"{fixed_support} (closed form, untrained)"),
        ),
    }
    return all_of(parts)


# ------------------------------------------------------------------------------ latent variables


def _lvm(results: Results, experiment: str, methods: Sequence[str]) -> Verdict | None:
    missing = _missing(results, experiment)
    if missing:
        return missing
    absent = [m for m in methods if m not in results.lvm.get(experiment, {})]
    return not_measurable(f"{experiment}: no {', '.join(absent)} in the grid") if absent else None


def _metric(
    results: Results, experiment: str, method: str, metric: str, bits: int | None = None
) -> tuple[list[float], list[int]]:
    """The metric over the seeds (of D = ``bits``) and the indices of collapsed seeds
    (KL below :data:`COLLAPSED_KL_NATS`), which it leaves out."""
    values, collapsed = [], []
    for i, run in enumerate(results.lvm[experiment][method]):
        if bits is not None and run.get("latent_dim") != bits:
            continue
        if run.get("kl_nats", COLLAPSED_KL_NATS) < COLLAPSED_KL_NATS:
            collapsed.append(i)
        else:
            values.append(run[metric])
    return checks.finite(values), collapsed


# Experiments whose training loss heads to 0 (the game's receiver NLL per game, or its error
# rate for SFE with the 0/1 reward): compared as exp(old − new) − 1, the perplexity's relative
# change (≈ the error rate's absolute change), since a relative change of a loss near 0 never
# settles. The VAEs' losses are negative ELBOs of tens of nats, compared relatively.
LOSS_TOWARD_ZERO = ("signal_game",)


def _unconverged_lvm(results: Results, experiment: str, methods: Sequence[str]) -> Verdict | None:
    curves = results.lvm_curves.get(experiment, {})
    return checks.unconverged(
        {f"{m}/{i}": c for m in methods for i, c in enumerate(curves.get(m, []))},
        "training loss",
        log_loss=experiment in LOSS_TOWARD_ZERO,
    )


def marginalization_matches_dense(
    results: Results,
    experiment: str,
    metric: str,
    candidate: str,
    baseline: str,
    margin: float,
    largest_calls: float,
) -> Verdict:
    """The sparse method's test metric within seed noise of the dense one's (at most ``margin``
    worse), with at most ``largest_calls`` decoder calls per example on average."""
    blocked = _lvm(results, experiment, [candidate, baseline]) or _unconverged_lvm(
        results, experiment, [candidate, baseline]
    )
    if blocked:
        return blocked
    sparse, _ = _metric(results, experiment, candidate, metric)
    dense, _ = _metric(results, experiment, baseline, metric)
    calls = checks.finite([r["decoder_calls"] for r in results.lvm[experiment][candidate]])
    dense_calls = results.lvm[experiment][baseline][0]["decoder_calls"]
    few_calls = checks.mean_at_most(
        calls, largest_calls, f"{candidate} decoder calls (of {dense_calls:g})"
    )
    accuracy = checks.at_least_as_good(sparse, dense, margin, names=(candidate, baseline))
    return all_of({metric: accuracy, "decoder calls": few_calls})


def methods_below(
    results: Results, experiment: str, metric: str, methods: Sequence[str], baseline: str
) -> Verdict:
    """Each of ``methods`` significantly below the baseline in the (higher-is-better) metric."""
    blocked = _lvm(results, experiment, [*methods, baseline]) or _unconverged_lvm(
        results, experiment, [*methods, baseline]
    )
    if blocked:
        return blocked
    base, _ = _metric(results, experiment, baseline, metric)
    return all_of(
        {
            m: checks.significantly_below(
                _metric(results, experiment, m, metric)[0], base, names=(m, baseline)
            )
            for m in methods
        }
    )


def nll_at_or_below(
    results: Results,
    experiment: str,
    candidates: Sequence[str],
    baseline: str,
    margin: float,
    bits: Sequence[int],
) -> Verdict:
    """For each D in ``bits``: each candidate's NLL at or below the baseline's (not significantly
    above, mean at most ``margin`` above); collapsed runs are left out and named; a D where some
    run's importance-sampled NLL has not converged is not measurable."""
    blocked = _lvm(results, experiment, [*candidates, baseline]) or _unconverged_lvm(
        results, experiment, [*candidates, baseline]
    )
    if blocked:
        return blocked
    parts = {}
    for d in bits:
        unsettled = [
            f"{name} seed #{seed} fell {run['nll_estimate_drift']:.2f}"
            for name in (*candidates, baseline)
            for seed, run in enumerate(
                run for run in results.lvm[experiment][name] if run.get("latent_dim") == d
            )
            if run.get("nll_estimate_drift", 0.0) > UNSETTLED_NLL_BITS
        ]
        if unsettled:
            parts[f"D={d}"] = not_measurable(
                f"not measurable in this profile: the importance-sampled NLL has not converged "
                f"(bits/dim it fell from a quarter of the samples to all: {', '.join(unsettled)}; "
                f"settled: at most {UNSETTLED_NLL_BITS}); more importance samples decide it",
                unsettled=unsettled,
            )
            continue
        base, base_collapsed = _metric(results, experiment, baseline, "nll_bits_per_dim", d)
        for name in candidates:
            values, collapsed = _metric(results, experiment, name, "nll_bits_per_dim", d)
            part = checks.at_least_as_good(
                values, base, margin, higher_is_better=False, names=(name, baseline)
            )
            if collapsed or base_collapsed:
                note = (
                    f" (left out as collapsed, KL < {COLLAPSED_KL_NATS} nat: {name} seeds "
                    f"{collapsed}, {baseline} seeds {base_collapsed})"
                )
                part = Verdict(part.status, part.evidence + note, part.numbers)
            parts[f"D={d} {name}"] = part
    return all_of(parts)


def calls_fall(results: Results, experiments: Sequence[str], method: str) -> Verdict:
    """In each experiment, the method's decoder calls per example over the last
    :data:`checks.CONVERGENCE_WINDOW` of the training steps significantly below those over the
    first (one-sided Welch over seeds): it gets sparser as it trains."""
    parts = {}
    for experiment in experiments:
        blocked = _missing(results, "lvm_calls") or _lvm(results, experiment, [method])
        curves = results.lvm_calls.get(experiment, {}).get(method, [])
        if blocked or not curves:
            parts[experiment] = blocked or not_measurable(f"no {method} calls curves")
            continue
        first, last = [], []
        for curve in curves:
            width = checks.CONVERGENCE_WINDOW * curve[-1][0]
            first.append(statistics.fmean(v for s, v in curve if s <= curve[0][0] + width))
            last.append(statistics.fmean(v for s, v in curve if s > curve[-1][0] - width))
        parts[experiment] = checks.significantly_below(
            last, first, names=(f"{method} calls, last fifth", "first fifth")
        )
    return all_of(parts)


# ------------------------------------------------------------------------------ APE


def _ape(results: Results, systems: Sequence[str], split: str) -> Verdict | None:
    missing = _missing(results, "ape")
    if missing:
        return missing
    absent = [s for s in systems if split not in results.ape.get(s, {})]
    return (
        not_measurable(f"no {', '.join(absent)} scored on {split} in the APE grid")
        if absent
        else None
    )


def _ape_unconverged(results: Results, systems: Sequence[str]) -> Verdict | None:
    """ "Not measurable" while a system's own validation NLL still improves (for a comparison
    with the do-nothing baseline, which has no curve)."""
    curves = {
        f"{s}/{i}": c for s in systems for i, c in enumerate(results.ape_valid_nll.get(s, []))
    }
    return checks.unconverged(curves, "validation NLL", log_loss=True)


def _ape_gap_moving(results: Results, candidate: str, other: str) -> Verdict | None:
    """ "Not measurable" while the gap between two systems' validation NLL still moves (one is
    still catching up): training length, not the system, would decide the comparison."""
    pair = (results.ape_valid_nll.get(candidate, []), results.ape_valid_nll.get(other, []))
    return checks.unsettled({f"{candidate} vs {other}": pair}, "validation NLL", log_loss=True)


def _against_do_nothing(
    results: Results, systems: Sequence[str], split: str, below: bool
) -> Verdict:
    """Each system's TER significantly below (``below``) or above the do-nothing TER (the MT
    output scored as is, which has no seed variance: a one-sample test of the systems' seeds),
    once the system's validation NLL has stopped improving."""
    blocked = _ape(results, systems, split)
    if blocked:
        return blocked
    if split not in results.ape_do_nothing:
        return not_measurable(f"no do-nothing score on {split}")
    test = checks.significantly_below_value if below else checks.significantly_above_value
    return all_of(
        {
            system: _ape_unconverged(results, [system])
            or test(
                results.ape[system][split],
                results.ape_do_nothing[split],
                names=(system, "do nothing"),
            )
            for system in systems
        }
    )


def ape_below_do_nothing(results: Results, systems: Sequence[str], split: str) -> Verdict:
    """Each system lowers TER below the MT output's (:func:`_against_do_nothing`)."""
    return _against_do_nothing(results, systems, split, below=True)


def ape_above_do_nothing(results: Results, systems: Sequence[str], split: str) -> Verdict:
    """Each system raises TER above the MT output's: it does worse than leaving the MT output
    as it is (:func:`_against_do_nothing`)."""
    return _against_do_nothing(results, systems, split, below=False)


def _ape_against_each(
    results: Results,
    candidate: str,
    others: Sequence[str],
    split: str,
    compare: Callable[[list[float], list[float], tuple[str, str]], Verdict],
) -> Verdict:
    """``compare(candidate's TERs, other's TERs, names)`` for each other system, once the gap
    between the two systems' validation NLL has settled."""
    blocked = _ape(results, [candidate, *others], split)
    if blocked:
        return blocked
    return all_of(
        {
            other: _ape_gap_moving(results, candidate, other)
            or compare(results.ape[candidate][split], results.ape[other][split], (candidate, other))
            for other in others
        }
    )


def ape_ter_below(
    results: Results, candidate: str, baselines: Sequence[str], split: str
) -> Verdict:
    """The candidate's TER significantly below each baseline's (one-sided Welch over seeds)."""
    return _ape_against_each(
        results,
        candidate,
        baselines,
        split,
        lambda ter, other, names: checks.significantly_below(ter, other, names=names),
    )


def ape_best_of(
    results: Results, best: str, others: Sequence[str], split: str, margin: float
) -> Verdict:
    """The ``best`` system's TER at least as good as each of ``others`` (not significantly
    higher, mean at most ``margin`` TER points higher)."""
    return _ape_against_each(
        results,
        best,
        others,
        split,
        lambda ter, other, names: checks.at_least_as_good(
            ter, other, margin, higher_is_better=False, names=names
        ),
    )


def ape_nearly_as_good(
    results: Results, candidate: str, baseline: str, split: str, margin: float
) -> Verdict:
    """The candidate's TER nearly as good as the baseline's: at most ``margin`` TER points
    higher, and not significantly more (:func:`checks.nearly_as_good`)."""
    return _ape_against_each(
        results,
        candidate,
        [baseline],
        split,
        lambda ter, other, names: checks.nearly_as_good(
            ter, other, margin, higher_is_better=False, names=names
        ),
    )


CHECKS: dict[str, Callable[..., Verdict]] = {
    f.__name__: f
    for f in (
        bleu_at_least_as_good,
        bleu_a_little_below,
        speed_near_softmax,
        decodes_faster,
        slowest,
        alpha_modes,
        heads_dense_then_sparse,
        sparse_heads_more_diverse,
        head_roles_exist,
        roles_more_confident,
        adaptive_sparsity,
        marginalization_matches_dense,
        methods_below,
        nll_at_or_below,
        calls_fall,
        ape_below_do_nothing,
        ape_above_do_nothing,
        ape_ter_below,
        ape_best_of,
        ape_nearly_as_good,
    )
}


@cache
def _claims_file() -> tuple[tuple[Claim, ...], tuple[OutOfScope, ...]]:
    text = resources.files(__package__).joinpath("claims.yaml").read_text("utf-8")
    return parse_claims(text, CHECKS)


def load_claims() -> tuple[Claim, ...]:
    """The claims of ``claims.yaml`` (:func:`parse_claims`: checked against :data:`CHECKS`)."""
    return _claims_file()[0]


def out_of_scope() -> tuple[OutOfScope, ...]:
    """The claims of the seed documents that ``claims.yaml`` leaves out, with the reasons."""
    return _claims_file()[1]


def evaluate(results: Results, claims: Sequence[Claim] | None = None) -> list[ClaimResult]:
    """Every claim's verdict on ``results`` (default: the claims of ``claims.yaml``)."""
    return [
        ClaimResult(claim, CHECKS[claim.check](results, **claim.arguments()))
        for claim in (load_claims() if claims is None else claims)
    ]
