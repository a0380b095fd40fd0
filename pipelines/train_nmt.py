"""DVC stage ``train_nmt``: one Transformer per grid cell (corpus × attention variant × seed).

Cells run as Ray tasks (``ray`` params: local CPUs or a cluster, CPUs/GPUs per task). Each task
trains with checkpoints in ``models/nmt/<corpus>/<variant>/seed<k>/`` (resumed after an
interruption) and logs its step metrics and every head's α to its own MLflow child run. A cell
whose settings and data are unchanged since it finished is reused, not retrained, so changing one
cell of the grid retrains only that cell.

Outputs (written by the driver, atomically): ``results/train_nmt/cells/<cell>/history.json``
(train/valid curves and α trajectory), ``results/train_nmt/alpha_trajectories.json``,
``results/train_nmt/summary.json`` (DVC metrics) and the DVC plots ``train_loss.csv`` /
``valid_nll.csv`` (one column per cell).
"""

from __future__ import annotations

import csv
import io
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from components.data.atomic import atomic_write_text
from components.data.bpe import BpeModel
from components.nmt.trainer import TrainingSettings, train
from pipelines import nmt_grid, tracking
from pipelines.io import code_digest, fingerprint, read_corpus, read_json, write_json
from pipelines.nmt_grid import Cell
from pipelines.params import load_params
from pipelines.runner import run_params_grid, task_resources

STAGE = "train_nmt"
RESULTS = Path("results/train_nmt")
DONE = "done.json"
log = logging.getLogger(__name__)


def train_cell(task: dict) -> dict:
    """Ray task: train one cell; returns its summary and history (also kept in ``done.json``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
    cell = Cell(**task["cell"])
    bpe = BpeModel(cell.bpe_model)
    corpus = read_corpus(cell.corpus_dir)
    train_set = nmt_grid.encode(bpe, corpus["train"])
    valid_set = nmt_grid.encode(bpe, corpus["valid"])
    torch.manual_seed(cell.seed)
    device = nmt_grid.device(task["num_gpus"])
    model = nmt_grid.build_model(task["model"], cell.variant, bpe.vocab_size).to(device)
    settings = TrainingSettings(**task["train"], seed=cell.seed)
    with tracking.RunLogger(task["mlflow_uri"], task["run_id"]) as run:
        start = time.perf_counter()
        history = train(
            model,
            train_set,
            valid_set,
            settings,
            checkpoint_dir=cell.checkpoint_dir,
            variant=cell.key,
            on_log=lambda step, metrics: run.log_metrics(
                {tracking.metric_name(k): v for k, v in metrics.items()}, step
            ),
        )
        seconds = time.perf_counter() - start
        speeds = [row["tokens_per_second"] for row in history.train]
        summary = {
            "steps": settings.max_steps,
            "final_train_loss": history.train[-1]["loss"],
            "final_valid_nll": history.valid[-1]["valid_nll"],
            "train_seconds_this_run": seconds,
            "mean_tokens_per_second": sum(speeds) / len(speeds),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        if history.alphas:
            summary["final_alphas"] = history.alphas[-1]["alphas"]
        run.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)}, step=0)
        run.log_dict(asdict(history), "history.json")
    result = {
        "key": cell.key,
        "summary": summary,
        "history": asdict(history),
        "mlflow_run_id": task["run_id"],
    }
    write_json(cell.checkpoint_dir / DONE, {"fingerprint": task["fingerprint"], **result})
    return result


def _curves(results: list[dict], part: str, column: str) -> str:
    """A wide CSV: step, then one column per cell (empty where a cell has no value)."""
    by_step: dict[int, dict[str, float]] = {}
    for result in results:
        for row in result["history"][part]:
            by_step.setdefault(row["step"], {})[result["key"]] = row[column]
    keys = [result["key"] for result in results]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *keys])
    for step in sorted(by_step):
        writer.writerow([step, *(by_step[step].get(key, "") for key in keys)])
    return out.getvalue()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    params = load_params()
    cells = nmt_grid.grid(params)
    resources = task_resources(params)
    model_params = params.get("nmt.model", dict)
    train_params = params.get("nmt.train", dict)
    params.build("nmt.train", TrainingSettings, seed=0)  # validate before fanning out

    uri = tracking.tracking_uri(Path.cwd())
    experiment = params.get("mlflow.experiment", str)
    tracking.prepare(uri, experiment)
    stage_params = {"nmt": params.get("nmt", dict), "ray": params.get("ray", dict)}
    with tracking.stage_run(uri, experiment, STAGE, stage_params) as stage:
        tasks, reused = [], []
        for cell in cells:
            digest = fingerprint(
                model_params,
                train_params,
                asdict(cell),
                nmt_grid.data_digest(cell),
                code_digest(nmt_grid.MODEL_CODE),
            )
            done = cell.checkpoint_dir / DONE
            if done.exists() and read_json(done)["fingerprint"] == digest:
                reused.append(read_json(done))
                continue
            marker = cell.checkpoint_dir / "fingerprint.json"
            if marker.exists() and read_json(marker)["fingerprint"] != digest:
                log.info("%s: settings or data changed, training from scratch", cell.key)
                shutil.rmtree(cell.checkpoint_dir)
            write_json(marker, {"fingerprint": digest})
            run_id = stage.child(cell.key, {"cell": asdict(cell), **stage_params["nmt"]})
            tasks.append(
                {
                    "cell": asdict(cell),
                    "model": model_params,
                    "train": train_params,
                    "fingerprint": digest,
                    "num_gpus": resources.num_gpus,
                    "mlflow_uri": uri,
                    "run_id": run_id,
                }
            )
        log.info("%d cells to train, %d reused", len(tasks), len(reused))
        trained = run_params_grid(train_cell, tasks, params, STAGE)
        by_key = {r["key"]: r for r in [*reused, *trained]}
        results = [by_key[cell.key] for cell in cells]
        _remove_stale_models({cell.key for cell in cells})

        shutil.rmtree(RESULTS / "cells", ignore_errors=True)
        for result in results:
            write_json(RESULTS / "cells" / result["key"] / "history.json", result["history"])
        trajectories = {r["key"]: r["history"]["alphas"] for r in results if r["history"]["alphas"]}
        write_json(RESULTS / "alpha_trajectories.json", trajectories)
        summary = {r["key"]: r["summary"] for r in results}
        write_json(RESULTS / "summary.json", summary)
        atomic_write_text(RESULTS / "train_loss.csv", _curves(results, "train", "loss"))
        atomic_write_text(RESULTS / "valid_nll.csv", _curves(results, "valid", "valid_nll"))
        stage.log_artifact(RESULTS / "summary.json")
        stage.set_tags({"cells_trained": str(len(tasks)), "cells_reused": str(len(reused))})


def _remove_stale_models(keys: set[str]) -> None:
    """Delete model directories of cells no longer in the grid (the DVC output is the grid)."""
    for done in nmt_grid.MODELS.glob(f"*/*/*/{DONE}"):
        directory = done.parent
        if str(directory.relative_to(nmt_grid.MODELS)) not in keys:
            shutil.rmtree(directory)


if __name__ == "__main__":
    main()
