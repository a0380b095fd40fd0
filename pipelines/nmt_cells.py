"""The cells of the NMT grid (corpus × variant × seed) as the three NMT stages use them.

Not a stage: ``train_nmt``, ``evaluate_nmt`` and ``analyze_heads`` build their grid cells and
open them in their tasks the same way, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from components.data.bpe import BpeModel
from components.nmt.cells import NmtCell
from components.nmt.grid import NmtSettings
from components.nmt.model import Transformer, TransformerConfig
from components.nmt.training import load_weights, weight_files
from components.settings import build, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.stage import Cell, CellRun


def nmt_cells(
    nmt: NmtSettings,
    splits: tuple[str, ...],
    shared: Mapping[str, Any],
    *,
    reads_model: bool = False,
) -> list[Cell]:
    """One cell per grid cell: payload = the cell, ``nmt.model`` and ``shared``; inputs = the
    ``splits`` of its corpus, its BPE model and, when the task ``reads_model``, the trained
    weights it loads (``nmt.decode.average_last``) and the training record."""
    cells = []
    for cell in nmt.cells():
        inputs = [*layout.corpus_files(cell.corpus, splits), layout.bpe_model(cell.corpus)]
        if reads_model:
            directory = layout.NMT_MODELS / cell.key
            inputs += [*weight_files(directory, nmt.decode.average_last), layout.done(directory)]
        payload = {"cell": asdict(cell), "model": params_of(nmt.model), **shared}
        cells.append(Cell(cell.key, payload, tuple(inputs)))
    return cells


def open_cell(run: CellRun) -> tuple[NmtCell, TransformerConfig, BpeModel]:
    """In a task: the cell, its model config (vocabulary and normalizer set) and BPE model."""
    cell = NmtCell(**run.payload["cell"])
    bpe = BpeModel(layout.bpe_model(cell.corpus))
    config = build(TransformerConfig, run.payload["model"], "nmt.model")
    return cell, config.for_vocabulary(bpe.vocab_size, cell.variant), bpe


def trained_model(cell: NmtCell, config: TransformerConfig, average_last: int) -> Transformer:
    """The trained model of ``cell`` (the mean of its last ``average_last`` saves), in eval mode."""
    model = Transformer(config)
    model.load_state_dict(load_weights(layout.NMT_MODELS / cell.key, average_last))
    return model.eval()
