"""Figures: each function returns a Figure with the expected panels and lines/bars."""

from __future__ import annotations

import io

import pytest
import torch
from matplotlib.figure import Figure

from learnable_sparsity.analysis.figures import (
    FLAGGED_LABEL,
    alpha_histograms,
    alpha_trajectory_figures,
    attention_heatmaps,
    density_distributions,
    head_colours,
    js_per_layer,
)
from learnable_sparsity.errors import LearnableSparsityError

KINDS = ("encoder.self", "decoder.context", "decoder.self")
LAYERS, HEADS = 2, 3


def alphas_at(step: int) -> dict[str, list[float]]:
    return {
        f"{kind}.layer{layer}": [1.5 + 0.01 * step * (head - 1) for head in range(HEADS)]
        for kind in KINDS
        for layer in range(LAYERS)
    }


def fake_result(scale: float) -> dict:
    blocks = {
        f"{kind}.layer{layer}": {
            "attention": kind,
            "layer": layer,
            "js": scale * (layer + 1) / 4,
            "density": [scale] * HEADS,
        }
        for kind in KINDS
        for layer in range(LAYERS)
    }
    densities = {kind: [scale] * (LAYERS * HEADS) for kind in KINDS}
    return {"blocks": blocks, "densities": densities}


def legend_outside_the_panels(fig: Figure) -> list[str]:
    """The labels of the figure's one legend, after checking that it lies inside the figure
    and overlaps no panel (no axes has a legend of its own)."""
    fig.draw_without_rendering()
    assert all(ax.get_legend() is None for ax in fig.axes)
    [legend] = fig.legends
    box = legend.get_window_extent()
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
    assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    return [text.get_text() for text in legend.get_texts()]


def test_alpha_trajectories_one_figure_per_type_one_line_per_head() -> None:
    history = [{"step": s, "alphas": alphas_at(s)} for s in (10, 20, 30)]
    figures = alpha_trajectory_figures(history, flagged=[("encoder.self.layer1", 2)])
    assert list(figures) == list(KINDS)
    heads = [f"head {h}" for h in range(HEADS)]
    for kind, fig in figures.items():
        assert isinstance(fig, Figure)
        assert len(fig.axes) == LAYERS
        assert all(len(ax.get_lines()) == HEADS for ax in fig.axes)
        flagged = [FLAGGED_LABEL] if kind == "encoder.self" else []
        assert legend_outside_the_panels(fig) == heads + flagged
    fig.savefig(io.BytesIO(), format="png")  # renders without pyplot


def test_alpha_trajectories_one_colour_per_head_thick_when_flagged() -> None:
    history = [{"step": s, "alphas": alphas_at(s)} for s in (10, 20, 30)]
    fig = alpha_trajectory_figures(history, flagged=[("encoder.self.layer1", 2)])["encoder.self"]
    colours = [[line.get_color() for line in ax.get_lines()] for ax in fig.axes]
    assert len(set(colours[0])) == HEADS  # every head its own colour…
    assert colours[0] == colours[1]  # …the same in every panel
    assert [line.get_label() for line in fig.axes[0].get_lines()] == [
        f"head {h}" for h in range(HEADS)
    ]
    widths = [[line.get_linewidth() for line in ax.get_lines()] for ax in fig.axes]
    assert len(set(widths[0])) == 1
    assert widths[1][2] > widths[1][0] == widths[1][1]


@pytest.mark.parametrize("n_heads", [4, 10, 16, 32])
def test_head_colours_are_distinct(n_heads: int) -> None:
    assert len(set(head_colours(n_heads))) == n_heads


def test_alpha_histograms_per_type_and_layer() -> None:
    fig = alpha_histograms({k: torch.tensor(v) for k, v in alphas_at(30).items()})
    assert len(fig.axes) == len(KINDS) * (LAYERS + 1)
    pooled = fig.axes[0]
    assert sum(p.get_height() for p in pooled.patches) == LAYERS * HEADS
    with pytest.raises(LearnableSparsityError, match="at least one"):
        alpha_histograms({})


def test_js_grouped_bars_per_variant() -> None:
    variants = {"softmax": fake_result(1.0), "1.5-entmax": fake_result(0.5), "α": fake_result(0.2)}
    fig = js_per_layer(variants)
    assert len(fig.axes) == len(KINDS)
    for ax in fig.axes:
        assert len(ax.containers) == len(variants)
        assert all(len(bars) == LAYERS for bars in ax.containers)
    assert [bar.get_height() for bar in fig.axes[0].containers[1]] == [0.125, 0.25]
    assert legend_outside_the_panels(fig) == list(variants)


def test_density_distributions_one_outline_per_variant() -> None:
    fig = density_distributions({"softmax": fake_result(1.0), "α-entmax": fake_result(0.3)})
    assert len(fig.axes) == len(KINDS)
    assert all(len(ax.patches) == 2 for ax in fig.axes)
    assert legend_outside_the_panels(fig) == ["softmax", "α-entmax"]


def test_attention_heatmaps_label_the_tokens() -> None:
    queries, keys = ["who", "saw", "?"], ["who", "saw", "it", "?"]
    maps = {f"head {h}": torch.softmax(torch.randn(3, 4), -1) for h in range(2)}
    fig = attention_heatmaps(maps, queries, keys)
    assert len(fig.axes) == 3  # two heat maps and the colour bar
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == keys
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == queries
    with pytest.raises(LearnableSparsityError, match=r"\(3, 4\)"):
        attention_heatmaps({"bad": torch.ones(3, 4)}, keys, queries)
