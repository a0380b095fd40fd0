r"""The APE comparison tables: the thesis' Table 3.1 (decoder ablation) and Table 3.2 (data
regimes), the reproduced TER / tokenized BLEU beside the published ones.

Input shape of both builders: ``scores`` {cell key "<regime>/<system>/seed<k>": {split:
{"ter": …, "tokenized_bleu": …}}} (``evaluate_ape``'s ``scores.json`` "cells") and
``do_nothing`` {split: {"ter": …, "tokenized_bleu": …}} (mt scored against pe). Systems are
named as in params ``ape.systems`` (:data:`SYSTEM_LABELS` for the known ones, in the order of
Table 3.1); a system the thesis does not have is shown without published numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.published import paper_table, published_row
from learnable_sparsity.reporting.table import (
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    TableCell,
    check_names,
    check_number,
    file_stem,
)

# Display names of the APE systems (params ape.systems), Table 3.1's rows first, in its order.
SYSTEM_LABELS: dict[str, str] = {
    "transformer_decoder": "BERT enc. + Transformer dec. (random)",
    "bert_decoder": "BERT enc. + BERT dec. (CA random)",
    "ca_init_sa": "  with CA ← SA",
    "sa_tied_encoder": "  and SA ↔ encoder SA",
    "ca_tied_sa": "  and CA ↔ SA",
    "ff_tied_encoder": "  and FF ↔ encoder FF",
    "scratch": "Transformer from scratch",
    "dual_source": "Dual-source Transformer",
}
# Table 3.2's row names: the cumulative sharing rows of Table 3.1 spelled out in full.
RESULT_LABELS: dict[str, str] = {
    **SYSTEM_LABELS,
    "ca_init_sa": "BERT enc. + BERT dec., CA ← SA",
    "sa_tied_encoder": "BERT enc. + BERT dec., CA ← SA, SA ↔ enc. SA",
    "ca_tied_sa": "BERT enc. + BERT dec., CA ← SA, SA ↔ enc. SA, CA ↔ SA",
    "ff_tied_encoder": "BERT enc. + BERT dec., CA ← SA, SA ↔ enc. SA, CA ↔ SA, FF ↔ enc. FF",
}
# The systems of Table 3.1, in its row order (its published rows, one each).
_ABLATION_ORDER = (
    "transformer_decoder",
    "bert_decoder",
    "ca_init_sa",
    "sa_tied_encoder",
    "ca_tied_sa",
    "ff_tied_encoder",
)
_ABLATION_ROWS = dict(
    zip(
        _ABLATION_ORDER,
        (row["system"] for row in paper_table("ape_decoder_ablation")["rows"]),
        strict=True,
    )
)
# The published Table 3.2 row of (regime, system) where the thesis has one.
_RESULT_ROWS = {
    ("low_resource", "dual_source"): ("Dual-Source Transformer (re-implementation)", "23K"),
    ("low_resource", "transformer_decoder"): ("BERT Enc. + Transformer Dec. (ours)", "23K"),
    ("low_resource", "sa_tied_encoder"): ("BERT Enc. + BERT Dec. (ours)", "23K"),
    ("augmented", "sa_tied_encoder"): ("BERT Enc. + BERT Dec. (ours)", "8M"),
    # the thesis' 8M dual-source row is the original system's (its authors' own training)
    ("augmented", "dual_source"): ("Junczys-Dowmunt & Grundkiewicz (2018)", "8M"),
}
_MT_BASELINE = "MT baseline (uncorrected)"
DO_NOTHING = "Do nothing (mt as is)"
PUBLISHED_DATA = "wmt_ape_en_de"  # the published numbers' data: WMT APE en-de PBSMT
_YEARS = ("2016", "2017", "2018")
_METRICS = (("ter", "TER ↓"), ("tokenized_bleu", "BLEU ↑"))
_PUBLISHED_KEY = {"ter": "ter", "tokenized_bleu": "bleu"}


def _by_system(
    scores: Mapping[str, Mapping[str, Mapping[str, float]]], regime: str, split: str
) -> dict[str, dict[str, list[float]]]:
    """{system: {metric: [value of each seed]}} of the cells of ``regime`` on ``split``."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, splits in scores.items():
        cell_regime, system, _seed = key.split("/")
        if cell_regime == regime and split in splits:
            for metric, _ in _METRICS:
                value = check_number(
                    f"scores[{key!r}][{split!r}][{metric!r}]", splits[split][metric]
                )
                out[system][metric].append(value)
    return out


def _order(systems: Sequence[str]) -> list[str]:
    known = [s for s in SYSTEM_LABELS if s in systems]
    return known + sorted(s for s in systems if s not in SYSTEM_LABELS)


def _do_nothing_row(do_nothing: Mapping[str, Mapping[str, float]], split: str, refs) -> Row:
    if split not in do_nothing:
        raise LearnableSparsityError(f"do_nothing has no split {split!r}")
    return Row(
        DO_NOTHING,
        {m: TableCell((do_nothing[split][m],), refs(m)) for m, _ in _METRICS},
    )


