"""DVC stage ``evaluate_ape``: beam-search post-editing of the real set's dev/test splits, TER
and tokenized BLEU.

Each grid cell is a Ray task: load the trained APE model (the mean of its last
``ape.decode.average_last`` saves), post-edit ``src [SEP] mt`` of every split of
``ape.evaluate`` with batched beam search, merge the WordPieces and score against pe as the WMT
APE shared tasks do: TER case-sensitive on tokenized text (tercom ``-s``; sacreBLEU's default
lowercases, which stops case errors from counting and gives lower numbers) and tokenized BLEU
(multi-bleu.perl), both with their sacreBLEU signatures. The "do nothing" baseline (mt scored
against pe) is scored for every split. A cell whose model, data, settings and code are
unchanged is not decoded again. The scores are also logged on the MLflow run that trained the
cell's model (``<split>/ter``, ...), next to its params and curves.

Outputs: ``results/evaluate_ape/cells/<cell>/<split>.txt`` and ``metrics.json``;
``results/evaluate_ape/scores.json`` (every cell's TER/BLEU per split, the do-nothing baseline
and the signatures; the claims and tables stages read it) and ``metrics.json`` (DVC metrics: TER
and BLEU per regime, system and split, means over seeds, and the do-nothing baseline).
"""

from __future__ import annotations

import logging
from pathlib import Path

from learnable_sparsity.ape.grid import ApeSettings
from learnable_sparsity.ape.model import detokenize
from learnable_sparsity.data.local import read_triplets
from learnable_sparsity.files import atomic_write_text
from learnable_sparsity.metrics.translation import ape_metrics
from learnable_sparsity.nmt.search import DecodeSettings, translate
from learnable_sparsity.settings import build, params_of
from pipelines.cells.ape import (
    ape_cells,
    encode_triplets,
    fit_positions,
    require_data,
    trained_model,
)
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid
from pipelines.scaffold.files import write_json
from pipelines.scaffold.metrics import cell_metrics
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "evaluate_ape"
log = logging.getLogger(__name__)


def evaluate_cell(run: CellRun) -> dict:
    """Ray task: post-edit every evaluated split with one cell's model and score it."""
    decode = build(DecodeSettings, run.payload["decode"], "ape.decode")
    cell, model, tokenizer = trained_model(run, decode.average_last)
    model = model.to(run.device)
    splits = read_triplets(Path(run.payload["data"]["real"]), run.payload["splits"])
    metrics = {}
    for split, triplets in splits.items():
        sep, limit = tokenizer.sep_token_id, model.config.max_positions
        sources = [fit_positions(j, sep, limit) for j, _ in encode_triplets(tokenizer, triplets)]
        progress = f"{cell.key} {split}: %d/{len(sources)} post-edited"
        tokens = translate(
            model, sources, decode, on_batch=lambda done, p=progress: log.info(p, done)
        )
        hypotheses = [detokenize(tokenizer, sentence) for sentence in tokens]
        atomic_write_text(run.directory / f"{split}.txt", "\n".join(hypotheses) + "\n")
        metrics[split] = ape_metrics(hypotheses, [pe for _, _, pe in triplets])
        run.log_metrics({f"{split}_{k}": v["score"] for k, v in metrics[split].items()}, step=0)
    write_json(run.directory / "metrics.json", metrics)
    run.run.log_dict(metrics, "metrics.json")
    return metrics


def grid(stage: Stage) -> Grid:
    """The grid: the evaluated splits of each trained cell, post-edited and scored."""
    ape = stage.settings("ape", ApeSettings)
    require_data(ape)
    shared = {"decode": params_of(ape.decode), "splits": list(ape.evaluate)}
    cells = ape_cells(ape, ape.evaluate, shared, reads_model=True)
    return Grid(evaluate_cell, cells, layout.cells(STAGE))


def main(stage: Stage) -> None:
    ape = stage.settings("ape", ApeSettings)
    results = stage.run_grid(grid(stage))
    real = read_triplets(Path(ape.data["real"]), ape.evaluate)
    do_nothing = {
        split: ape_metrics([mt for _, mt, _ in rows], [pe for _, _, pe in rows])
        for split, rows in real.items()
    }
    scores = {
        "data": ape.data["real"],
        "cells": {
            key: {split: scalars(metrics) for split, metrics in result.items()}
            for key, result in results.items()
        },
        "do_nothing": {split: scalars(metrics) for split, metrics in do_nothing.items()},
        "signatures": {name: m["signature"] for name, m in next(iter(do_nothing.values())).items()},
    }
    stage.write_json(layout.APE_SCORES, scores, artifact="")
    stage.write_metrics(ape_metrics_summary(scores))
    stage.annotate_training_runs("train_ape", layout.APE_MODELS, by_cell(scores))


def by_cell(scores: dict) -> dict[str, dict[str, float]]:
    """Each cell's scores as ``<split>/<metric>``."""
    return {
        key: {f"{split}/{name}": value for split, m in splits.items() for name, value in m.items()}
        for key, splits in scores["cells"].items()
    }


def ape_metrics_summary(scores: dict) -> dict:
    """TER and BLEU per regime, system and split (means over seeds), and the do-nothing ones."""
    return {**cell_metrics(by_cell(scores)), "do_nothing": scores["do_nothing"]}


def scalars(metrics: dict) -> dict[str, float]:
    return {name: float(value["score"]) for name, value in metrics.items()}


if __name__ == "__main__":
    run_stage(STAGE, main)
