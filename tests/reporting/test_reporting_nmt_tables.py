"""Tests for ``learnable_sparsity.reporting.nmt_tables``: the speed table (ratios given by the speed
stage) and the attention-head summaries."""

from __future__ import annotations

import csv
import io
import math

import pytest

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.nmt_tables import (
    TOKENIZED_BLEU_LABEL,
    ast_bleu_table,
    head_summary_table,
    speed_comparison_table,
)
from learnable_sparsity.reporting.render import to_csv, to_markdown
from learnable_sparsity.reporting.table import ComparisonTable


def _csv_rows(table: ComparisonTable) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(to_csv(table))))


# ---------------------------------------------------------------------------- BLEU


def test_bleu_table_labels_tokenized_bleu_and_counts_empty_hypotheses() -> None:
    bleu = {"softmax": [20.0, 22.0], "sparsemax": [18.0]}
    empty = {"softmax": [0, 2], "sparsemax": [5]}
    table = ast_bleu_table(bleu, "paper", "iwslt17_de_en", empty_by_variant_seed=empty)
    assert [m.label for m in table.metrics] == [TOKENIZED_BLEU_LABEL, "empty hypotheses"]
    assert "pre-tokenised" in TOKENIZED_BLEU_LABEL and "pre-tokenised" in table.caption
    text = to_markdown(table)
    assert "| Sparsemax | 18.00 (n=1) | — | 31.20 |  | 5.0 (n=1) |" in text
    header = next(line for line in text.splitlines() if line.startswith("| System"))
    assert header.endswith(
        "| empty hypotheses: reproduced, mean ± std (n) (paper profile on iwslt17_de_en) |"
    )  # nothing published, no Δ
    cells = {row.system: row.cells for row in table.rows}
    assert cells["Transformer (softmax)"]["empty"].values == (0.0, 2.0)
    plain = ast_bleu_table(bleu, "smoke", "smoke")
    assert [m.key for m in plain.metrics] == ["bleu"] and "Empty" not in plain.caption


# ---------------------------------------------------------------------------- speed


def _round(variant: str, speeds: tuple[float, float], ratios: tuple[float, float]) -> dict:
    """One measurement round of ``variant`` as the speed stage writes it."""
    return {
        "variant": variant,
        "train_tokens_per_second": speeds[0],
        "inference_tokens_per_second": speeds[1],
        "train_ratio_to_softmax": ratios[0],
        "inference_ratio_to_softmax": ratios[1],
    }


SPEED_ROWS = [
    _round("softmax", (1000, 200), (1.0, 1.0)),
    _round("softmax", (1200, 100), (1.0, 1.0)),
    _round("entmax_alpha", (250, 20), (0.25, 0.1)),
    _round("entmax_alpha", (600, 20), (0.5, 0.2)),
]


def test_speed_table_shows_the_given_ratios_beside_the_published_ones() -> None:
    table = speed_comparison_table(SPEED_ROWS, profile="paper", device="cpu", data="iwslt14_de_en")
    cells = {row.system: row.cells for row in table.rows}
    alpha = cells["α-entmax"]
    assert alpha["train_ratio"].values == (0.25, 0.5)  # one per round, as given
    assert alpha["inference_ratio"].values == (0.1, 0.2)
    assert alpha["train_speed"].values == (250.0, 600.0)
    est, ast = alpha["train_ratio"].references
    assert est.value == pytest.approx(13 / 49) and ast.value == pytest.approx(0.75)
    assert alpha["inference_ratio"].references[0].value == pytest.approx(0.6 / 7.0)
    assert alpha["train_speed"].references[0].value == pytest.approx(13000)
    assert cells["Transformer (softmax)"]["train_ratio"].values == (1.0, 1.0)
    diff = {
        (r["metric"], r["reference"]): r["diff"]
        for r in _csv_rows(table)
        if r["system"] == "α-entmax"
    }
    assert float(diff["train_ratio", est.column]) == pytest.approx(0.375 - 13 / 49)
    assert diff["train_ratio", ast.column] == ""  # AST's in-text speed: no data set attached
    assert diff["train_speed", est.column] == ""  # absolute speeds are hardware-dependent


