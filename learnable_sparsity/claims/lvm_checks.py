"""The claim checks of the latent-variable experiments: marginalization against sampling, the
NLL of the bit-vector VAE, decoder calls.

Each check is a function ``(results, **args, **thresholds) ->
:class:`~learnable_sparsity.claims.checks.Verdict``` registered in :data:`CHECKS` (collected by
:mod:`learnable_sparsity.claims.catalog`) under the name ``claims.yaml`` uses.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from learnable_sparsity.claims import checks
from learnable_sparsity.claims.checks import (
    Verdict,
    all_of,
    missing_results,
    not_measurable,
)
from learnable_sparsity.claims.results import Results
from learnable_sparsity.reporting.lvm_tables import COLLAPSED_KL_NATS, UNSETTLED_NLL_BITS


def _lvm(results: Results, experiment: str, methods: Sequence[str]) -> Verdict | None:
    missing = missing_results(results.missing, experiment)
    if missing:
        return missing
    absent = [m for m in methods if m not in results.lvm.get(experiment, {})]
    if not absent:
        return None
    return not_measurable(
        f"{experiment}: no {', '.join(absent)} in the grid",
        decides=f"a grid that trains {', '.join(absent)}",
    )


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


def _all_kept(
    results: Results, experiment: str, methods: Sequence[str], metric: str, bits: int | None = None
) -> bool:
    """Whether every run of ``methods`` (of D = ``bits``) is kept by :func:`_metric` (none
    collapsed, every value finite): their lists are then the same seeds, in order, and pair."""
    return all(
        len(_metric(results, experiment, m, metric, bits)[0])
        == sum(bits is None or run.get("latent_dim") == bits for run in results.lvm[experiment][m])
        for m in methods
    )


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
    accuracy = checks.at_least_as_good(
        sparse,
        dense,
        margin,
        names=(candidate, baseline),
        paired=_all_kept(results, experiment, [candidate, baseline], metric),
    )
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
                _metric(results, experiment, m, metric)[0],
                base,
                names=(m, baseline),
                paired=_all_kept(results, experiment, [m, baseline], metric),
            )
            for m in methods
        }
    )


def nll_at_or_below(
    results: Results,
    experiment: str,
    candidates: Sequence[str],
    baselines: Sequence[str],
    margin: float,
    bits: Sequence[int],
) -> Verdict:
    """For each D in ``bits``: each candidate's NLL at or below each baseline's (not
    significantly above, mean at most ``margin`` above); collapsed runs are left out and named;
    a D where some run's importance-sampled NLL has not converged is not measurable."""
    blocked = _lvm(results, experiment, [*candidates, *baselines]) or _unconverged_lvm(
        results, experiment, [*candidates, *baselines]
    )
    if blocked:
        return blocked
    parts = {}
    for d in bits:
        unsettled = [
            f"{name} seed #{seed} fell {run['nll_estimate_drift']:.2f}"
            for name in (*candidates, *baselines)
            for seed, run in enumerate(
                run for run in results.lvm[experiment][name] if run.get("latent_dim") == d
            )
            if run.get("nll_estimate_drift", 0.0) > UNSETTLED_NLL_BITS
        ]
        if unsettled:
            parts[f"D={d}"] = not_measurable(
                f"not measurable in this profile: the importance-sampled NLL has not converged "
                f"(bits/dim it fell from a quarter of the samples to all: {', '.join(unsettled)}; "
                f"settled: at most {UNSETTLED_NLL_BITS})",
                decides="more importance samples per test example (the thesis: 1,024)",
                unsettled=unsettled,
            )
            continue
        for baseline in baselines:
            base, base_collapsed = _metric(results, experiment, baseline, "nll_bits_per_dim", d)
            for name in candidates:
                values, collapsed = _metric(results, experiment, name, "nll_bits_per_dim", d)
                part = checks.at_least_as_good(
                    values,
                    base,
                    margin,
                    higher_is_better=False,
                    names=(name, baseline),
                    paired=_all_kept(results, experiment, [name, baseline], "nll_bits_per_dim", d),
                )
                if collapsed or base_collapsed:
                    note = (
                        f" (left out as collapsed, KL < {COLLAPSED_KL_NATS} nat: {name} seeds "
                        f"{collapsed}, {baseline} seeds {base_collapsed})"
                    )
                    part = Verdict(part.status, part.evidence + note, part.numbers)
                key = f"D={d} {name}" if len(baselines) == 1 else f"D={d} {name} vs {baseline}"
                parts[key] = part
    return all_of(parts)


def calls_fall(
    results: Results, experiment: str, method: str, largest_final_calls: float
) -> Verdict:
    """The method gets very sparse as it trains: its decoder calls per example over the last
    rule ``convergence_window`` of the training steps below those over the first (the bound of
    the fall paired by run, :func:`checks.significantly_below`: each seed's first and last
    fifth are one run's), and their mean over the seeds at most
    ``largest_final_calls`` (a fall from a dense start, 256 → 230 calls of 256, is not "very
    sparse"); judged once its training loss has converged, as its neighbours are."""
    blocked = (
        missing_results(results.missing, "lvm_calls")
        or _lvm(results, experiment, [method])
        or _unconverged_lvm(results, experiment, [method])
    )
    if blocked:
        return blocked
    curves = results.lvm_calls.get(experiment, {}).get(method, [])
    if not curves:
        return not_measurable(
            f"no {method} calls curves", decides=f"runs that log {method}'s decoder calls"
        )
    first, last = [], []
    for curve in curves:
        width = checks.rule("convergence_window") * curve[-1][0]
        first.append(statistics.fmean(v for s, v in curve if s <= curve[0][0] + width))
        last.append(statistics.fmean(v for s, v in curve if s > curve[-1][0] - width))
    name = f"{method} calls, last fifth"
    return all_of(
        {
            "falls": checks.significantly_below(
                last, first, names=(name, "first fifth"), paired=True
            ),
            "very sparse": checks.mean_at_most(last, largest_final_calls, name),
        }
    )


# The checks of the latent-variable experiments, in the order of claims.yaml's families.
CHECKS = (
    marginalization_matches_dense,
    methods_below,
    nll_at_or_below,
    calls_fall,
)
