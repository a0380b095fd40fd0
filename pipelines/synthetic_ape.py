"""DVC stage ``synthetic_ape``: eSCAPE-style APE triplets from a parallel corpus and NMT models.

A triplet is (src, mt, pe) = (source sentence, its machine translation by beam search, the
reference translation). The MT models never saw the sentences they translate: ``heldout``
translates a split the NMT grid did not train on (the stage refuses, naming the overlap, when
it did), ``kfold`` trains one NMT model per fold on the other folds. Translation runs as Ray
tasks (chunks or folds; finished ones are reused).

The triplets, in corpus order, become the low-resource ``real`` set (the WMT APE 23K analogue;
train / valid / test kept as translated, passing over sentences translated to nothing) and,
from the rest, the ``synthetic`` training set (the eSCAPE analogue; filtered). Outputs:
``data/ape/<set>/<split>.{src,mt,pe}``, ``results/synthetic_ape/summary.json`` (sizes, filter
counts and the TER of mt against pe per set and split: the "do nothing" error the APE models
must reduce), ``metrics.json`` (DVC metrics: triplets and corpus TER per set and split, the
filters' counts) and a TER histogram per set in ``reports/figures/ape/``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from components.ape.triplets import (
    SHOWN_EXAMPLES,
    SyntheticApeSettings,
    Triplet,
    cut_real_set,
    filter_triplets,
    kfold,
    repeated_sources,
    seen_sources,
    ter_histogram,
    ter_summary,
    unseen_check,
)
from components.data.atomic import atomic_write_text
from components.data.bpe import BpeModel
from components.data.local import TRIPLET_FIELDS, read_corpus, write_corpus
from components.errors import LearnableSparsityError
from components.nmt.batching import encode_pairs
from components.nmt.cells import NmtCell
from components.nmt.grid import NmtSettings
from components.nmt.model import Transformer
from components.nmt.search import DecodeSettings, translate
from components.nmt.training import TrainingSettings, weight_files
from components.settings import build, params_of
from pipelines.nmt_cells import open_cell, train_in_cell, trained_model
from pipelines.scaffold import layout
from pipelines.scaffold.cells import CellRun, GridCell
from pipelines.scaffold.files import clear
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "synthetic_ape"
RESULTS = layout.results(STAGE)
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


def cells(ape: SyntheticApeSettings, nmt: NmtSettings, n_pairs: int) -> list[GridCell]:
    """The translation tasks: chunks of the split (heldout) or its folds (kfold)."""
    variant, _, seed = ape.model.partition("/seed")
    cell = NmtCell(ape.corpus, variant, int(seed))
    corpus = layout.corpus_files(ape.corpus, (ape.split,))
    common = {"cell": asdict(cell), "model": params_of(nmt.model), "split": ape.split}
    common["decode"] = params_of(nmt.decode)
    if ape.mode == "heldout":
        directory = layout.NMT_MODELS / cell.key
        weights = [*weight_files(directory, nmt.decode.average_last), layout.done(directory)]
        inputs = (*corpus, layout.bpe_model(ape.corpus), *weights)
        return [
            GridCell(f"chunk{start:08d}", {**common, "range": [start, stop]}, inputs)
            for start in range(0, n_pairs, ape.chunk_sentences)
            for stop in [min(start + ape.chunk_sentences, n_pairs)]
        ]
    inputs = (*corpus, *layout.corpus_files(ape.corpus, ("valid",)), layout.bpe_model(ape.corpus))
    payload = {**common, "train": params_of(nmt.train)}
    return [
        GridCell(f"fold{index}", {**payload, "fold": fold}, inputs)
        for index, fold in enumerate(folds(ape, n_pairs))
    ]


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


def main(stage: Stage) -> None:
    ape = stage.settings("synthetic_ape", SyntheticApeSettings)
    nmt = stage.settings("nmt", NmtSettings)
    stage.require_entries("synthetic_ape.corpus", [ape.corpus], "corpora")
    summary: dict = {"sets": {}}
    sets: dict = {}
    if ape.needed + ape.synthetic > 0:
        pairs = read_corpus(layout.corpus_dir(ape.corpus), (ape.split,))[ape.split]
        pairs, left_out = leave_out_seen(ape, pairs)
        if left_out:
            log.info(
                "left out %d of %d sentences of %s/%s the MT model trains on (seen: leave_out), "
                "e.g. %s",
                len(left_out),
                len(pairs) + len(left_out),
                ape.corpus,
                ape.split,
                left_out[:SHOWN_EXAMPLES],
            )
        if len(pairs) <= ape.needed:
            raise LearnableSparsityError(
                f"synthetic_ape.real needs {ape.needed} triplets but {ape.corpus}/{ape.split} has "
                f"{len(pairs)} pairs (after leaving out {len(left_out)} seen ones): enlarge the "
                "split or shrink synthetic_ape.real"
            )
        check_unseen(ape, nmt, [source for source, _ in pairs])
        summary["left_out_seen"] = len(left_out)
        tasks = cells(ape, nmt, len(pairs))
        task = translate_chunk if ape.mode == "heldout" else cross_translate
        stage.grid(task, tasks, store=layout.cells(STAGE))
        mt = translations(tasks, len(pairs))
        triplets = [Triplet(src, hyp, ref) for (src, ref), hyp in zip(pairs, mt, strict=True)]
        real, candidates, untranslated = cut_real_set(triplets, ape.real)
        kept, dropped = filter_triplets(candidates, ape.filters, seed=0)
        if ape.synthetic and not kept:
            raise LearnableSparsityError(
                f"synthetic_ape.filters kept none of the {len(candidates)} synthetic "
                f"candidates (dropped: {dropped}); loosen the filters or translate more pairs"
            )
        sets = {"real": real, "synthetic": {"train": kept[: ape.synthetic]}}
        summary["real_passed_over_untranslated"] = untranslated
        summary["filters"] = {"candidates": len(candidates), "dropped": dropped}
    # Earlier sets are removed only now, after every check and translation succeeded.
    clear(layout.APE_DATA)
    clear(layout.figures("ape"))
    for name, splits in sets.items():
        splits = {split: rows for split, rows in splits.items() if rows}
        if not splits:
            continue
        write_corpus(layout.ape_data(name), splits, TRIPLET_FIELDS)
        summary["sets"][name] = {split: ter_summary(rows) for split, rows in splits.items()}
        figure = ter_histogram(summary["sets"][name]["train"], f"{name}: TER(mt, pe), train")
        stage.write_png(layout.figures("ape") / f"ter_{name}.png", figure, artifact="")
    stage.write_json(RESULTS / "summary.json", summary, artifact="")
    stage.write_metrics(triplet_metrics(summary))


def triplet_metrics(summary: dict) -> dict:
    """The triplets and corpus TER of every set and split, the untranslated sentences the
    real set passed over, and the filters' counts."""
    sets = {
        name: {split: {k: ter[k] for k in ("triplets", "corpus_ter")} for split, ter in s.items()}
        for name, s in summary["sets"].items()
    }
    counts = {
        key: summary[key] for key in ("left_out_seen", "real_passed_over_untranslated", "filters")
    }
    return {**sets, **(counts if "filters" in summary else {})}


def translations(tasks: list[GridCell], n_pairs: int) -> list[str]:
    """Every sentence's translation, in corpus order, from the cells' ``mt.txt``."""
    mt = [""] * n_pairs
    for task in tasks:
        lines = (layout.cells(STAGE) / task.key / MT_FILE).read_text(encoding="utf-8")
        indices = task.payload.get("fold") or range(*task.payload["range"])
        for index, line in zip(indices, lines.split("\n")[:-1], strict=True):
            mt[index] = line
    return mt


if __name__ == "__main__":
    run_stage(STAGE, main)
