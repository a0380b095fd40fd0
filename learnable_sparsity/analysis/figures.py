"""Figures of the attention-head analyses (Correia et al. 2019, chapter 4).

Every function builds and returns a ``matplotlib.figure.Figure`` without pyplot (no global
state, no GUI backend): ``fig.savefig`` renders it with Agg. Nothing is saved here.
Attention types are "encoder.self", "decoder.context" and "decoder.self"; layers and heads are
0-based as in the block keys of ``Transformer`` (e.g. "encoder.self.layer0").
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import torch
from torch import Tensor

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

from learnable_sparsity.analysis.alpha import alpha_trajectories
from learnable_sparsity.analysis.blocks import ATTENTION_TYPES, split_block
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import Example
from learnable_sparsity.nmt.model import Transformer

TITLES = {
    "encoder.self": "encoder self-attention",
    "decoder.context": "context attention",
    "decoder.self": "decoder self-attention",
}
ColourRGBA = tuple[float, float, float, float]
# Qualitative colormaps for one colour per head, smallest first (name, number of colours); a
# model with more heads samples the continuous MANY_HEADS_COLOURMAP instead.
QUALITATIVE_COLOURMAPS: tuple[tuple[str, int], ...] = (("tab10", 10), ("tab20", 20))
MANY_HEADS_COLOURMAP = "turbo"
HEAD_LINEWIDTH = 1.2
FLAGGED_LINEWIDTH = 3.0  # thick enough to tell a flagged head apart at a glance
FLAGGED_LABEL = "thick: towards softmax, then sparser"
LEGEND_COLUMNS = 5  # entries per row of a legend below the panels
LEGEND_ROW_HEIGHT = 0.25  # inches a figure grows per legend row, so its panels keep their size


def _by_type(keys: Collection[str]) -> dict[str, list[tuple[int, str]]]:
    """Attention type → sorted [(layer, block key)], types in ``ATTENTION_TYPES`` order."""
    grouped: dict[str, list[tuple[int, str]]] = {}
    for key in keys:
        kind, layer = split_block(key)
        grouped.setdefault(kind, []).append((layer, key))
    return {kind: sorted(grouped[kind]) for kind in ATTENTION_TYPES if kind in grouped}


def head_colours(n_heads: int) -> list[ColourRGBA]:
    """One distinct RGBA colour per head index: a qualitative colormap (tab10, then tab20) while
    it has enough colours, else ``n_heads`` samples of a continuous one."""
    for name, size in QUALITATIVE_COLOURMAPS:
        if n_heads <= size:
            return [colormaps[name](head) for head in range(n_heads)]
    return [tuple(c) for c in colormaps[MANY_HEADS_COLOURMAP].resampled(n_heads)(range(n_heads))]


def _legend_rows(entries: int) -> int:
    """Rows of a legend of ``entries`` below the panels (:func:`_legend_below`)."""
    return math.ceil(entries / LEGEND_COLUMNS)


def _variant_handles(axes: Sequence[Axes]) -> list[Artist]:
    """The labelled artists of all panels, one per label (a variant may miss in some panels)."""
    handles: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    return list(handles.values())


def _legend_below(fig: Figure, handles: Sequence[Artist]) -> None:
    """One legend for all panels, below them: outside every axes, so it never covers a bar or a
    line (the constrained layout makes room for it)."""
    fig.legend(
        handles=list(handles),
        loc="outside lower center",
        ncols=min(len(handles), LEGEND_COLUMNS),
        fontsize="small",
    )


def _head_handles(colours: Sequence[ColourRGBA], any_flagged: bool) -> list[Artist]:
    """Legend entries of :func:`alpha_trajectory_figures`: "head h" in its colour, and the
    thick line of a flagged head when a panel has one. Proxies, not the lines of one panel: a
    head flagged there would look flagged in every panel."""
    handles: list[Artist] = [
        Line2D([], [], color=colour, linewidth=HEAD_LINEWIDTH, label=f"head {head}")
        for head, colour in enumerate(colours)
    ]
    if any_flagged:
        handles.append(
            Line2D([], [], color="black", linewidth=FLAGGED_LINEWIDTH, label=FLAGGED_LABEL)
        )
    return handles


def alpha_trajectory_figures(
    history: Sequence[Mapping[str, object]], flagged: Collection[tuple[str, int]] = ()
) -> dict[str, Figure]:
    """α of every head over training: one figure per attention type, one panel per layer.

    ``history`` is the trainer's ``history.alphas`` ([{"step", "alphas": {block: [α]}}]);
    ``flagged`` holds (block key, head) pairs (e.g. those for which ``softmax_then_sparser`` is
    True). Every head has its own colour, the same in every panel, named in a legend below the
    panels ("head 0", …); flagged heads are drawn with a thicker line.
    """
    steps, series = alpha_trajectories(history)
    flagged = set(flagged)
    figures: dict[str, Figure] = {}
    for kind, layers in _by_type(series).items():
        n_heads = max(len(series[key]) for _, key in layers)
        colours = head_colours(n_heads)
        blocks = {key for _, key in layers}
        handles = _head_handles(colours, any(block in blocks for block, _ in flagged))
        height = 3.0 + LEGEND_ROW_HEIGHT * _legend_rows(len(handles))
        fig = Figure(figsize=(3.2 * len(layers), height), layout="constrained")
        axes = fig.subplots(1, len(layers), sharey=True, squeeze=False)[0]
        for ax, (layer, key) in zip(axes, layers, strict=True):
            for head, values in enumerate(series[key]):
                width = FLAGGED_LINEWIDTH if (key, head) in flagged else HEAD_LINEWIDTH
                ax.plot(steps, values, color=colours[head], linewidth=width, label=f"head {head}")
            ax.set_title(f"layer {layer}")
            ax.set_xlabel("step")
        axes[0].set_ylabel("α")
        _legend_below(fig, handles)
        fig.suptitle(f"α trajectories, {TITLES[kind]}")
        figures[kind] = fig
    return figures


def alpha_histograms(alphas: Mapping[str, Sequence[float] | Tensor], bins: int = 20) -> Figure:
    """Histograms of the final α: one row per attention type; column 0 pools all layers, column
    i + 1 shows layer i. ``alphas`` maps block keys to per-head α (e.g. ``model.alphas()``)."""
    grouped = _by_type(alphas)
    if not grouped:
        raise LearnableSparsityError("alpha_histograms needs α of at least one attention block")
    n_layers = max(len(layers) for layers in grouped.values())
    fig = Figure(figsize=(2.4 * (n_layers + 1), 2.2 * len(grouped)), layout="constrained")
    axes = fig.subplots(len(grouped), n_layers + 1, sharex=True, squeeze=False)
    edges = np.linspace(1.0, 2.0, bins + 1)
    for row, (kind, layers) in zip(axes, grouped.items(), strict=True):
        values = {layer: [float(a) for a in alphas[key]] for layer, key in layers}
        row[0].hist([a for v in values.values() for a in v], bins=edges)
        row[0].set_title(f"{TITLES[kind]}, all layers", fontsize="small")
        row[0].set_ylabel("heads")
        for column, (layer, _) in enumerate(layers, start=1):
            row[column].hist(values[layer], bins=edges)
            row[column].set_title(f"layer {layer}", fontsize="small")
        for ax in row[len(layers) + 1 :]:
            ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("α")
    return fig


def js_per_layer(results: Mapping[str, Mapping[str, object]]) -> Figure:
    """Mean Jensen–Shannon head diversity per layer, variants side by side (grouped bars).

    ``results`` maps a variant name (e.g. "softmax", "1.5-entmax", "α-entmax") to its
    ``HeadAnalysis.result()``; one panel per attention type, one bar group per layer (a block
    without queries, whose JS is None, draws a zero bar).
    """
    if not results:
        raise LearnableSparsityError("js_per_layer needs at least one variant")
    kinds = [
        k for k in ATTENTION_TYPES if any(_by_type(r["blocks"]).get(k) for r in results.values())
    ]
    fig = Figure(figsize=(4.0 * len(kinds), 3.0), layout="constrained")
    axes = fig.subplots(1, len(kinds), sharey=True, squeeze=False)[0]
    width = 0.8 / len(results)
    for ax, kind in zip(axes, kinds, strict=True):
        ticks: set[int] = set()
        for v, (variant, result) in enumerate(results.items()):
            layers = _by_type(result["blocks"]).get(kind, [])
            ticks.update(layer for layer, _ in layers)
            x = np.array([layer for layer, _ in layers], dtype=float)
            js = [result["blocks"][key]["js"] or 0.0 for _, key in layers]
            ax.bar(x - 0.4 + (v + 0.5) * width, js, width, label=variant)
        ax.set_xticks(sorted(ticks))
        ax.set_title(TITLES[kind])
        ax.set_xlabel("layer")
    axes[0].set_ylabel("mean JS divergence")
    _legend_below(fig, _variant_handles(axes))
    return fig


def density_distributions(results: Mapping[str, Mapping[str, object]], bins: int = 20) -> Figure:
    """Histograms of per-head attention density, one panel per attention type, one outline per
    variant (``results``: variant name → ``HeadAnalysis.result()``). Softmax is a spike at 1."""
    if not results:
        raise LearnableSparsityError("density_distributions needs at least one variant")
    kinds = [k for k in ATTENTION_TYPES if any(k in r["densities"] for r in results.values())]
    fig = Figure(figsize=(4.0 * len(kinds), 3.0), layout="constrained")
    axes = fig.subplots(1, len(kinds), sharey=True, squeeze=False)[0]
    edges = np.linspace(0.0, 1.0, bins + 1)
    for ax, kind in zip(axes, kinds, strict=True):
        for variant, result in results.items():
            if kind in result["densities"]:
                ax.hist(result["densities"][kind], bins=edges, histtype="step", label=variant)
        ax.set_title(TITLES[kind])
        ax.set_xlabel("density (fraction of tokens attended)")
    axes[0].set_ylabel("heads")
    _legend_below(fig, _variant_handles(axes))
    return fig


def attention_heatmaps(
    maps: Mapping[str, Tensor], query_tokens: Sequence[str], key_tokens: Sequence[str]
) -> Figure:
    """Attention maps of one sentence, one panel per entry of ``maps`` (title → [Q, K] probs,
    e.g. ``attention[block][0, head]`` cut to the sentence), tokens on the axes (queries as
    rows), a shared colour bar on [0, 1]."""
    if not maps:
        raise LearnableSparsityError("attention_heatmaps needs at least one map")
    shape = (len(query_tokens), len(key_tokens))
    fig = Figure(
        figsize=(0.3 * shape[1] * len(maps) + 1.5, 0.3 * shape[0] + 1.5), layout="constrained"
    )
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, (title, probs) in zip(axes, maps.items(), strict=True):
        probs = torch.as_tensor(probs).detach().cpu().double()
        if tuple(probs.shape) != shape:
            raise LearnableSparsityError(
                f"attention map {title!r} has shape {tuple(probs.shape)}, expected {shape} "
                f"(query tokens × key tokens)"
            )
        image = ax.imshow(probs.numpy(), vmin=0.0, vmax=1.0, cmap="Greys")
        ax.set_xticks(range(shape[1]), list(key_tokens), rotation=90)
        ax.set_yticks(range(shape[0]), list(query_tokens))
        ax.set_title(title, fontsize="small")
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    return fig


@torch.no_grad()
def role_heatmaps(
    model: Transformer,
    example: Example,
    pieces: tuple[Sequence[str], Sequence[str]],
    heads: Sequence[Mapping[str, object]],
) -> dict[str, Figure]:
    """Heat maps of ``heads`` (entries of ``learnable_sparsity.analysis.roles.roles``) on one
    sentence pair (ids ``example``, BPE ``pieces``), teacher-forced; one figure per attention
    type."""
    src = torch.tensor([example[0]])
    tgt_in = torch.tensor([[model.config.bos_id, *example[1]]])
    attention: dict[str, Tensor] = {}
    model(src, tgt_in, attention=attention)
    source, target = list(pieces[0]), ["<s>", *pieces[1]]
    axes = {
        "encoder.self": (source, source),
        "decoder.self": (target, target),
        "decoder.context": (target, source),
    }
    maps: dict[str, dict[str, Tensor]] = {}
    for head in heads:
        title = f"{head['role']}: {head['block']} h{head['head']} ({head['score']:.2f})"
        maps.setdefault(head["attention"], {})[title] = attention[head["block"]][0, head["head"]]
    return {kind: attention_heatmaps(m, *axes[kind]) for kind, m in maps.items()}


def report_figures(
    model: Transformer,
    example: Example,
    report: Mapping[str, object],
    history: Sequence[Mapping[str, object]],
    flagged: Collection[tuple[str, int]],
) -> dict[str, Figure]:
    """The figures of one model's head analysis (``learnable_sparsity.analysis.heads.analyze_heads``
    ``report``, drawn on its ``example`` sentence pair): heat maps of the strongest head of each
    role ("heatmaps_<attention type>") and, for α-entmax (a non-empty α ``history``), the α
    trajectories with the ``flagged`` heads ("alpha_trajectories_<attention type>") and the
    histograms of the final α ("alpha_histograms")."""
    drawn = role_heatmaps(model, example, report["pieces"], report["best_heads"])
    made = {f"heatmaps_{kind.replace('.', '_')}": figure for kind, figure in drawn.items()}
    if history:
        for kind, figure in alpha_trajectory_figures(history, flagged).items():
            made[f"alpha_trajectories_{kind.replace('.', '_')}"] = figure
        made["alpha_histograms"] = alpha_histograms(report["alphas"])
    return made
