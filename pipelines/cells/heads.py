"""The cells of ``analyze_heads``: the Ray task that analyses one trained NMT model, and the
numbers the stage makes of each cell's summary (for its DVC metrics, its JS plot and the MLflow
runs). Not a stage: ``analyze_heads`` builds the grid and writes the outputs.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

from learnable_sparsity.analysis.blocks import split_block
from learnable_sparsity.analysis.cell_analysis import analyze_model
from learnable_sparsity.analysis.heads import AnalysisSettings
from learnable_sparsity.data.corpora import corpus_settings, source_language
from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.files import atomic_write_bytes
from learnable_sparsity.settings import build
from pipelines.cells.nmt import open_cell, trained_model
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, done_record
from pipelines.scaffold.files import png, read_json, write_json
from pipelines.scaffold.metrics import split_seed
from pipelines.scaffold.plots import RUN, SERIES, long_csv
from pipelines.scaffold.tracking.runs import metric_name

FIGURES = "figures"  # a cell's figures, in its directory
ANNOTATION = "analysis"  # the artifact folder of a cell's figures on its runs


def analyze_cell(run: CellRun) -> dict:
    """Ray task: the head analysis and the figures of one trained cell (in ``figures/`` of its
    directory; their names in its result)."""
    cell, config, bpe = open_cell(run)
    settings = build(AnalysisSettings, run.payload["analysis"], "analysis")
    valid = read_corpus(layout.corpus_dir(cell.corpus), ("valid",))["valid"]
    model = trained_model(cell, config, run.payload["average_last"])
    language = run.payload["source_languages"][cell.corpus]
    trained = done_record(layout.NMT_MODELS, cell.key)
    history = trained["result"]["history"]["alphas"]
    result, drawn = analyze_model(model, bpe, valid, settings, language, history)
    paths = [
        atomic_write_bytes(run.directory / FIGURES / f"{name}.png", png(figure))
        for name, figure in drawn.items()
    ]
    # Also on the model's training run, which the stage annotates (ANNOTATION).
    run.run.log_metrics(analysis_metrics(result["summary"]), step=0)
    run.run.flush()
    for path in paths:
        run.run.log_artifact(path, ANNOTATION)
    result["figures"] = [path.name for path in paths]
    write_json(run.directory / "analysis.json", result)
    return result


def analysis_metrics(summary: dict) -> dict[str, float]:
    """The MLflow metrics of a cell's summary: JS and mean density per layer."""
    scalars = {f"analysis/js/{k}": v for k, v in summary["js"].items() if v is not None}
    scalars |= {f"analysis/density/{k}": v for k, v in summary["mean_density"].items()}
    return {metric_name(k): v for k, v in scalars.items()}


def cell_figures(directory: Path, result: dict) -> list[Path]:
    """The figure files of the cell in ``directory`` whose task returned ``result``."""
    return [directory / FIGURES / name for name in result["figures"]]


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
