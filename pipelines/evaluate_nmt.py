"""DVC stage ``evaluate_nmt``: beam-search translation of each corpus's test set and BLEU.

Each grid cell is a Ray task: load the trained weights (or the average of the last
``nmt.decode.average_last`` checkpoints), translate the test set with batched beam search,
detokenize the BPE, and score with sacreBLEU (detokenized BLEU with its signature, tokenized BLEU
as the papers reported it, chrF). A copy-the-source baseline is scored per corpus for scale.

Outputs: ``results/evaluate_nmt/cells/<cell>/translations.txt`` and ``metrics.json``;
``results/evaluate_nmt/bleu.json`` (DVC metrics: every cell and the copy baselines).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict
from pathlib import Path

from components.data.atomic import atomic_write_text
from components.data.bpe import BpeModel
from components.errors import LearnableSparsityError
from components.metrics.translation import translation_metrics
from components.nmt.search import beam_search
from components.nmt.trainer import collate_examples, load_weights
from pipelines import nmt_grid, tracking
from pipelines.corpora import OUT as CORPORA
from pipelines.io import read_corpus, write_json
from pipelines.nmt_grid import Cell
from pipelines.params import load_params
from pipelines.runner import run_params_grid, task_resources

STAGE = "evaluate_nmt"
RESULTS = Path("results/evaluate_nmt")
log = logging.getLogger(__name__)


def evaluate_cell(task: dict) -> dict:
    """Ray task: translate the test set of one cell and score it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    cell, decode = Cell(**task["cell"]), task["decode"]
    bpe = BpeModel(cell.bpe_model)
    test = read_corpus(cell.corpus_dir)["test"]
    examples = nmt_grid.encode(bpe, test)
    device = nmt_grid.device(task["num_gpus"])
    model = nmt_grid.build_model(task["model"], cell.variant, bpe.vocab_size)
    model.load_state_dict(load_weights(cell.checkpoint_dir, decode["average_last"]))
    model.to(device).eval()
    hypotheses: list[str] = []
    batch_size = decode["batch_sentences"]
    with tracking.RunLogger(task["mlflow_uri"], task["run_id"]) as run:
        for start in range(0, len(examples), batch_size):
            indices = range(start, min(start + batch_size, len(examples)))
            batch = collate_examples(examples, list(indices), model)
            output = beam_search(
                model,
                batch.src.to(device),
                beam_size=decode["beam_size"],
                alpha=decode["length_penalty"],
                max_len_a=decode["max_len_a"],
                max_len_b=decode["max_len_b"],
            )
            hypotheses += [bpe.decode(tokens) for tokens in output.tokens]
            log.info("%s: translated %d/%d", cell.key, len(hypotheses), len(examples))
        metrics = translation_metrics(hypotheses, [target for _, target in test])
        run.log_metrics(_scalars(metrics), step=0)
        run.log_dict(metrics, "metrics.json")
        run.log_dict({"translations": hypotheses}, "translations.json")
    return {"key": cell.key, "metrics": metrics, "translations": hypotheses}


def _scalars(metrics: dict) -> dict[str, float]:
    return {name: float(value["score"]) for name, value in metrics.items()}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    cells = nmt_grid.grid(params)
    resources = task_resources(params)
    decode = params.get("nmt.decode", dict)
    for key in ("beam_size", "batch_sentences", "average_last", "max_len_b"):
        if params.get(f"nmt.decode.{key}", int) < 1:
            raise LearnableSparsityError(f"{params.source}: nmt.decode.{key} must be >= 1")
    uri = tracking.tracking_uri(Path.cwd())
    experiment = params.get("mlflow.experiment", str)
    tracking.prepare(uri, experiment)
    with tracking.stage_run(uri, experiment, STAGE, {"nmt": params.get("nmt", dict)}) as stage:
        tasks = [
            {
                "cell": asdict(cell),
                "model": params.get("nmt.model", dict),
                "decode": decode,
                "num_gpus": resources.num_gpus,
                "mlflow_uri": uri,
                "run_id": stage.child(cell.key, {"cell": asdict(cell), "decode": decode}),
            }
            for cell in cells
        ]
        results = run_params_grid(evaluate_cell, tasks, params, STAGE)
        shutil.rmtree(RESULTS / "cells", ignore_errors=True)
        for result in results:
            directory = RESULTS / "cells" / result["key"]
            atomic_write_text(
                directory / "translations.txt", "\n".join(result["translations"]) + "\n"
            )
            write_json(directory / "metrics.json", result["metrics"])
        copy_baseline = {}
        for corpus in sorted({cell.corpus for cell in cells}):
            test = read_corpus(CORPORA / corpus)["test"]
            copy_baseline[corpus] = translation_metrics([s for s, _ in test], [t for _, t in test])
        summary = {
            "cells": {r["key"]: _scalars(r["metrics"]) for r in results},
            "copy_source_baseline": {c: _scalars(m) for c, m in copy_baseline.items()},
            "signatures": {
                name: value["signature"] for name, value in results[0]["metrics"].items()
            },
        }
        write_json(RESULTS / "bleu.json", summary)
        stage.log_artifact(RESULTS / "bleu.json")


if __name__ == "__main__":
    main()
