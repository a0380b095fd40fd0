"""Tests for ``learnable_sparsity.reporting.published``: the published numbers of
``paper_results.yaml``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.published import paper_table, published_row

PACKAGED_YAML = (
    Path(__file__).resolve().parents[2] / "learnable_sparsity/reporting/paper_results.yaml"
)
# The SHA-256 of the project's reference file of published numbers (the task's shared
# reference/paper_results.yaml, outside the repository), of which the packaged file is a copy.
REFERENCE_SHA256 = "f2925e91648c2a3d71efae41ed212d0dbaaff1ef24759635c93a6f373a34f561"
# Where that reference lies beside a checkout of the project, when it does.
REFERENCE_YAML = Path(__file__).resolve().parents[3] / "shared/reference/paper_results.yaml"


def test_paper_table_reads_tables_and_in_text_results() -> None:
    assert paper_table("ast_mt_bleu")["rows"][0]["bleu_iwslt17_de_en"] == pytest.approx(29.79)
    speeds = paper_table("ast_training_speed")["rows"]
    assert {r["system"]: r["relative_train_speed_pct"] for r in speeds} == {
        "alpha-entmax": 75,
        "1.5-entmax": 90,
    }


def test_paper_table_returns_a_copy() -> None:
    paper_table("ast_mt_bleu")["rows"].clear()
    assert paper_table("ast_mt_bleu")["rows"]


def test_unknown_table_id_lists_the_known_ids() -> None:
    with pytest.raises(LearnableSparsityError, match="no_such_table") as error:
        paper_table("no_such_table")
    assert "ast_mt_bleu" in str(error.value) and "ast_positional_heads" in str(error.value)


def test_published_row_finds_a_system_and_returns_a_copy() -> None:
    row = published_row("ast_training_speed", "alpha-entmax")
    assert row["relative_train_speed_pct"] == 75
    row["relative_train_speed_pct"] = 0
    assert published_row("ast_training_speed", "alpha-entmax")["relative_train_speed_pct"] == 75


def test_published_row_reports_unknown_systems_and_tables() -> None:
    with pytest.raises(LearnableSparsityError, match="has no row 'no such system'"):
        published_row("ast_mt_bleu", "no such system")
    with pytest.raises(LearnableSparsityError, match="unknown paper table id 'no_such_table'"):
        published_row("no_such_table", "softmax")


def test_packaged_yaml_is_a_verbatim_copy_of_the_reference() -> None:
    """Checked in every clone against the reference's digest; where the reference itself lies
    beside the checkout, its digest is checked too (a changed reference must be copied again)."""
    assert hashlib.sha256(PACKAGED_YAML.read_bytes()).hexdigest() == REFERENCE_SHA256
    if REFERENCE_YAML.exists():
        assert hashlib.sha256(REFERENCE_YAML.read_bytes()).hexdigest() == REFERENCE_SHA256
