r"""The latent-variable comparison table: thesis Tables 5.1–5.3 beside the reproduced results.

:func:`lvm_table` builds one :class:`~learnable_sparsity.reporting.table.ComparisonTable` per
experiment (semi-supervised VAE on MNIST, emergent-communication signal game, bit-vector VAE on
Fashion-MNIST) from the per-seed metric dicts of the ``train_lvm`` stage: mean ± standard error
over seeds (std/√n), fractions shown as %, beside the thesis' numbers and their printed ±.
:class:`LvmTableSpec` gives an experiment's published table, the methods in the thesis' row
order (and the extra methods without a published value) and the metric columns; the bit-vector
VAE has one column pair per latent size D. Each experiment's record holds its spec
(``pipelines/lvm_experiments.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.published import paper_table, published_row
from learnable_sparsity.reporting.table import (
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    TableCell,
    check_names,
    check_number,
    check_ordered,
    file_stem,
)

# A bit-vector VAE run whose posterior is this close to the prior (test KL(q‖p) in nats over D
# bits) has a decoder that ignores z: its NLL says nothing about the estimator (posterior
# collapse), so it is left out of the method's mean and counted in the caption.
COLLAPSED_KL_NATS = 1.0
# An importance-sampled NLL that fell by more than 0.01 bits/dim from a quarter of the samples to
# all of them (``nll_estimate_drift``) has not converged: the log of a mean of too few draws
# overstates the NLL. 0.01 bits/dim is a tenth of the gaps between the thesis' estimators.
UNSETTLED_NLL_BITS = 0.01


@dataclass(frozen=True)
class LvmMetric:
    """A metric column of an experiment's table."""

    key: str  # in the per-seed dicts
    label: str
    fraction: bool  # a fraction in [0, 1], shown as %
    published: str | None  # metric name in the published table
    spread: str | None = None  # its ± field


@dataclass(frozen=True)
class LvmTableSpec:
    """An experiment's table: the published table (``table_id`` of ``paper_results.yaml``), its
    title, the data set the publication used (in this project's naming), the methods in the
    thesis' row order (method → published system), the extra methods without a published value
    (method → row label), the metric columns, and whether each metric has a column per latent
    size D (the bit-vector VAE)."""

    table_id: str
    title: str
    published_data: str
    methods: Mapping[str, str]
    extras: Mapping[str, str]
    metrics: tuple[LvmMetric, ...]
    per_latent_dim: bool = False


def _latent_dims(results: Mapping[str, Sequence[Mapping[str, Any]]], published: dict) -> list[int]:
    """The bit-vector sizes D of the published columns and of the results, ascending."""
    dims = {int(m["name"].rsplit("_D", 1)[1]) for m in published["metrics"]}
    for method, runs in results.items():
        for i, run in enumerate(runs):
            value = run.get("latent_dim")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LearnableSparsityError(
                    f"results[{method!r}][{i}] latent_dim must be a positive integer, got {value!r}"
                )
            dims.add(value)
    return sorted(dims)


