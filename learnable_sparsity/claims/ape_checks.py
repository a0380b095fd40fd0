"""The claim checks of BERT-based automatic post-editing: TER against do-nothing and the
other systems.

Each check is a function ``(results, **args, **thresholds) ->
:class:`~learnable_sparsity.claims.checks.Verdict``` registered in :data:`CHECKS` (collected by
:mod:`learnable_sparsity.claims.catalog`) under the name ``claims.yaml`` uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from learnable_sparsity.claims import checks
from learnable_sparsity.claims.checks import (
    Verdict,
    all_of,
    missing_results,
    not_measurable,
)
from learnable_sparsity.claims.results import Results


def _ape(
    results: Results, systems: Sequence[str], split: str, metric: str = "ter"
) -> Verdict | None:
    missing = missing_results(results.missing, "ape", *(["ape_bleu"] if metric == "bleu" else []))
    if missing:
        return missing
    scores = results.ape_bleu if metric == "bleu" else results.ape
    absent = [s for s in systems if split not in scores.get(s, {})]
    return (
        not_measurable(
            f"no {', '.join(absent)} scored on {split} in the APE grid",
            decides=f"an APE grid that trains and scores {', '.join(absent)} on {split}",
        )
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


def _ape_gaps_moving(
    results: Results,
    candidate: str,
    others: Sequence[str],
    verdicts: Mapping[str, Verdict],
) -> dict[str, Verdict | None]:
    """Per other system: "not measurable" while the gap between its validation NLL and the
    candidate's still moves (one is still catching up) by enough to flip the comparison's
    verdict in ``verdicts`` (other → verdict): training length, not the system, could decide
    the comparison. The gaps are one claim's family (:func:`checks.unsettled_each`)."""
    curves = results.ape_valid_nll
    gates = checks.unsettled_each(
        {
            f"{candidate} vs {other}": (curves.get(candidate, []), curves.get(other, []))
            for other in others
        },
        "validation NLL",
        {f"{candidate} vs {other}": verdicts.get(other) for other in others},
    )
    return {other: gates[f"{candidate} vs {other}"] for other in others}


def _against_do_nothing(
    results: Results, systems: Sequence[str], split: str, below: bool, metric: str = "ter"
) -> Verdict:
    """Each system's ``metric`` (TER or BLEU) significantly below (``below``) or above the
    do-nothing score (the MT output scored as is, which has no seed variance: a one-sample test
    of the systems' seeds), once the system's validation NLL has stopped improving."""
    blocked = _ape(results, systems, split, metric)
    if blocked:
        return blocked
    scores, do_nothing = (
        (results.ape_bleu, results.ape_do_nothing_bleu)
        if metric == "bleu"
        else (results.ape, results.ape_do_nothing)
    )
    if split not in do_nothing:
        return not_measurable(
            f"no do-nothing score on {split}",
            decides=f"an APE evaluation that scores the MT output on {split}",
        )
    test = checks.significantly_below_value if below else checks.significantly_above_value
    return all_of(
        {
            system: _ape_unconverged(results, [system])
            or test(
                scores[system][split],
                do_nothing[split],
                names=(f"{system} {metric.upper()}", "do nothing"),
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


def ape_bleu_above_do_nothing(results: Results, systems: Sequence[str], split: str) -> Verdict:
    """Each system raises BLEU (tokenized, as the thesis scores it) above the MT output's
    (:func:`_against_do_nothing`)."""
    return _against_do_nothing(results, systems, split, below=False, metric="bleu")


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
    verdicts = {
        other: compare(results.ape[candidate][split], results.ape[other][split], (candidate, other))
        for other in others
    }
    gates = _ape_gaps_moving(results, candidate, others, verdicts)
    return all_of({other: gates[other] or verdicts[other] for other in others})


def ape_ter_below(
    results: Results, candidate: str, baselines: Sequence[str], split: str
) -> Verdict:
    """The candidate's TER significantly below each baseline's (one-sided, paired by seed)."""
    return _ape_against_each(
        results,
        candidate,
        baselines,
        split,
        lambda ter, other, names: checks.significantly_below(ter, other, names=names, paired=True),
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
            ter, other, margin, higher_is_better=False, names=names, paired=True
        ),
    )


def ape_nearly_as_good(
    results: Results, candidate: str, baseline: str, split: str, margin: float
) -> Verdict:
    """The candidate's TER nearly as good as the baseline's: "nearly" is at most ``margin`` TER
    points higher, the published gap — non-inferiority at that margin (:func:`ape_best_of` of
    the one baseline)."""
    return ape_best_of(results, candidate, [baseline], split, margin)


# The checks of automatic post-editing, in the order of claims.yaml's families.
CHECKS = (
    ape_below_do_nothing,
    ape_above_do_nothing,
    ape_bleu_above_do_nothing,
    ape_ter_below,
    ape_best_of,
    ape_nearly_as_good,
)
