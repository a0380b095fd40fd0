"""The head analysis of one trained NMT grid cell's model, without paths or tracking: the stage
``analyze_heads`` runs it in Ray tasks, the prepared GPU run of the AST grid
(``pipelines/commands/ast_grid.py``) in plain processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from learnable_sparsity.extras import needs_extra

with needs_extra("pipeline", __name__):
    from matplotlib.figure import Figure

from learnable_sparsity.analysis import figures
from learnable_sparsity.analysis.alpha import flagged_heads
from learnable_sparsity.analysis.heads import AnalysisSettings, analyze_heads, summary
from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.nmt.batching import encode_pairs
from learnable_sparsity.nmt.model import Transformer


def analyze_model(
    model: Transformer,
    bpe: BpeModel,
    valid: Sequence[tuple[str, str]],
    settings: AnalysisSettings,
    source_language: str | None,
    alpha_history: Sequence[Mapping[str, object]],
) -> tuple[dict[str, object], dict[str, Figure]]:
    """The head analysis of a trained model on ``valid`` (whose source side is in
    ``source_language``) with its training's α trajectory ``alpha_history`` (empty unless
    α-entmax): the result (analysis, roles, α, the flagged heads, the summary the claims read)
    and its figures by name (heat maps named by the model's normalizer)."""
    report = analyze_heads(model, bpe, valid, settings, source_language)
    flagged = flagged_heads(alpha_history) if alpha_history else []
    example = encode_pairs(bpe, [valid[report["example"]]])[0]
    drawn = figures.report_figures(model, example, report, alpha_history, flagged)
    variant = model.config.normalizer
    # Heat maps of all variants share a folder per corpus and seed; α only has α-entmax.
    named = {name.replace("heatmaps_", f"heatmaps_{variant}_"): fig for name, fig in drawn.items()}
    result = {
        "analysis": report["analysis"],
        "source_language": source_language,
        "roles": report["roles"],
        "alphas": report["alphas"],
        "flagged_heads": flagged,
        "summary": summary(report, flagged),
    }
    return result, named
