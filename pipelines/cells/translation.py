"""The translation cells of ``synthetic_ape``, and the checks that their MT models never saw the
sentences they translate. Not a stage: ``synthetic_ape`` runs the grid and makes the triplets.

``heldout`` translates chunks of a split the NMT grid did not train on with one of its models;
``kfold`` trains one NMT model per fold on the other folds and translates the fold. Each cell
writes its sentences' translations to its ``mt.txt``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from learnable_sparsity.ape.triplets import (
    SyntheticApeSettings,
    kfold,
    repeated_sources,
    seen_sources,
    unseen_check,
)
from learnable_sparsity.data.bpe import BpeModel
from learnable_sparsity.data.local import read_corpus
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.files import atomic_write_text
from learnable_sparsity.nmt.batching import encode_pairs
from learnable_sparsity.nmt.cells import NmtCell
from learnable_sparsity.nmt.grid import NmtSettings
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.nmt.search import DecodeSettings, translate
from learnable_sparsity.nmt.training import TrainingSettings, weight_files
from learnable_sparsity.settings import build, params_of
from pipelines.cells.nmt import open_cell, train_in_cell, trained_model
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, Grid, GridCell

MT_FILE = "mt.txt"
log = logging.getLogger(__name__)


def _translate(run: CellRun, model: Transformer, bpe: BpeModel, sources: list[str]) -> dict:
    """Translate ``sources`` with ``model`` into the cell's ``mt.txt``."""
    decode = build(DecodeSettings, run.payload["decode"], "nmt.decode")
    encoded = [source for source, _ in encode_pairs(bpe, [(s, s) for s in sources])]
    tokens = translate(
        model.to(run.device).eval(),
        encoded,
        decode,
        on_batch=lambda done: log.info("%s: translated %d/%d", run.key, done, len(sources)),
    )
    atomic_write_text(run.directory / MT_FILE, "".join(bpe.decode(t) + "\n" for t in tokens))
    return {"sentences": len(sources)}


def translate_chunk(run: CellRun) -> dict:
    """Ray task (heldout): translate sentences [start, stop) of the split with a trained cell."""
    cell, config, bpe = open_cell(run)
    start, stop = run.payload["range"]
    pairs = read_corpus(layout.corpus_dir(cell.corpus), (run.payload["split"],))
    sources = [source for source, _ in pairs[run.payload["split"]][start:stop]]
    decode = build(DecodeSettings, run.payload["decode"], "nmt.decode")
    return _translate(run, trained_model(cell, config, decode.average_last), bpe, sources)


def cross_translate(run: CellRun) -> dict:
    """Ray task (kfold): train an NMT model on every fold but this one, then translate it."""
    cell, config, bpe = open_cell(run)
    split = run.payload["split"]
    corpus = read_corpus(layout.corpus_dir(cell.corpus), (split, "valid"))
    held = set(run.payload["fold"])
    rest = [pair for i, pair in enumerate(corpus[split]) if i not in held]
    settings = build(TrainingSettings, run.payload["train"], "nmt.train", seed=cell.seed)
    model = Transformer(config).to(run.device)
    train_in_cell(run, model, encode_pairs(bpe, rest), encode_pairs(bpe, corpus["valid"]), settings)
    return _translate(run, model, bpe, [corpus[split][i][0] for i in run.payload["fold"]])


def folds(ape: SyntheticApeSettings, n_pairs: int) -> list[list[int]]:
    """The kfold mode's folds of the split (drawn with the seed of ``synthetic_ape.model``)."""
    return kfold(n_pairs, ape.folds, int(ape.model.partition("/seed")[2]))


def translation_grid(
    ape: SyntheticApeSettings, nmt: NmtSettings, n_pairs: int, store: Path
) -> Grid:
    """The translation cells, their directories under ``store``: chunks of the split translated
    by a trained model (heldout) or its folds, each by a model trained on the others (kfold)."""
    variant, _, seed = ape.model.partition("/seed")
    cell = NmtCell(ape.corpus, variant, int(seed))
    corpus = layout.corpus_files(ape.corpus, (ape.split,))
    common = {"cell": asdict(cell), "model": params_of(nmt.model), "split": ape.split}
    common["decode"] = params_of(nmt.decode)
    if ape.mode == "heldout":
        directory = layout.NMT_MODELS / cell.key
        weights = [*weight_files(directory, nmt.decode.average_last), layout.done(directory)]
        inputs = (*corpus, layout.bpe_model(ape.corpus), *weights)
        chunks = [
            GridCell(f"chunk{start:08d}", {**common, "range": [start, stop]}, inputs)
            for start in range(0, n_pairs, ape.chunk_sentences)
            for stop in [min(start + ape.chunk_sentences, n_pairs)]
        ]
        return Grid(translate_chunk, chunks, store)
    inputs = (*corpus, *layout.corpus_files(ape.corpus, ("valid",)), layout.bpe_model(ape.corpus))
    payload = {**common, "train": params_of(nmt.train)}
    held_out = [
        GridCell(f"fold{index}", {**payload, "fold": fold}, inputs)
        for index, fold in enumerate(folds(ape, n_pairs))
    ]
    return Grid(cross_translate, held_out, store)


def leave_out_seen(
    ape: SyntheticApeSettings, pairs: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs of ``split`` without those whose source the MT model trains on (with
    ``seen: leave_out``; ``refuse`` keeps them all for :func:`check_unseen`), and the sources
    left out."""
    if ape.seen == "refuse":
        return pairs, []
    sources = [source for source, _ in pairs]
    if ape.mode == "kfold":
        dropped = set(repeated_sources(sources))
    else:
        train = read_corpus(layout.corpus_dir(ape.corpus), ("train",))["train"]
        dropped = set(seen_sources(sources, (source for source, _ in train)))
    kept = [pair for i, pair in enumerate(pairs) if i not in dropped]
    return kept, [sources[i] for i in sorted(dropped)]


def check_unseen(ape: SyntheticApeSettings, nmt: NmtSettings, sources: list[str]) -> None:
    """Refuse, before any translation, sentences an MT model was trained on."""
    if ape.mode == "kfold":
        for index, fold in enumerate(folds(ape, len(sources))):
            held = set(fold)
            rest = [s for i, s in enumerate(sources) if i not in held]
            unseen_check([sources[i] for i in fold], rest, what=f"{ape.split} fold {index}")
        return
    key = f"{ape.corpus}/{ape.model}"
    if key not in {cell.key for cell in nmt.cells()}:
        raise LearnableSparsityError(
            f"synthetic_ape.model {ape.model!r} on corpus {ape.corpus!r} is not a cell of the "
            f"NMT grid (nmt.corpora, nmt.variants, nmt.seeds): train_nmt does not train {key}"
        )
    train_sources = [s for s, _ in read_corpus(layout.corpus_dir(ape.corpus), ("train",))["train"]]
    unseen_check(sources, train_sources, what=f"{ape.corpus}/{ape.split} for NMT model {key}")


def translations(grid: Grid, n_pairs: int) -> list[str]:
    """Every sentence's translation, in corpus order, from the ``mt.txt`` of the grid's cells."""
    mt = [""] * n_pairs
    for task in grid.cells:
        lines = (grid.store / task.key / MT_FILE).read_text(encoding="utf-8")
        indices = task.payload.get("fold") or range(*task.payload["range"])
        for index, line in zip(indices, lines.split("\n")[:-1], strict=True):
            mt[index] = line
    return mt
