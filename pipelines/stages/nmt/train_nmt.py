"""DVC stage ``train_nmt``: one Transformer per grid cell (corpus × attention variant × seed).

Cells run as Ray tasks; each trains with checkpoints in ``models/nmt/<corpus>/<variant>/seed<k>/``
(resumed after an interruption) and logs its step metrics and every head's α to its MLflow child
run. A cell whose settings, data and code are unchanged since it finished is reused, so changing
one cell of the grid retrains only that cell.

Outputs: ``results/train_nmt/cells/<cell>/history.json`` (train/valid curves, α trajectory),
``alpha_trajectories.json``, ``summary.json`` (every cell's final numbers), ``metrics.json`` (DVC
metrics: the final validation NLL per variant) and the long CSVs of the DVC plots
``train_loss.csv``, ``valid_nll.csv`` and ``alpha.csv`` (every head's α, a panel per block).
Wall-clock numbers (tokens/s, the cell's ``task_seconds``) go to MLflow only, so identical
settings give identical files.
"""

from __future__ import annotations

from dataclasses import asdict

from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.nmt.batching import encode_pairs
from learnable_sparsity.nmt.cell_training import initial_model
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.training import TrainingSettings
from learnable_sparsity.settings import build, params_of
from pipelines.cells.nmt import nmt_cells, open_cell, train_in_cell
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid
from pipelines.scaffold.files import clear
from pipelines.scaffold.metrics import cell_metrics
from pipelines.scaffold.plots import FACET, RUN, SERIES, curves_csv, long_csv
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "train_nmt"
RESULTS = layout.results(STAGE)


def train_cell(run: CellRun) -> dict:
    """Ray task: train one cell; its summary and history."""
    cell, config, bpe = open_cell(run)
    settings = build(TrainingSettings, run.payload["train"], "nmt.train", seed=cell.seed)
    corpus = read_corpus(layout.corpus_dir(cell.corpus), ("train", "valid"))
    train_set, valid_set = (encode_pairs(bpe, corpus[split]) for split in ("train", "valid"))
    model = initial_model(cell, config, run.device)
    history, summary = train_in_cell(run, model, train_set, valid_set, settings)
    run.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)}, step=0)
    run.run.log_dict(asdict(history), "history.json")
    return {"summary": summary, "history": asdict(history)}


def grid(stage: Stage) -> Grid:
    """The grid: a Transformer per cell, its checkpoints in ``models/nmt/<cell>``."""
    nmt = stage.settings("nmt", NmtSettings)
    stage.require_entries("nmt.corpora", nmt.corpora, "corpora")
    cells = nmt_cells(nmt, ("train", "valid"), {"train": params_of(nmt.train)})
    return Grid(train_cell, cells, layout.NMT_MODELS)


def main(stage: Stage) -> None:
    results = stage.run_grid(grid(stage))
    histories = {key: result["history"] for key, result in results.items()}
    clear(layout.NMT_HISTORIES)
    for key, history in histories.items():
        stage.write_json(layout.nmt_history(key), history)
    alphas = {key: history["alphas"] for key, history in histories.items() if history["alphas"]}
    stage.write_json(layout.ALPHA_TRAJECTORIES, alphas)
    summary = {key: result["summary"] for key, result in results.items()}
    stage.write_json(RESULTS / "summary.json", summary, artifact="")
    stage.write_metrics(
        cell_metrics({key: {"valid_nll": cell["final_valid_nll"]} for key, cell in summary.items()})
    )
    stage.write_text(RESULTS / "train_loss.csv", curves_csv(histories, "train", "loss"))
    stage.write_text(RESULTS / "valid_nll.csv", curves_csv(histories, "valid", "valid_nll"))
    stage.write_text(RESULTS / "alpha.csv", alpha_csv(alphas))


def alpha_csv(trajectories: dict[str, list[dict]]) -> str:
    """A long CSV (step, facet: the block, series: the head, run: the cell, alpha) of the α
    trajectory of every head of every α-entmax cell."""
    rows = [
        {"step": entry["step"], FACET: block, SERIES: f"head{head}", RUN: key, "alpha": alpha}
        for key, trajectory in trajectories.items()
        for entry in trajectory
        for block, alphas in entry["alphas"].items()
        for head, alpha in enumerate(alphas)
    ]
    return long_csv(rows, ("step", FACET, SERIES, RUN, "alpha"))


if __name__ == "__main__":
    run_stage(STAGE, main)
