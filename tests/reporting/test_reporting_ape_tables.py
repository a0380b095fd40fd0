"""Tests for ``learnable_sparsity.reporting.ape_tables``: thesis Tables 3.1 and 3.2 beside the
reproduced APE scores."""

from __future__ import annotations

import csv
import io

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.ape_tables import (
    DO_NOTHING,
    SYSTEM_LABELS,
    ape_ablation_table,
    ape_results_table,
)
from learnable_sparsity.reporting.render import to_csv, to_markdown

SYSTEMS = list(SYSTEM_LABELS)


def _scores(regime: str, splits: tuple[str, ...], seeds: int = 2) -> dict:
    return {
        f"{regime}/{system}/seed{seed}": {
            split: {"ter": 20.0 + i + seed, "tokenized_bleu": 70.0 - i - seed} for split in splits
        }
        for i, system in enumerate(SYSTEMS)
        for seed in range(seeds)
    }


DO_NOTHING_SCORES = {s: {"ter": 24.24, "tokenized_bleu": 62.99} for s in ("valid", "test2018")}


def test_ablation_rows_follow_table_3_1_with_do_nothing_first_and_published_numbers() -> None:
    scores = _scores("low_resource", ("valid",))
    table = ape_ablation_table(scores, DO_NOTHING_SCORES, "paper", "wmt_ape_pbsmt_en_de", ["sig"])
    assert [row.system for row in table.rows] == [DO_NOTHING, *SYSTEM_LABELS.values()]
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert len(rows) == (1 + len(SYSTEMS)) * 2  # a row per system and metric (TER, BLEU)
    best = table.rows[1 + SYSTEMS.index("sa_tied_encoder")]
    assert best.cells["ter"].values == (23.0, 24.0)  # one value per seed
    assert best.cells["ter"].references[0].value == 18.44  # the thesis' best row
    scratch = table.rows[1 + SYSTEMS.index("scratch")]
    assert scratch.cells["ter"].references[0].value is None  # not in Table 3.1
    assert "Table 3.1" in to_markdown(table)


def test_results_table_reads_each_test_year_beside_its_published_column() -> None:
    scores = _scores("low_resource", ("test2018",)) | _scores("augmented", ("test2018",))
    table = ape_results_table(
        scores, DO_NOTHING_SCORES, "paper", "wmt_ape_pbsmt_en_de", ["sig"], ["test2018"]
    )
    baseline = table.rows[0]
    assert baseline.system == DO_NOTHING
    assert baseline.cells["ter_test2018"].references[0].value == 24.24  # MT baseline, test 2018
    labels = [row.system for row in table.rows]
    low = labels.index("BERT enc. + BERT dec., CA ← SA, SA ↔ enc. SA [low_resource]")
    augmented = labels.index("BERT enc. + BERT dec., CA ← SA, SA ↔ enc. SA [augmented]")
    assert table.rows[low].cells["ter_test2018"].references[0].value == 19.34  # 23K
    assert table.rows[augmented].cells["ter_test2018"].references[0].value == 17.71  # 8M
    assert low < augmented  # the low-resource regime first
    # the 8M dual-source is the original system's single model (test 2018: not published)
    dual = labels.index("Dual-source Transformer [augmented]")
    assert table.rows[dual].cells["ter_test2018"].references[0].value is None
    twenty17 = ape_results_table(
        _scores("augmented", ("test2017",)),
        {"test2017": {"ter": 24.48, "tokenized_bleu": 62.49}},
        "paper",
        "wmt_ape_pbsmt_en_de",
        ["sig"],
        ["test2017"],
    )
    dual_row = next(r for r in twenty17.rows if r.system == "Dual-source Transformer [augmented]")
    assert dual_row.cells["ter_test2017"].references[0].value == 18.10


def test_a_smoke_test_split_is_read_beside_all_three_years() -> None:
    scores = _scores("low_resource", ("test",), seeds=1)
    do_nothing = {"test": {"ter": 31.0, "tokenized_bleu": 45.0}}
    table = ape_results_table(scores, do_nothing, "smoke", "data/ape/real", ["sig"], ["test"])
    columns = [ref.column for ref in table.rows[0].cells["ter_test"].references]
    assert columns == ["published test 2016", "published test 2017", "published test 2018"]
    assert "not comparable to the publication" in to_markdown(table)


def test_missing_cells_and_splits_are_named() -> None:
    with pytest.raises(LearnableSparsityError, match="no APE cell of regime 'low_resource'"):
        ape_ablation_table({}, DO_NOTHING_SCORES, "smoke", "d", [])
    with pytest.raises(LearnableSparsityError, match="do_nothing has no split 'valid'"):
        ape_ablation_table(_scores("low_resource", ("valid",)), {}, "smoke", "d", [])
