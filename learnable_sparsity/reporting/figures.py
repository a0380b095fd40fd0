"""Figures of the latent-variable experiments (matplotlib ``Figure`` objects; nothing is saved).

* :func:`metric_against_decoder_calls` — the thesis' trade-off plot: each method's headline
  metric (accuracy, communication success, NLL) against its decoder calls per example, one point
  per seed, log-scaled calls (dense marginalization sits at K, sampling at 1 or 2).
* :func:`support_over_training` — mean support size of the sparse posteriors (sparsemax, top-k
  sparsemax, SparseMAP) at the logged training steps.
* :func:`experiment_figures` — both, for every D of an experiment, from its runs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from matplotlib.figure import Figure

from learnable_sparsity.errors import LearnableSparsityError


def metric_against_decoder_calls(
    points: Mapping[str, tuple[Sequence[float], Sequence[float]]], metric_label: str
) -> Figure:
    """One marker per (method, seed) at (decoder calls, metric); ``points`` maps a method name to
    (calls per seed, metric per seed)."""
    if not points:
        raise LearnableSparsityError("metric_against_decoder_calls needs at least one method")
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for method, (calls, values) in points.items():
        if len(calls) != len(values) or not calls:
            raise LearnableSparsityError(
                f"method {method!r} has {len(calls)} decoder-call values for {len(values)} metrics"
            )
        ax.scatter(calls, values, label=method, s=28)
    ax.set_xscale("log")
    ax.set_xlabel("decoder calls per example (log scale)")
    ax.set_ylabel(metric_label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def support_over_training(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]]) -> Figure:
    """Mean support size over training: one line per method, ``curves`` maps a method name to
    (steps, mean support at those steps)."""
    if not curves:
        raise LearnableSparsityError("support_over_training needs at least one curve")
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for method, (steps, support) in curves.items():
        ax.plot(steps, support, label=method)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean support size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def experiment_figures(
    runs: Sequence[Mapping[str, Any]], metric: str, label: str, sparse: Collection[str]
) -> dict[str, Figure]:
    """The figures of one latent-variable experiment, per value of D (bit-vector VAE) or once.

    ``runs``: one {"method", "seed", "bits" (D or None), "metrics", "curves"} per grid cell,
    ``metrics`` holding ``metric`` and "decoder_calls", ``curves`` the "support" series.
    Returns "decoder_calls[_D<bits>]" (:func:`metric_against_decoder_calls` of ``metric``,
    labelled ``label``) and, where a method of ``sparse`` ran, "support[_D<bits>]"
    (:func:`support_over_training` of the first seed's runs).
    """
    figures: dict[str, Figure] = {}
    for bits in sorted({run["bits"] for run in runs}, key=lambda b: b or 0):
        suffix = "" if bits is None else f"_D{bits}"
        group = [run for run in runs if run["bits"] == bits]
        points: dict[str, tuple[list[float], list[float]]] = {}
        for run in group:
            calls, values = points.setdefault(run["method"], ([], []))
            calls.append(run["metrics"]["decoder_calls"])
            values.append(run["metrics"][metric])
        figures[f"decoder_calls{suffix}"] = metric_against_decoder_calls(points, label)
        first_seed = group[0]["seed"]
        support = {
            run["method"]: run["curves"]["support"]
            for run in group
            if run["method"] in sparse and run["seed"] == first_seed
        }
        if support:
            figures[f"support{suffix}"] = support_over_training(support)
    return figures