def test_speed_table_reads_the_ratios_and_computes_none() -> None:
    rows = [
        _round("entmax15", (90, 9), (0.8, 0.7)),  # not 90/100 and 9/10: the stage's numbers win
        _round("softmax", (100, 10), (1.0, 1.0)),
    ]
    table = speed_comparison_table(rows, profile="smoke", device="cpu", data="smoke")
    assert [row.system for row in table.rows] == ["Transformer (softmax)", "1.5-entmax"]
    entmax15 = table.rows[1].cells
    assert entmax15["train_ratio"].values == (0.8,)
    assert entmax15["inference_ratio"].values == (0.7,)
    est, ast = entmax15["train_ratio"].references
    assert est.value == pytest.approx(40 / 49) and ast.value == pytest.approx(0.9)
    assert "- device: cpu" in to_markdown(table)
    # a speed cell's values are the timing rounds of one model, not seeds
    assert "- timing rounds (n per cell): 1" in to_markdown(table)
    assert "seeds (n per cell)" not in to_markdown(table)


def test_speed_table_says_why_its_ratios_differ_from_ests() -> None:
    """The caption, beside the numbers: fixed-length decoding always, and the fused kernels'
    part only when the speed stage ran on them."""
    fused = to_markdown(
        speed_comparison_table(SPEED_ROWS, "smoke", "cpu", "smoke", None, fused_kernels=True)
    )
    eager = to_markdown(speed_comparison_table(SPEED_ROWS, "smoke", "cuda", "smoke"))
    for caption in (fused, eager):
        assert "decodes at fixed length" in caption and "not the methods" in caption
    assert "fused kernels" in fused and "'(eager)' rows" in fused
    assert "fused kernels" not in eager


def test_speed_table_shows_the_median_ratio_its_spread_and_the_noisy_flag() -> None:
    spreads = {
        "entmax_alpha": {
            "train": {"ratio": 0.375, "ratio_quartiles": [0.3125, 0.4375], "noisy": True},
            "inference": {"ratio": 0.15, "ratio_quartiles": [0.14, 0.16], "noisy": False},
        }
    }
    table = speed_comparison_table(SPEED_ROWS, "smoke", "cpu", "smoke", spreads)
    cells = {row.system: row.cells for row in table.rows}
    assert cells["α-entmax"]["train_ratio"].note == "median 0.38, IQR 0.31–0.44, noisy"
    assert cells["α-entmax"]["inference_ratio"].note == "median 0.15, IQR 0.14–0.16"
    assert cells["Transformer (softmax)"]["train_ratio"].note is None  # no summary given
    assert "median 0.38, IQR 0.31–0.44, noisy" in to_markdown(table)
    assert "Ratios marked noisy varied by more than 10%" in to_markdown(table)
    quiet = {"entmax_alpha": {"train": {**spreads["entmax_alpha"]["inference"]}}}
    quiet_table = speed_comparison_table(SPEED_ROWS, "smoke", "cpu", "smoke", quiet)
    assert "Ratios marked noisy" not in to_markdown(quiet_table)
    with pytest.raises(LearnableSparsityError, match=r"spreads\[entmax_alpha\]\[train\] lacks"):
        speed_comparison_table(
            SPEED_ROWS, "smoke", "cpu", "smoke", {"entmax_alpha": {"train": {"ratio": 0.3}}}
        )


def test_speed_table_needs_the_softmax_baseline() -> None:
    with pytest.raises(LearnableSparsityError, match="softmax baseline is missing"):
        speed_comparison_table(SPEED_ROWS[2:], profile="smoke", device="cpu", data="smoke")


@pytest.mark.parametrize(
    "key",
    [
        "train_tokens_per_second",
        "inference_tokens_per_second",
        "train_ratio_to_softmax",
        "inference_ratio_to_softmax",
    ],
)
def test_speed_table_names_the_row_that_lacks_a_value(key: str) -> None:
    rows = [*SPEED_ROWS[:2], {k: v for k, v in SPEED_ROWS[2].items() if k != key}]
    with pytest.raises(LearnableSparsityError, match=rf"rows\[2\] \(entmax_alpha\) lacks '{key}'"):
        speed_comparison_table(rows, profile="smoke", device="cpu", data="smoke")


@pytest.mark.parametrize(
    ("ratio", "match"),
    [
        (-0.5, r"must lie in \[0\.0, inf\], got -0\.5"),
        ("0.5", "must be a finite number, got '0.5'"),
        (None, "must be a finite number, got None"),
        (math.nan, "must be a finite number, got nan"),
    ],
)
def test_speed_table_rejects_ratios_that_are_not_numbers_ge_0(ratio: object, match: str) -> None:
    rows = [*SPEED_ROWS[:3], {**SPEED_ROWS[3], "inference_ratio_to_softmax": ratio}]
    with pytest.raises(
        LearnableSparsityError, match=rf"rows\[3\] inference_ratio_to_softmax {match}"
    ):
        speed_comparison_table(rows, profile="smoke", device="cpu", data="smoke")