def lvm_table(
    experiment: str,
    spec: LvmTableSpec,
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    profile: str,
    data: str | Sequence[str],
) -> ComparisonTable:
    """Latent-variable results beside thesis Tables 5.1–5.3: mean ± standard error over seeds.

    ``experiment``: the experiment's name (the table's file stem), ``spec`` its table (the
    experiments' records, ``pipelines.lvm_experiments``). ``results``: {method: [one
    metric dict per seed]}; rows follow the thesis order, then the extra methods (no published
    value); only given methods appear. Methods and per-seed keys:

    * ssvae — sfe, sfe_plus, nvil, sum_and_sample, gumbel, st_gumbel, dense, sparsemax,
      unordered_set; {"accuracy": test accuracy as a fraction in [0, 1], "decoder_calls": …}.
    * signal_game — sfe_nll, sfe_zero_one (SFE with the NLL / 0-1 reward), sfe_plus (the thesis
      ran SFE+ with the 0-1 reward), nvil, gumbel, st_gumbel, dense, sparsemax, sum_and_sample,
      unordered_set; {"communication_success": fraction in [0, 1], "decoder_calls": …}.
    * bitvector_vae — sfe, sfe_plus, nvil, gumbel, st_gumbel, topk_sparsemax, sparsemap,
      sparsemap_budget; {"latent_dim": D, "nll_bits_per_dim": …, "decoder_calls": …}; one
      column pair per D (the published D = 32 and 128, and any D of the results).

    Fractions are shown as %. ``data``: the data set used (the publication's:
    ``spec.published_data``).
    """
    datasets = check_names("data", data)
    published = paper_table(spec.table_id)
    methods = check_ordered("method", results, [*spec.methods, *spec.extras])
    for method in methods:
        for i, run in enumerate(results[method]):
            if not isinstance(run, Mapping):
                raise LearnableSparsityError(
                    f"results[{method!r}][{i}] must be a metric dict, got {type(run).__name__}"
                )
    dims: list[int | None] = _latent_dims(results, published) if spec.per_latent_dim else [None]

    def column(metric: LvmMetric, dim: int | None) -> tuple[str, str, str | None]:
        """(cell key, header label, published field) of ``metric`` at latent size ``dim``."""
        if dim is None:
            return metric.key, metric.label, metric.published
        field = None if metric.published is None else f"{metric.published}_D{dim}"
        return f"{metric.key}_D{dim}", f"{metric.label}, D={dim}", field

    rows, collapsed, unsettled = [], [], []
    for method in methods:
        system = spec.methods.get(method)
        row = published_row(spec.table_id, system) if system else {}
        runs = results[method]
        cells = {}
        for dim in dims:
            selected, left_out = [], 0
            # i: the run's index in ``runs``; seed: its position among the runs of this D
            of_dim = [i for i, run in enumerate(runs) if dim is None or run["latent_dim"] == dim]
            for seed, i in enumerate(of_dim):
                run = runs[i]
                if run.get("kl_nats", COLLAPSED_KL_NATS) < COLLAPSED_KL_NATS:
                    collapsed.append(f"{method} D={dim} seed #{seed}")
                    left_out += 1
                    continue
                selected.append((i, run))
                if run.get("nll_estimate_drift", 0.0) > UNSETTLED_NLL_BITS:
                    drift = run["nll_estimate_drift"]
                    unsettled.append(f"{method} D={dim} seed #{seed} ({drift:.2f})")
            for metric in spec.metrics:
                key, _, field = column(metric, dim)
                values = []
                for i, run in selected:
                    if metric.key not in run:
                        raise LearnableSparsityError(
                            f"results[{method!r}][{i}] lacks {metric.key!r}"
                        )
                    name = f"results[{method!r}][{i}] {metric.key}"
                    if metric.fraction:
                        values.append(100 * check_number(name, run[metric.key], 0.0, 1.0))
                    else:
                        values.append(check_number(name, run[metric.key], 0.0))
                ref = Reference(
                    f"published {spec.published_data} ({published['source'].split(' (')[0]})",
                    row.get(field) if field else None,
                    row.get(metric.spread) if metric.spread else None,
                    spec.published_data,
                )
                note = "collapsed (KL < 1 nat)" if left_out and not values else None
                cells[key] = TableCell(tuple(values), (ref,) if field else (), note)
        rows.append(Row(system or spec.extras[method], cells))
    pm = published.get("pm_meaning", "the source prints no ± for this table")
    left_out = (
        f" Left out as collapsed (test KL(q‖p) < {COLLAPSED_KL_NATS:g} nat: the decoder ignores "
        f"z): {', '.join(collapsed)}."
        if collapsed
        else ""
    )
    overstated = (
        f" Importance-sampled NLL not converged (it fell by more than {UNSETTLED_NLL_BITS:g} "
        f"bits/dim from a quarter of the samples to all; these numbers overstate the NLL, more "
        f"importance samples lower them): {', '.join(unsettled)}."
        if unsettled
        else ""
    )
    return ComparisonTable(
        name=file_stem(f"lvm_{experiment}", datasets),
        title=spec.title,
        caption=(
            f"{published['caption_summary']} Reproduced: mean ± standard error over seeds; "
            f"published ±: {pm}.{left_out}{overstated}"
        ),
        metrics=tuple(
            Metric(key, label, spread="se")
            for dim in dims
            for key, label, _ in (column(metric, dim) for metric in spec.metrics)
        ),
        rows=tuple(rows),
        provenance=Provenance(profile, datasets),
        sources=(published["source"],),
    )
