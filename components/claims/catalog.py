"""The claim checks on a grid's results, and the claims of ``claims.yaml`` they evaluate.

:class:`Results` holds what the checks read, as plain numbers per seed; a check is a function
``(results, **args) -> Verdict`` registered in :data:`CHECKS` under the name ``claims.yaml``
uses. Where a result is missing (a stage not run, a variant not in the grid) the verdict is
"not measurable", naming what is missing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from components.analysis.alpha import (
    BIMODALITY_THRESHOLD,
    MIN_BIMODALITY_VALUES,
    bimodality_coefficient,
)
from components.claims import checks
from components.claims.checks import (
    NOT_REPRODUCED,
    Verdict,
    all_of,
    describe,
    not_measurable,
    verdict,
)
from components.errors import LearnableSparsityError
from components.reporting.lvm_tables import COLLAPSED_KL_NATS, UNSETTLED_NLL_BITS

Curve = list[tuple[float, float]]
# Learned α has settled when its heads moved by at most 0.02 on average over the last window of
# the steps: 2% of the range (1, 2] it lives in, well below the gap between the modes it reads.
ALPHA_SETTLED = 0.02


@dataclass(frozen=True)
class Results:
    """Everything the checks read, per seed (lists are over seeds, in seed order).

    ``bleu``: corpus → variant → BLEU; ``valid_nll``: corpus → variant → validation NLL curves
    (step, nll) of the seeds; ``speed``: variant → ``train`` / ``inference`` → the ratio to
    softmax's tokens/s in each round; ``js``: variant → block → mean JS between the block's heads
    (None where the block has fewer than two heads); ``roles``: variant →
    role → number of heads with the role (None where the corpus cannot show it); ``final_alphas``:
    attention type → the learned α of every head, layer and seed; ``alpha_trajectories``: per
    seed, (step, every head's α) as training logged them; ``dense_then_sparse``: heads
    whose α went toward softmax and then sparser, per seed; ``lvm``: experiment → method → the
    test metrics; ``lvm_curves``: experiment → method → training-loss curves; ``ape``:
    "<regime>/<system>" → split → TER of each seed; ``ape_do_nothing``: split → TER of the MT
    output itself; ``ape_valid_nll``: "<regime>/<system>" → validation NLL curves of the seeds;
    ``missing``: result → why it is absent.
    """

    bleu: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    valid_nll: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    speed: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    js: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    roles: dict[str, dict[str, list[int | None]]] = field(default_factory=dict)
    final_alphas: dict[str, list[float]] = field(default_factory=dict)
    alpha_trajectories: list[list[tuple[float, list[float]]]] = field(default_factory=list)
    dense_then_sparse: list[int] = field(default_factory=list)
    lvm: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=dict)
    lvm_curves: dict[str, dict[str, list[Curve]]] = field(default_factory=dict)
    ape: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    ape_do_nothing: dict[str, float] = field(default_factory=dict)
    ape_valid_nll: dict[str, list[Curve]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """One qualitative claim of a paper and how it is tested."""

    id: str
    work: str
    source: str
    text: str
    check: str
    args: dict[str, Any] = field(default_factory=dict)


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


def _trained_to_plateau(results: Results, variants: Sequence[str]) -> Verdict | None:
    """ "Not measurable" while the validation perplexity of a model the claim analyses still
    improves: heads it has not grown yet may still appear."""
    return checks.unconverged(
        {
            f"{corpus}/{variant}/seed{i}": curve
            for corpus, by_variant in results.valid_nll.items()
            for variant in variants
            for i, curve in enumerate(by_variant.get(variant, []))
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


def speed_near_softmax(results: Results, variant: str, tolerance: float) -> Verdict:
    """Training and inference tokens/s of the variant within 1 ± tolerance of softmax's."""
    missing = _missing(results, "speed")
    if missing:
        return missing
    if variant not in results.speed:
        return not_measurable(f"{variant} was not timed")
    rounds = results.speed[variant]
    return all_of(
        {
            phase: checks.ratio_near_one(rounds[phase], tolerance, f"{phase} tokens/s ratio")
            for phase in ("train", "inference")
        }
    )


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


def alpha_bimodal(results: Results, bimodal: Sequence[str], unimodal: Sequence[str]) -> Verdict:
    """Bimodality coefficient of the learned α, pooled over layers and seeds: above 5/9 in the
    ``bimodal`` attention types, not above it in the ``unimodal`` ones, once α has settled and
    the α-entmax models no longer catch up with softmax (α may stall early in training)."""
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
        if len(alphas) < MIN_BIMODALITY_VALUES or max(alphas) == min(alphas):
            parts[kind] = not_measurable(f"{len(alphas)} learned α in {kind}")
            continue
        coefficient = bimodality_coefficient(alphas)
        is_bimodal = coefficient > BIMODALITY_THRESHOLD
        parts[kind] = verdict(
            is_bimodal == expect,
            f"bimodality coefficient {coefficient:.2f} over {len(alphas)} heads "
            f"({'>' if is_bimodal else '≤'} 5/9; expected {'bimodal' if expect else 'one mode'})",
            coefficient=coefficient,
            heads=len(alphas),
        )
    return all_of(parts)


def _alpha_still_moving(results: Results) -> Verdict | None:
    """ "Not measurable" while the learned α still moves: the mean |Δα| over heads between the
    α logged last and the α logged :data:`checks.CONVERGENCE_WINDOW` of the steps earlier is
    above :data:`ALPHA_SETTLED` in some seed."""
    drifts = []
    for trajectory in results.alpha_trajectories:
        if len(trajectory) < 2:
            continue
        last_step, last = trajectory[-1]
        start = last_step * (1 - checks.CONVERGENCE_WINDOW)
        earlier = min(trajectory, key=lambda entry: abs(entry[0] - start))[1]
        drifts.append(statistics.fmean(abs(a - b) for a, b in zip(last, earlier, strict=True)))
    moving = [d for d in drifts if d > ALPHA_SETTLED]
    if not moving:
        return None
    return not_measurable(
        f"not measurable in this profile: α still moves by {max(moving):.3f} on average per "
        f"head over the last {checks.CONVERGENCE_WINDOW:.0%} of the steps (settled: at most "
        f"{ALPHA_SETTLED}); a longer profile decides it",
        alpha_drift=drifts,
    )


def _found_or_still_training(found: Verdict, results: Results, variants: Sequence[str]) -> Verdict:
    """An existence claim: found heads reproduce it at any training length; none found is
    "not reproduced" only once the models have stopped improving (they may still appear)."""
    if found.status != NOT_REPRODUCED:
        return found
    if not any(
        results.valid_nll.get(corpus, {}).get(v) for corpus in results.valid_nll for v in variants
    ):
        return not_measurable(
            f"none found, and no validation curves of {', '.join(variants)} "
            "to tell whether training has ended"
        )
    return _trained_to_plateau(results, variants) or found


def heads_dense_then_sparse(results: Results) -> Verdict:
    """At least one head's α first moves toward softmax and then becomes sparser."""
    missing = _missing(results, "alphas")
    if missing:
        return missing
    counts = results.dense_then_sparse
    if not counts:
        return not_measurable("no α-entmax model with an α trajectory")
    found = verdict(
        sum(counts) > 0,
        f"heads toward softmax then sparser, per seed: {counts}",
        per_seed=counts,
    )
    return _found_or_still_training(found, results, ["entmax_alpha"])


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


def head_roles_exist(results: Results, variant: str, roles: Sequence[str]) -> Verdict:
    """Each role has at least one head in some seed of the variant; a role the corpus cannot
    show (no interrogative, no split word) is not measurable."""
    blocked = _missing(results, "heads")
    if blocked:
        return blocked
    if variant not in results.roles:
        return not_measurable(f"no head analysis of {variant}")
    parts = {}
    for role in roles:
        counts = results.roles[variant].get(role, [])
        if not counts or any(c is None for c in counts):
            parts[role] = not_measurable(f"{role}: the corpus cannot show this role")
        else:
            found = verdict(sum(counts) > 0, f"{role} heads per seed {counts}")
            parts[role] = _found_or_still_training(found, results, [variant])
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
    few_calls = verdict(
        bool(calls) and statistics.fmean(calls) <= largest_calls,
        f"{candidate} decoder calls {describe(calls)} of {dense_calls:g} (at most {largest_calls})",
        calls=calls,
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


def _ape_or_still_training(found: Verdict, results: Results, systems: Sequence[str]) -> Verdict:
    """A comparison that failed is "not reproduced" only once the systems' validation NLL has
    stopped improving (a longer run may still separate them)."""
    if found.status != NOT_REPRODUCED:
        return found
    curves = {
        f"{s}/{i}": c for s in systems for i, c in enumerate(results.ape_valid_nll.get(s, []))
    }
    return checks.unconverged(curves, "validation NLL", log_loss=True) or found


def ape_below_do_nothing(results: Results, systems: Sequence[str], split: str) -> Verdict:
    """Each system's TER significantly below the do-nothing TER (the MT output scored as is,
    which has no seed variance: a one-sample test of the systems' seeds)."""
    blocked = _ape(results, systems, split)
    if blocked:
        return blocked
    if split not in results.ape_do_nothing:
        return not_measurable(f"no do-nothing score on {split}")
    parts = {}
    for system in systems:
        part = checks.significantly_below_value(
            results.ape[system][split], results.ape_do_nothing[split], names=(system, "do nothing")
        )
        parts[system] = _ape_or_still_training(part, results, [system])
    return all_of(parts)


def _ape_against_each(
    results: Results,
    candidate: str,
    others: Sequence[str],
    split: str,
    compare: Callable[[list[float], list[float], tuple[str, str]], Verdict],
) -> Verdict:
    """``compare(candidate's TERs, other's TERs, names)`` for each other system, a failure
    counted only once both have stopped improving."""
    blocked = _ape(results, [candidate, *others], split)
    if blocked:
        return blocked
    return all_of(
        {
            other: _ape_or_still_training(
                compare(
                    results.ape[candidate][split], results.ape[other][split], (candidate, other)
                ),
                results,
                [candidate, other],
            )
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


CHECKS: dict[str, Callable[..., Verdict]] = {
    f.__name__: f
    for f in (
        bleu_at_least_as_good,
        bleu_a_little_below,
        speed_near_softmax,
        slowest,
        alpha_bimodal,
        heads_dense_then_sparse,
        sparse_heads_more_diverse,
        head_roles_exist,
        marginalization_matches_dense,
        methods_below,
        nll_at_or_below,
        ape_below_do_nothing,
        ape_ter_below,
        ape_best_of,
    )
}


@cache
def load_claims() -> tuple[Claim, ...]:
    """The claims of ``claims.yaml``, checked: known check names, unique ids."""
    text = resources.files(__package__).joinpath("claims.yaml").read_text("utf-8")
    claims = tuple(Claim(**entry) for entry in yaml.safe_load(text)["claims"])
    seen: set[str] = set()
    for claim in claims:
        if claim.check not in CHECKS:
            raise LearnableSparsityError(
                f"claims.yaml: claim {claim.id!r} names an unknown check {claim.check!r}"
            )
        if claim.id in seen:
            raise LearnableSparsityError(f"claims.yaml: claim id {claim.id!r} appears twice")
        seen.add(claim.id)
    return claims


def evaluate(results: Results, claims: Sequence[Claim] | None = None) -> list[ClaimResult]:
    """Every claim's verdict on ``results`` (default: the claims of ``claims.yaml``)."""
    return [
        ClaimResult(claim, CHECKS[claim.check](results, **claim.args))
        for claim in (load_claims() if claims is None else claims)
    ]