# ---------------------------------------------------------------------------- attention heads


def _role(count: int | None, confidences: tuple[float, ...] = ()) -> dict:
    """One role of one seed as ``learnable_sparsity.analysis.heads.summary`` writes it (None:
    n/m)."""
    heads = [
        {"block": "encoder.self.layer0", "head": h, "confidence": c}
        for h, c in enumerate(confidences)
    ]
    return {
        "measurable": count is not None,
        "matched": 0 if count is None else 100,
        "threshold": 0.8,
        "count": count,
        "heads": heads,
    }


def _seed(**roles: dict) -> dict:
    """Every role of one seed: 0 heads found unless given; thresholds as in params.yaml."""
    return {
        role: {**roles.get(role, _role(0)), "threshold": 0.9 if "positional" in role else 0.8}
        for role in ("positional_prev", "positional_next", "bpe_merge", "interrogation")
    }


ROLES = {
    "entmax_alpha": [
        _seed(
            positional_prev=_role(3, (0.95, 0.97, 0.91)),
            positional_next=_role(1, (0.93,)),
            interrogation=_role(None),
        ),
        _seed(positional_prev=_role(1, (0.90,)), interrogation=_role(None)),
    ],
    "softmax": [_seed(bpe_merge=_role(1, (0.85,)), interrogation=_role(None))],
}


def _best(block: str, head: int, score: float, alpha: float | None = None) -> dict:
    """The strongest head of one role as ``learnable_sparsity.analysis.heads.summary`` writes it."""
    return {"block": block, "head": head, "alpha": alpha, "score": score, "confidence": score}


# The strongest head of every role with a score (interrogation: not measurable, none).
BEST = {
    "entmax_alpha": [
        {
            "positional_prev": _best("encoder.self.layer0", 0, 0.97, 1.31),
            "positional_next": _best("encoder.self.layer0", 1, 0.93, 1.62),
            "bpe_merge": _best("decoder.self.layer1", 3, 0.4567, 1.05),
        },
        {
            "positional_prev": _best("encoder.self.layer0", 0, 0.91, 1.42),
            "positional_next": _best("encoder.self.layer1", 2, 0.5, 1.75),
            "bpe_merge": _best("encoder.self.layer1", 0, 0.6, 1.2),
        },
    ],
    "softmax": [
        {
            "positional_prev": _best("decoder.self.layer1", 2, 0.2415),
            "positional_next": _best("encoder.self.layer1", 2, 0.126),
            "bpe_merge": _best("decoder.self.layer0", 0, 0.85),
        }
    ],
}
JS = {
    "softmax": {"decoder.self.layer0": [0.1, 0.2], "encoder.self.layer1": 0.3},
    "entmax_alpha": {"encoder.self.layer0": 0.5},
}


def test_head_summary_js_per_block_and_role_counts() -> None:
    js, roles = head_summary_table(JS, ROLES, BEST, profile="paper", data="wmt14_en_de")
    assert [row.system for row in js.rows] == [
        "encoder.self.layer0",
        "encoder.self.layer1",
        "decoder.self.layer0",
    ]
    assert [m.key for m in js.metrics] == ["softmax", "entmax_alpha"]
    assert "| decoder.self.layer0 | 0.150 ± 0.071 (n=2) | — |" in to_markdown(js)
    cells = {row.system: row.cells for row in roles.rows}
    prev = cells["α-entmax — positional (previous token)"]
    assert prev["heads"].values == (3.0, 1.0) and prev["heads"].references[0].value == 4
    assert prev["median_confidence"].values == pytest.approx((95.0, 90.0))
    assert prev["median_confidence"].references[0].value == pytest.approx(95.9)
    bpe = cells["α-entmax — BPE merging"]["median_confidence"].references[0]
    assert bpe.value == pytest.approx((88.5 + 89.8) / 2)
    softmax_prev = cells["Transformer (softmax) — positional (previous token)"]
    assert softmax_prev["heads"].values == (0.0,)
    diffs = {(r["system"], r["metric"]): r["diff"] for r in _csv_rows(roles)}
    assert float(diffs["α-entmax — positional (previous token)", "heads"]) == pytest.approx(-2)


