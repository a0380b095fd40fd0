"""DVC stage ``analyze_heads``: the head analyses of "Adaptively Sparse Transformers".

For every trained NMT cell (a Ray task each), on the validation set with teacher forcing:
attention density per head, Jensen–Shannon head diversity per layer, head-role scores
(positional by argmax share, BPE-merging, interrogation with the question words of the corpus's
source language, read from the settings its ``meta.json`` records), the heads that hold each role
(``analysis.positional_share``, ``analysis.role_threshold``) with the number of queries each role
was measured on (none: "not measurable"), heat maps of the strongest head of each role on a
validation question; from the model's training history the α trajectories (heads that first
move towards softmax and then get sparser are flagged) and the final α per attention type with a
bimodality coefficient (``components.analysis``).

Outputs: ``results/analyze_heads/cells/<cell>/analysis.json``; ``heads.json`` (per cell:
``components.analysis.heads.summary``; the claims and tables stages read it); ``metrics.json``
(DVC metrics: per variant the mean JS overall and per attention type, density, heads with a
role and α per attention type, means over seeds); ``js.csv`` (the long CSV of the DVC plot of
JS per layer); PNG figures under ``reports/figures/heads/<corpus>/seed<seed>/``. A cell's
metrics and figures also go to the MLflow run of the model's training (when that run is in the
tracking store). The α trajectories are plotted by ``train_nmt``, which records them.
"""

from __future__ import annotations

import shutil
from statistics import fmean

from components.analysis import figures
from components.analysis.alpha import flagged_heads
from components.analysis.blocks import split_block
from components.analysis.heads import AnalysisSettings, analyze_heads, summary
from components.data.atomic import atomic_write_bytes
from components.data.corpora import corpus_settings, source_language
from components.data.local import read_corpus
from components.nmt.batching import encode_pairs
from components.nmt.grid import NmtSettings
from components.settings import build, params_of
from pipelines.nmt_cells import nmt_cells, open_cell, trained_model
from pipelines.scaffold import layout, tracking
from pipelines.scaffold.metrics import cell_metrics, split_seed
from pipelines.scaffold.plots import RUN, SERIES, long_csv
from pipelines.scaffold.stage import (
    CellRun,
    Grid,
    Stage,
    clear,
    done_record,
    png,
    read_json,
    run_stage,
    training_run,
    write_json,
)

STAGE = "analyze_heads"
RESULTS = layout.results(STAGE)
FIGURES = layout.figures("heads")
TRAINING_STAGE = "train_nmt"  # whose MLflow run of a model also gets the model's analysis


def analyze_cell(run: CellRun) -> dict:
    """Ray task: the head analysis and the figures of one trained cell."""
    cell, config, bpe = open_cell(run)
    settings = build(AnalysisSettings, run.payload["analysis"], "analysis")
    valid = read_corpus(layout.corpus_dir(cell.corpus), ("valid",))["valid"]
    model = trained_model(cell, config, run.payload["average_last"])
    language = run.payload["source_languages"][cell.corpus]
    report = analyze_heads(model, bpe, valid, settings, language)
    trained = done_record(layout.NMT_MODELS, cell.key)
    history = trained["result"]["history"]["alphas"]
    flagged = flagged_heads(history) if history else []
    example = encode_pairs(bpe, [valid[report["example"]]])[0]
    paths = []
    for name, figure in figures.report_figures(model, example, report, history, flagged).items():
        # Heat maps of all variants share a folder per corpus and seed; α only has α-entmax.
        name = name.replace("heatmaps_", f"heatmaps_{cell.variant}_")
        paths.append(atomic_write_bytes(run.directory / "figures" / f"{name}.png", png(figure)))
    cell_summary = summary(report, flagged)
    scalars = {f"analysis/js/{k}": v for k, v in cell_summary["js"].items() if v is not None}
    scalars |= {f"analysis/density/{k}": v for k, v in cell_summary["mean_density"].items()}
    loggers = [run.run]
    experiment = tracking.experiment_of(run.run.uri, run.run.run_id)
    trained_by = training_run(run.run.uri, experiment, TRAINING_STAGE, layout.NMT_MODELS, cell.key)
    if trained_by is not None:  # the model's training was logged to this store
        loggers.append(trained_by)
    for logger in loggers:
        logger.log_metrics({tracking.metric_name(k): v for k, v in scalars.items()}, step=0)
        logger.flush()
        for path in paths:
            logger.log_artifact(path, "analysis")
    result = {
        "analysis": report["analysis"],
        "source_language": language,
        "roles": report["roles"],
        "alphas": report["alphas"],
        "flagged_heads": flagged,
        "summary": cell_summary,
        "figures": [path.name for path in paths],
    }
    write_json(run.directory / "analysis.json", result)
    return result


