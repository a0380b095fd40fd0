"""DVC stage ``analyze_heads``: the head analyses of "Adaptively Sparse Transformers".

For every trained NMT cell (a Ray task each), on the validation set with teacher forcing:
attention density per head, Jensen–Shannon head diversity per layer, head-role scores
(positional by argmax share, BPE-merging, interrogation with the question words of the corpus's
source language, read from the settings its ``meta.json`` records), the heads that hold each role
(``analysis.positional_share``, ``analysis.role_threshold``) with the number of queries each role
was measured on (none: "not measurable"), heat maps of the strongest head of each role on a
validation question; from the model's training history the α trajectories (heads that first
move towards softmax and then get sparser are flagged) and the final α per attention type with a
bimodality coefficient (``learnable_sparsity.analysis``).

Outputs: ``results/analyze_heads/cells/<cell>/analysis.json``; ``heads.json`` (per cell:
``learnable_sparsity.analysis.heads.summary``; the claims and tables stages read it);
``metrics.json`` (DVC metrics: per variant the mean JS overall and per attention type, density,
heads with a role and α per attention type, means over seeds); ``js.csv`` (the long CSV of the DVC
plot of JS per layer); PNG figures under ``reports/figures/heads/<corpus>/seed<seed>/``. A cell's
metrics and figures also go to the MLflow run of the model's training (when that run is in the
tracking store). The α trajectories are plotted by ``train_nmt``, which records them.
"""

from __future__ import annotations

from pathlib import Path

from learnable_sparsity.analysis import figures
from learnable_sparsity.analysis.heads import AnalysisSettings
from learnable_sparsity.nmt.cells import NmtCell
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.settings import params_of
from pipelines.cells.heads import (
    ANNOTATION,
    analysis_metrics,
    analyze_cell,
    cell_figures,
    corpus_source_language,
    head_metrics,
    js_csv,
)
from pipelines.cells.nmt import nmt_cells
from pipelines.scaffold import layout
from pipelines.scaffold.cells import Grid
from pipelines.scaffold.files import clear
from pipelines.scaffold.metrics import cell_metrics
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "analyze_heads"
RESULTS = layout.results(STAGE)
FIGURES = layout.figures("heads")
TRAINING_STAGE = "train_nmt"  # whose MLflow run of a model also gets the model's analysis


def grid(stage: Stage) -> Grid:
    """The grid: every trained cell, analysed on its corpus's validation set."""
    nmt = stage.settings("nmt", NmtSettings)
    settings = stage.settings("analysis", AnalysisSettings)
    stage.require_entries("nmt.corpora", nmt.corpora, "corpora")
    shared = {
        "analysis": params_of(settings),
        "average_last": nmt.decode.average_last,
        "source_languages": {corpus: corpus_source_language(corpus) for corpus in nmt.corpora},
    }
    cells = nmt_cells(nmt, ("valid",), shared, reads_model=True)
    return Grid(analyze_cell, cells, layout.cells(STAGE))


def figure_folder(corpus: str, seed: int) -> tuple[Path, str]:
    """Where the figures of ``corpus`` and ``seed`` go, and their artifact folder on the stage's
    run (the folder under its own name, as logging the folder placed them)."""
    return FIGURES / corpus / f"seed{seed}", f"figures/{corpus}/seed{seed}/seed{seed}"


def write_figures(stage: Stage, results: dict[str, dict]) -> None:
    """Per corpus and seed: the figures of every cell, JS per layer and the density
    distributions of all variants."""
    clear(FIGURES)
    groups: dict[tuple[str, int], dict[str, dict]] = {}  # (corpus, seed) → variant → analysis
    for key, result in results.items():
        cell = NmtCell.from_key(key)
        groups.setdefault((cell.corpus, cell.seed), {})[cell.variant] = result["analysis"]
        folder, artifact = figure_folder(cell.corpus, cell.seed)
        for path in cell_figures(layout.cells(STAGE) / key, result):
            stage.copy_file(path, folder / path.name, artifact=artifact)
    for (corpus, seed), group in groups.items():
        folder, artifact = figure_folder(corpus, seed)
        stage.write_png(folder / "js_per_layer.png", figures.js_per_layer(group), artifact=artifact)
        stage.write_png(
            folder / "density.png", figures.density_distributions(group), artifact=artifact
        )


def main(stage: Stage) -> None:
    results = stage.run_grid(grid(stage))
    write_figures(stage, results)
    summaries = {key: result["summary"] for key, result in results.items()}
    stage.write_json(layout.HEADS, summaries, artifact="")
    stage.write_metrics(cell_metrics({key: head_metrics(s) for key, s in summaries.items()}))
    stage.write_text(RESULTS / "js.csv", js_csv(summaries))
    stage.annotate_training_runs(
        TRAINING_STAGE,
        layout.NMT_MODELS,
        {key: analysis_metrics(s) for key, s in summaries.items()},
        files={key: cell_figures(layout.cells(STAGE) / key, r) for key, r in results.items()},
        artifact=ANNOTATION,
    )


if __name__ == "__main__":
    run_stage(STAGE, main)
