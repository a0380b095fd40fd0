"""DVC stage ``train_ape``: one APE model per grid cell (data regime × system × seed).

A system is a BERT encoder-decoder of Correia & Martins (2019) with its initialisation and
parameter-sharing flags (Table 3.1), or a baseline (BERT encoder + random Transformer decoder,
a Transformer from scratch, the dual-source Transformer); a regime is its training data (the
low-resource real triplets, or those oversampled plus the synthetic set: Table 3.2). Cells run
as Ray tasks with the project's NMT training loop (label-smoothed cross-entropy, checkpoints,
resume) and are reused while their settings, data and code are unchanged.

Outputs: ``models/ape/<regime>/<system>/seed<k>/`` (checkpoints), ``results/train_ape/summary.json``
(every cell's data sizes and final losses), ``metrics.json`` (DVC metrics: the final validation
NLL per system, mean over seeds) and ``valid_nll.csv`` (the long CSV of its DVC plot).
"""

from __future__ import annotations

import torch

from learnable_sparsity.ape.grid import ApeSettings
from learnable_sparsity.nmt.training import TrainingSettings
from learnable_sparsity.precision import check_precision
from learnable_sparsity.settings import build, params_of
from pipelines.cells.ape import ape_cells, open_cell, require_data, training_examples
from pipelines.cells.nmt import train_in_cell
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid
from pipelines.scaffold.metrics import cell_metrics
from pipelines.scaffold.plots import curves_csv
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "train_ape"
RESULTS = layout.results(STAGE)


def train_cell(run: CellRun) -> dict:
    """Ray task: train one cell; its summary and validation curve."""
    seed = run.payload["cell"]["seed"]
    settings = build(TrainingSettings, run.payload["train"], "ape.train", seed=seed)
    check_precision(settings.precision, run.device, "ape.train.precision")
    torch.manual_seed(seed)
    _, model, tokenizer = open_cell(run)
    train_set, valid_set, counts = training_examples(run, tokenizer, model.config.max_positions)
    history, summary = train_in_cell(run, model.to(run.device), train_set, valid_set, settings)
    return {"summary": {**counts, **summary}, "valid": history.valid}


def grid(stage: Stage) -> Grid:
    """The grid: an APE model per cell, its checkpoints in ``models/ape/<cell>``."""
    ape = stage.settings("ape", ApeSettings)
    require_data(ape)
    cells = ape_cells(ape, ("train", "valid"), {"train": params_of(ape.train)})
    return Grid(train_cell, cells, layout.APE_MODELS)


def main(stage: Stage) -> None:
    results = stage.run_grid(grid(stage))
    summary = {key: result["summary"] for key, result in results.items()}
    stage.write_json(RESULTS / "summary.json", summary, artifact="")
    stage.write_metrics(
        cell_metrics({key: {"valid_nll": cell["final_valid_nll"]} for key, cell in summary.items()})
    )
    stage.write_text(layout.APE_VALID_NLL, curves_csv(results, "valid", "valid_nll"))


if __name__ == "__main__":
    run_stage(STAGE, main)
