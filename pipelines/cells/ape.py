"""The cells of the APE grid (regime × system × seed) as ``train_ape`` and ``evaluate_ape`` use
them.

Not a stage: both stages build their cells, encode the triplets and build the model here. Every
cell loads the BERT that ``pretrain_bert`` saved in ``models/bert/model`` (with
``from_pretrained``) and reads the triplet sets of params ``ape.data``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers import BertTokenizerFast

from learnable_sparsity.ape.bert import load_bert, load_bert_tokenizer
from learnable_sparsity.ape.grid import ApeCell, ApeSettings, RegimeSettings
from learnable_sparsity.ape.model import (
    ApeConfig,
    ApeModel,
    build_ape_model,
    joint_input,
    target_ids,
)
from learnable_sparsity.data.local import read_triplets
from learnable_sparsity.errors import MissingInputError
from learnable_sparsity.nmt.batching import Example
from learnable_sparsity.nmt.training import load_weights
from learnable_sparsity.settings import build, params_of
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, GridCell

BERT_DIR = layout.BERT / "model"  # pretrain_bert's cell


def triplet_files(directory: str, splits: Sequence[str]) -> list[Path]:
    return [Path(directory) / f"{split}.{side}" for split in splits for side in ("src", "mt", "pe")]


def require_data(ape: ApeSettings) -> None:
    """Every triplet file the grid reads exists (a clear error before any cell starts)."""
    needed = triplet_files(ape.data["real"], ("train", "valid", *ape.evaluate))
    if any(regime.synthetic for regime in ape.regimes.values()):
        needed += triplet_files(ape.data["synthetic"], ("train",))
    missing = sorted({str(path) for path in needed if not path.is_file()})
    if missing:
        raise MissingInputError(
            f"ape.data: {missing} missing; run `dvc repro synthetic_ape` (smoke) or `corpora` "
            "(a downloaded triplet corpus), or point ape.data at existing triplet files"
        )


def ape_cells(
    ape: ApeSettings, splits: Sequence[str], shared: Mapping[str, Any], *, reads_model: bool = False
) -> list[GridCell]:
    """One cell per grid cell: payload = the cell, its model config, regime, data and
    ``shared``; inputs = the BERT, the real ``splits`` (and the synthetic training set when the
    regime uses it: the triplets are its data) and, when the task ``reads_model``, the training
    cell's record (see nmt_cells)."""
    cells = []
    for cell in ape.cells():
        regime = ape.regimes[cell.regime]
        data = triplet_files(ape.data["real"], splits)
        if regime.synthetic and "train" in splits:
            data += triplet_files(ape.data["synthetic"], ("train",))
        inputs = [layout.done(BERT_DIR), *data]
        if reads_model:
            inputs.append(layout.done(layout.APE_MODELS / cell.key))  # see nmt_cells
        payload = {
            "cell": asdict(cell),
            "model": params_of(ape.system(cell.system)),
            "regime": params_of(regime),
            "data": dict(ape.data),
            "max_pieces": [ape.max_source_pieces, ape.max_target_pieces],
            **shared,
        }
        cells.append(GridCell(cell.key, payload, tuple(inputs), tuple(data)))
    return cells


def open_cell(run: CellRun) -> tuple[ApeCell, ApeModel, BertTokenizerFast]:
    """In a task: the cell, its freshly built model (random parts drawn from the cell's seed:
    call ``torch.manual_seed`` first where that matters) and the BERT tokenizer."""
    cell = ApeCell(**run.payload["cell"])
    config = build(ApeConfig, run.payload["model"], f"ape.systems.{cell.system}")
    tokenizer = load_bert_tokenizer(str(BERT_DIR))
    bert = load_bert(str(BERT_DIR), add_pooling_layer=False)
    model = build_ape_model(config, bert, tokenizer)
    return cell, model, tokenizer


def trained_model(run: CellRun, average_last: int) -> tuple[ApeCell, ApeModel, BertTokenizerFast]:
    """The trained model of the cell (the mean of its last ``average_last`` saves), eval mode."""
    cell, model, tokenizer = open_cell(run)
    model.load_state_dict(load_weights(layout.APE_MODELS / cell.key, average_last))
    return cell, model.eval(), tokenizer


def encode_triplets(
    tokenizer: BertTokenizerFast, triplets: Sequence[tuple[str, str, str]]
) -> list[Example]:
    """(``src [SEP] mt`` ids, pe ids) of each triplet."""
    return [(joint_input(tokenizer, s, m), target_ids(tokenizer, p)) for s, m, p in triplets]


def segment_lengths(joint: Sequence[int], sep_id: int) -> tuple[int, int]:
    """The positions of ``src [SEP]`` and of ``mt`` in a joint input (each counts from 0)."""
    cut = list(joint).index(sep_id) + 1
    return cut, len(joint) - cut


def fit_positions(joint: list[int], sep_id: int, max_positions: int) -> list[int]:
    """``joint`` with each segment cut to the model's ``max_positions`` (src keeps its [SEP]):
    decoding must give every test sentence an output, so a test input longer than BERT's
    positions is truncated, not dropped."""
    cut = joint.index(sep_id) + 1
    src, mt = joint[: cut - 1][: max_positions - 1], joint[cut:][:max_positions]
    return [*src, sep_id, *mt]


def training_examples(
    run: CellRun, tokenizer: BertTokenizerFast, max_positions: int
) -> tuple[list, list, dict]:
    """The cell's training examples (real × oversample_real, + synthetic; the paper's length
    filter and BERT's ``max_positions`` applied), its validation examples (the real dev set,
    fitted to the positions) and their counts."""
    regime = build(RegimeSettings, run.payload["regime"], "ape.regimes")
    real = read_triplets(Path(run.payload["data"]["real"]), ("train", "valid"))
    train = encode_triplets(tokenizer, real["train"]) * regime.oversample_real
    if regime.synthetic:
        synthetic = read_triplets(Path(run.payload["data"]["synthetic"]), ("train",))["train"]
        train += encode_triplets(tokenizer, synthetic)
    max_source, max_target = run.payload["max_pieces"]
    # The paper's filter, and BERT's positions: each segment and the target (after bos) fit.
    limit, sep = max_positions, tokenizer.sep_token_id
    kept = [
        (s, t)
        for s, t in train
        if len(s) < max_source
        and len(t) < max_target
        and max(segment_lengths(s, sep)) <= limit
        and len(t) + 1 <= limit
    ]
    counts = {"train_examples": len(kept), "dropped_by_length": len(train) - len(kept)}
    valid = [
        (fit_positions(s, sep, limit), t[: limit - 1])
        for s, t in encode_triplets(tokenizer, real["valid"])
    ]
    return kept, valid, counts