def test_head_roles_that_cannot_be_measured_read_not_measurable() -> None:
    _, roles = head_summary_table(JS, ROLES, BEST, profile="smoke", data="smoke")
    cells = {row.system: row.cells for row in roles.rows}
    interrogation = cells["α-entmax — interrogation"]
    assert interrogation["heads"].values == () and interrogation["heads"].note == "not measurable"
    markdown = to_markdown(roles)
    assert "| α-entmax — interrogation | not measurable | — | not measurable | — |" in markdown
    assert "| α-entmax — BPE merging | 0 ± 0 (n=2) — none" in markdown  # measured: 0, not n/m
    assert "not measurable" in roles.caption
    notes = {(r["system"], r["metric"]): r["note"] for r in _csv_rows(roles)}
    assert notes["Transformer (softmax) — interrogation", "heads"] == "not measurable"
    assert notes["Transformer (softmax) — BPE merging", "heads"] == ""


def test_head_summary_rejects_unknown_blocks_and_roles() -> None:
    with pytest.raises(LearnableSparsityError, match=r"encoder\.cross"):
        head_summary_table(
            {"softmax": {"encoder.cross.layer0": 0.1}}, {}, {}, profile="smoke", data="smoke"
        )
    with pytest.raises(LearnableSparsityError, match="'copy'"):
        head_summary_table(
            JS, {"softmax": [{**_seed(), "copy": _role(1)}]}, BEST, profile="smoke", data="smoke"
        )
    missing = {k: v for k, v in _seed().items() if k != "bpe_merge"}
    with pytest.raises(LearnableSparsityError, match=r"\['bpe_merge'\] is missing"):
        head_summary_table(JS, {"softmax": [missing]}, BEST, profile="smoke", data="smoke")
    with pytest.raises(LearnableSparsityError, match=r"best_by_variant\['softmax'\] has 0 seeds"):
        head_summary_table(JS, ROLES, {**BEST, "softmax": []}, profile="smoke", data="smoke")


def test_head_roles_no_head_passes_shows_the_strongest_head_and_its_score() -> None:
    _, roles = head_summary_table(JS, ROLES, BEST, profile="smoke", data="smoke")
    cells = {row.system: row.cells for row in roles.rows}
    prev = cells["Transformer (softmax) — positional (previous token)"]["heads"]
    assert prev.values == (0.0,)
    assert prev.note == "none passes; best: decoder.self.layer1 h2, 0.24 < 0.90"
    markdown = to_markdown(roles)
    assert (
        "| Transformer (softmax) — positional (previous token) | 0 (n=1) — none passes; "
        "best: decoder.self.layer1 h2, 0.24 < 0.90 | 3 |"
    ) in markdown
    # α-entmax names the head's α; several seeds name the run(s) without a head.
    assert cells["α-entmax — BPE merging"]["heads"].note == (
        "none passes on run 1, best: decoder.self.layer1 h3, 0.46 < 0.80, α=1.05; "
        "none passes on run 2, best: encoder.self.layer1 h0, 0.60 < 0.80, α=1.20"
    )
    assert cells["α-entmax — positional (next token)"]["heads"].note == (
        "none passes on run 2, best: encoder.self.layer1 h2, 0.50 < 0.90, α=1.75"
    )
    notes = {(r["system"], r["metric"]): r["note"] for r in _csv_rows(roles)}
    assert notes["Transformer (softmax) — positional (next token)", "heads"].startswith(
        "none passes; best: encoder.self.layer1 h2, 0.13 < 0.90"
    )
    assert "none passes" in roles.caption


def test_head_roles_that_pass_show_counts_without_a_best_head() -> None:
    _, roles = head_summary_table(JS, ROLES, BEST, profile="smoke", data="smoke")
    cells = {row.system: row.cells for row in roles.rows}
    prev = cells["α-entmax — positional (previous token)"]["heads"]
    assert prev.values == (3.0, 1.0) and prev.note is None
    assert cells["Transformer (softmax) — BPE merging"]["heads"].note is None
    assert "| α-entmax — positional (previous token) | 2 ± 1 (n=2) | 4 |" in to_markdown(roles)
    interrogation = cells["α-entmax — interrogation"]["heads"]
    assert interrogation.note == "not measurable"  # never a best head: nothing was measured