def ape_ablation_table(
    scores: Mapping[str, Mapping[str, Mapping[str, float]]],
    do_nothing: Mapping[str, Mapping[str, float]],
    profile: str,
    data: str | Sequence[str],
    signatures: Sequence[str],
    *,
    regime: str = "low_resource",
    split: str = "valid",
) -> ComparisonTable:
    """Table 3.1: every system of ``regime`` on the dev ``split``, beside the thesis' decoder
    ablation (WMT 2018 APE dev set, 23K real triplets), with the do-nothing row."""
    systems = _by_system(scores, regime, split)
    if not systems:
        raise LearnableSparsityError(f"no APE cell of regime {regime!r} was scored on {split!r}")
    published = paper_table("ape_decoder_ablation")

    def refs(system: str | None):
        row = published_row("ape_decoder_ablation", _ABLATION_ROWS[system]) if system else None
        return lambda metric: (
            Reference(
                "published (Table 3.1)",
                row[_PUBLISHED_KEY[metric]] if row else None,
                data=PUBLISHED_DATA,
            ),
        )

    rows = [_do_nothing_row(do_nothing, split, refs(None))]
    for system in _order(list(systems)):
        ref = refs(system if system in _ABLATION_ROWS else None)
        cells = {m: TableCell(tuple(systems[system][m]), ref(m)) for m, _ in _METRICS}
        rows.append(Row(SYSTEM_LABELS.get(system, system), cells))
    return ComparisonTable(
        name=file_stem("ape_decoder_ablation", check_names("data", data)),
        title=f"APE decoder ablation on the {split} set, {regime} data (thesis Table 3.1)",
        caption=(
            "TER (case-sensitive, tokenized text, ×100; lower is better) and tokenized BLEU of "
            "each system. The sharing rows are cumulative as in the thesis: each adds one "
            "initialisation or tie to the row above (CA: context attention, SA: self-attention, "
            "FF: feed-forward; ← copied once, ↔ tied). 'Do nothing' scores the MT output "
            "itself: a system helps only below its TER. The thesis has no scratch or "
            "dual-source row in this table."
        ),
        metrics=tuple(Metric(m, label) for m, label in _METRICS),
        rows=tuple(rows),
        provenance=Provenance(profile, check_names("data", data), tuple(signatures)),
        sources=(published["source"],),
    )


def ape_results_table(
    scores: Mapping[str, Mapping[str, Mapping[str, float]]],
    do_nothing: Mapping[str, Mapping[str, float]],
    profile: str,
    data: str | Sequence[str],
    signatures: Sequence[str],
    splits: Sequence[str],
) -> ComparisonTable:
    """Table 3.2: every cell (regime, system) on the test ``splits`` beside the thesis' results
    on WMT test 2016–2018, with the do-nothing row beside the published MT baseline.

    A split named ``test<year>`` is read beside that year's published numbers; another test
    split (the smoke set's ``test``) beside all three years.
    """
    if not splits:
        raise LearnableSparsityError("ape_results_table needs at least one test split")
    published = paper_table("ape_wmt16_18_results")
    metrics, years = [], {}
    for split in splits:
        years[split] = (
            [split.removeprefix("test")] if split.removeprefix("test") in _YEARS else _YEARS
        )
        metrics += [Metric(f"{m}_{split}", f"{label} ({split})") for m, label in _METRICS]

    def refs(row_name: str | None, train_size: str | None, metric: str, split: str):
        row = None
        if row_name is not None:
            row = next(
                r
                for r in published["rows"]
                if r["system"] == row_name
                and r["train_size"] == train_size
                and r["ensemble"] in (None, 1)
            )
        return tuple(
            Reference(
                f"published test {year}",
                row[f"{_PUBLISHED_KEY[metric]}_test{year}"] if row else None,
                data=f"{PUBLISHED_DATA}/test{year}",
            )
            for year in years[split]
        )

    baseline = {
        f"{m}_{split}": TableCell((do_nothing[split][m],), refs(_MT_BASELINE, None, m, split))
        for split in splits
        for m, _ in _METRICS
    }
    rows = [Row(DO_NOTHING, baseline)]
    regimes = sorted({key.split("/")[0] for key in scores}, key=lambda r: r != "low_resource")
    for regime in regimes:
        per_split = {split: _by_system(scores, regime, split) for split in splits}
        for system in _order(list(per_split[splits[0]])):
            name, size = _RESULT_ROWS.get((regime, system), (None, None))
            cells = {
                f"{m}_{split}": TableCell(
                    tuple(per_split[split][system][m]), refs(name, size, m, split)
                )
                for split in splits
                for m, _ in _METRICS
            }
            rows.append(Row(f"{RESULT_LABELS.get(system, system)} [{regime}]", cells))
    return ComparisonTable(
        name=file_stem("ape_results", check_names("data", data)),
        title="APE test results by system and training data (thesis Table 3.2)",
        caption=(
            "TER (case-sensitive, tokenized text, ×100) and tokenized BLEU on the test set(s). "
            "[low_resource]: the real training triplets alone (thesis: 23K); [augmented]: the "
            "real ones plus the synthetic set (thesis: 23K × 35 + eSCAPE, '8M'). 'Do nothing' "
            "is the MT output scored against the post-edits, beside the published MT "
            "baseline. Published numbers are single models (no ×4 ensembles)."
        ),
        metrics=tuple(metrics),
        rows=tuple(rows),
        provenance=Provenance(profile, check_names("data", data), tuple(signatures)),
        sources=(published["source"],),
    )
