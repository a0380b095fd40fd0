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

from learnable_sparsity.ape.triplets import (
    SHOWN_EXAMPLES,
    SyntheticApeSettings,
    Triplet,
    cut_real_set,
    filter_triplets,
    ter_histogram,
    ter_summary,
)
from learnable_sparsity.data.local import TRIPLET_FIELDS, read_corpus, write_corpus
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.grid import NmtSettings
from pipelines.cells.translation import (
    check_unseen,
    leave_out_seen,
    translation_grid,
    translations,
)
from pipelines.scaffold import layout
from pipelines.scaffold.files import clear
from pipelines.scaffold.stage import Stage, run_stage

STAGE = "synthetic_ape"
RESULTS = layout.results(STAGE)
log = logging.getLogger(__name__)


def unseen_pairs(ape: SyntheticApeSettings, nmt: NmtSettings) -> tuple[list[tuple[str, str]], int]:
    """The pairs of the split to translate, none of them seen by the MT model (those it trains
    on left out with ``seen: leave_out``, refused otherwise), and how many were left out."""
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
    return pairs, len(left_out)


def triplet_sets(ape: SyntheticApeSettings, triplets: list[Triplet]) -> tuple[dict, dict]:
    """The ``real`` set cut from ``triplets`` and the filtered ``synthetic`` training set from the
    rest, and their counts for the summary."""
    real, candidates, untranslated = cut_real_set(triplets, ape.real)
    kept, dropped = filter_triplets(candidates, ape.filters, seed=0)
    if ape.synthetic and not kept:
        raise LearnableSparsityError(
            f"synthetic_ape.filters kept none of the {len(candidates)} synthetic "
            f"candidates (dropped: {dropped}); loosen the filters or translate more pairs"
        )
    sets = {"real": real, "synthetic": {"train": kept[: ape.synthetic]}}
    counts = {"candidates": len(candidates), "dropped": dropped}
    return sets, {"real_passed_over_untranslated": untranslated, "filters": counts}


def write_sets(stage: Stage, sets: dict[str, dict[str, list[Triplet]]]) -> dict:
    """Every set's splits that have triplets, in place of the earlier sets, and a TER histogram of
    its training split; the TER summary of every set and split."""
    clear(layout.APE_DATA)
    clear(layout.figures("ape"))
    summaries: dict = {}
    for name, splits in sets.items():
        splits = {split: rows for split, rows in splits.items() if rows}
        if not splits:
            continue
        write_corpus(layout.ape_data(name), splits, TRIPLET_FIELDS)
        summaries[name] = {split: ter_summary(rows) for split, rows in splits.items()}
        figure = ter_histogram(summaries[name]["train"], f"{name}: TER(mt, pe), train")
        stage.write_png(layout.figures("ape") / f"ter_{name}.png", figure, artifact="")
    return summaries


def main(stage: Stage) -> None:
    ape = stage.settings("synthetic_ape", SyntheticApeSettings)
    nmt = stage.settings("nmt", NmtSettings)
    stage.require_entries("synthetic_ape.corpus", [ape.corpus], "corpora")
    summary: dict = {"sets": {}}
    sets: dict = {}
    if ape.needed + ape.synthetic > 0:
        pairs, left_out = unseen_pairs(ape, nmt)
        grid = translation_grid(ape, nmt, len(pairs), layout.cells(STAGE))
        stage.run_grid(grid)
        mt = translations(grid, len(pairs))
        triplets = [Triplet(src, hyp, ref) for (src, ref), hyp in zip(pairs, mt, strict=True)]
        sets, counts = triplet_sets(ape, triplets)
        summary |= {"left_out_seen": left_out, **counts}
    # Earlier sets are removed only now, after every check and translation succeeded.
    summary["sets"] = write_sets(stage, sets)
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


if __name__ == "__main__":
    run_stage(STAGE, main)
