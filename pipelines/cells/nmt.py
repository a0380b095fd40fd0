"""The cells of the NMT grid (corpus × variant × seed) as the three NMT stages use them, and the
NMT training loop run inside a grid cell (also by the APE stages, whose models it trains).

Not a stage: ``train_nmt``, ``evaluate_nmt`` and ``analyze_heads`` build their grid cells and
open them in their tasks the same way, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.nmt.batching import Example
from learnable_sparsity.nmt.cell_training import load_trained, train_model
from learnable_sparsity.nmt.cells import NmtCell
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.model import Transformer, TransformerConfig
from learnable_sparsity.nmt.seq2seq import Seq2Seq
from learnable_sparsity.nmt.training import TrainingHistory, TrainingSettings
from learnable_sparsity.settings import build, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, GridCell


def nmt_cells(
    nmt: NmtSettings,
    splits: tuple[str, ...],
    shared: Mapping[str, Any],
    *,
    reads_model: bool = False,
) -> list[GridCell]:
    """One cell per grid cell: payload = the cell, ``nmt.model`` and ``shared``; inputs = the
    ``splits`` of its corpus (its data), its BPE model and, when the task ``reads_model``, the
    training cell's record (its ``done.json`` holds the digest of every checkpoint the cell
    wrote, so it changes with the weights; and it can be named before the model is trained,
    which a sweep trial that trains and then evaluates needs)."""
    cells = []
    for cell in nmt.cells():
        data = layout.corpus_files(cell.corpus, splits)
        inputs = [*data, layout.bpe_model(cell.corpus)]
        if reads_model:
            inputs.append(layout.done(layout.NMT_MODELS / cell.key))
        payload = {"cell": asdict(cell), "model": params_of(nmt.model), **shared}
        cells.append(GridCell(cell.key, payload, tuple(inputs), data))
    return cells


def open_cell(run: CellRun) -> tuple[NmtCell, TransformerConfig, BpeModel]:
    """In a task: the cell, its model config (vocabulary and normalizer set) and BPE model."""
    cell = NmtCell(**run.payload["cell"])
    bpe = BpeModel(layout.bpe_model(cell.corpus))
    config = build(TransformerConfig, run.payload["model"], "nmt.model")
    return cell, config.for_vocabulary(bpe.vocab_size, cell.variant), bpe


def trained_model(cell: NmtCell, config: TransformerConfig, average_last: int) -> Transformer:
    """The trained model of ``cell`` (the mean of its last ``average_last`` saves), in eval mode."""
    return load_trained(config, layout.NMT_MODELS / cell.key, average_last)


def train_in_cell(
    run: CellRun,
    model: Seq2Seq,
    train_set: Sequence[Example],
    valid_set: Sequence[Example],
    settings: TrainingSettings,
) -> tuple[TrainingHistory, dict[str, object]]:
    """The NMT training loop in a grid cell (``learnable_sparsity.nmt.cell_training.train_model``):
    checkpoints (and resume) in the cell's directory, every logged record to its MLflow run,
    flushed before each checkpoint, and the trained model logged there; the history and its
    summary."""
    history, summary = train_model(
        model,
        train_set,
        valid_set,
        settings,
        checkpoint_dir=run.directory,
        variant=run.key,
        on_log=lambda step, metrics: run.log_metrics(metrics, step),
        before_checkpoint=run.flush,
    )
    run.log_model(model)
    return history, summary
