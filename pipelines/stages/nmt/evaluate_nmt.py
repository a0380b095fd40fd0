"""DVC stage ``evaluate_nmt``: beam-search translation of each corpus's test set and BLEU.

Each grid cell is a Ray task: load the trained weights (or the average of the last
``nmt.decode.average_last`` checkpoints), translate the test set with batched beam search,
detokenize the BPE and score with sacreBLEU (detokenized BLEU with its signature; tokenized BLEU
as the papers reported it, meaningful on pre-tokenised text only; chrF) and count the empty
hypotheses (the decoder emitted eos at once). A copy-the-source baseline is scored per corpus for
scale. A cell whose model, data, settings and code are unchanged is not translated again.
The scores, and the speed stage's tokens/s of the cell's variant, are also logged on the MLflow
run that trained the cell's model: one row of the runs table has its params, curves and scores.

Outputs: ``results/evaluate_nmt/cells/<cell>/translations.txt`` and ``metrics.json``;
``results/evaluate_nmt/bleu.json`` (every cell's scores and ``empty_hypotheses``, the copy
baselines and the sacreBLEU signatures; the claims and tables stages read it) and ``metrics.json``
(DVC metrics: BLEU and chrF per variant, the mean and every seed).
"""

from __future__ import annotations

import logging

from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.files import atomic_write_text
from learnable_sparsity.metrics.translation import translation_metrics
from learnable_sparsity.nmt.cell_evaluation import cell_scores, evaluate_model, metric_scores
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.search import DecodeSettings
from learnable_sparsity.settings import build, params_of
from pipelines.cells.nmt import nmt_cells, open_cell, trained_model
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid
from pipelines.scaffold.files import read_json, write_json
from pipelines.scaffold.metrics import cell_metrics
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "evaluate_nmt"
log = logging.getLogger(__name__)


def evaluate_cell(run: CellRun) -> dict:
    """Ray task: translate the test set of one cell and score it."""
    cell, config, bpe = open_cell(run)
    decode = build(DecodeSettings, run.payload["decode"], "nmt.decode")
    test = read_corpus(layout.corpus_dir(cell.corpus), ("test",))["test"]
    model = trained_model(cell, config, decode.average_last).to(run.device)
    hypotheses, metrics, empty = evaluate_model(
        model,
        bpe,
        test,
        decode,
        on_batch=lambda done: log.info("%s: translated %d/%d", cell.key, done, len(test)),
    )
    if empty:
        log.warning("%s: %d of %d hypotheses are empty", cell.key, empty, len(hypotheses))
    atomic_write_text(run.directory / "translations.txt", "\n".join(hypotheses) + "\n")
    write_json(run.directory / "metrics.json", metrics)
    run.log_metrics({**metric_scores(metrics), "empty_hypotheses": float(empty)}, step=0)
    run.run.log_dict(metrics, "metrics.json")
    run.run.log_artifact(run.directory / "translations.txt")
    return {"metrics": metrics, "empty_hypotheses": empty}


def grid(stage: Stage) -> Grid:
    """The grid: the test set of each trained cell, translated and scored."""
    nmt = stage.settings("nmt", NmtSettings)
    stage.require_entries("nmt.corpora", nmt.corpora, "corpora")
    cells = nmt_cells(nmt, ("test",), {"decode": params_of(nmt.decode)}, reads_model=True)
    return Grid(evaluate_cell, cells, layout.cells(STAGE))


def main(stage: Stage) -> None:
    nmt = stage.settings("nmt", NmtSettings)
    built = grid(stage)
    results = stage.run_grid(built)
    copy_baseline = {}
    for corpus in nmt.corpora:
        test = read_corpus(layout.corpus_dir(corpus), ("test",))["test"]
        baseline = translation_metrics([s for s, _ in test], [t for _, t in test])
        copy_baseline[corpus] = metric_scores(baseline)
    summary = {
        "cells": {
            key: cell_scores(r["metrics"], r["empty_hypotheses"]) for key, r in results.items()
        },
        "copy_source_baseline": copy_baseline,
        "signatures": {
            name: value["signature"]
            for name, value in next(iter(results.values()))["metrics"].items()
        },
    }
    stage.write_json(layout.BLEU, summary, artifact="")
    scores = {key: {"bleu": c["bleu"], "chrf": c["chrf"]} for key, c in summary["cells"].items()}
    stage.write_metrics(cell_metrics(scores, per_seed=("bleu", "chrf")))
    speed = read_json(layout.metrics("speed"))
    on_training_runs = {}
    for cell in built.cells:
        variant = cell.payload["cell"]["variant"]
        on_training_runs[cell.key] = {f"test/{k}": v for k, v in summary["cells"][cell.key].items()}
        on_training_runs[cell.key] |= {f"speed/{k}": v for k, v in speed[variant].items()}
    stage.annotate_training_runs("train_nmt", layout.NMT_MODELS, on_training_runs)


if __name__ == "__main__":
    run_stage(STAGE, main)