def corpus_source_language(corpus: str) -> str | None:
    """The source language of a prepared corpus, from the settings its ``meta.json`` records."""
    meta = read_json(layout.corpus_dir(corpus) / "meta.json")
    return source_language(corpus_settings(meta["source"], f"corpora.{corpus}"))


def head_metrics(summary: dict) -> dict[str, float | None]:
    """The numbers of a cell's summary that runs are compared on (None: not measured): mean JS
    over all layers and per attention type, mean density, heads with a role (measurable roles
    only), mean α per attention type."""
    js = {block: value for block, value in summary["js"].items() if value is not None}
    by_type: dict[str, list[float]] = {}
    for block, value in js.items():
        by_type.setdefault(split_block(block)[0], []).append(value)
    measurable = [role["count"] for role in summary["roles"].values() if role["measurable"]]
    densities = list(summary["mean_density"].values())
    return {
        "js/all": fmean(js.values()) if js else None,
        **{f"js/{_name(kind)}": fmean(values) for kind, values in by_type.items()},
        "density": fmean(densities) if densities else None,
        "heads_with_role": sum(measurable) if measurable else None,
        **{f"alpha/{_name(kind)}": stats["mean"] for kind, stats in summary["alpha"].items()},
    }


def _name(kind: str) -> str:
    """A metric name of an attention type ("encoder_self": a dot would read as nesting)."""
    return kind.replace(".", "_")


def js_csv(summaries: dict[str, dict]) -> str:
    """A long CSV (layer, series: the variant, run: the cell, js) of JS per layer of every cell."""
    rows = [
        {"layer": block, SERIES: split_seed(key)[0], RUN: key, "js": value}
        for key, summary in summaries.items()
        for block, value in summary["js"].items()
        if value is not None
    ]
    return long_csv(rows, ("layer", SERIES, RUN, "js"))


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


def main(stage: Stage) -> None:
    nmt = stage.settings("nmt", NmtSettings)
    results = stage.run_grid(grid(stage))
    clear(FIGURES)
    summaries = {}
    for cell, result in zip(nmt.cells(), results, strict=True):
        figure_dir = FIGURES / cell.corpus / f"seed{cell.seed}"
        for name in result["figures"]:
            figure_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(layout.cells(STAGE) / cell.key / "figures" / name, figure_dir / name)
        summaries[cell.key] = result["summary"]
    for corpus in nmt.corpora:
        for seed in nmt.seeds:
            group = {
                cell.variant: result["analysis"]
                for cell, result in zip(nmt.cells(), results, strict=True)
                if (cell.corpus, cell.seed) == (corpus, seed)
            }
            figure_dir = FIGURES / corpus / f"seed{seed}"
            stage.write_png(figure_dir / "js_per_layer.png", figures.js_per_layer(group))
            stage.write_png(figure_dir / "density.png", figures.density_distributions(group))
            stage.run.log_artifact(figure_dir, f"figures/{corpus}/seed{seed}")
    stage.write_json(layout.HEADS, summaries, artifact="")
    stage.write_metrics(cell_metrics({key: head_metrics(s) for key, s in summaries.items()}))
    stage.write_text(RESULTS / "js.csv", js_csv(summaries))


if __name__ == "__main__":
    run_stage(STAGE, main)
