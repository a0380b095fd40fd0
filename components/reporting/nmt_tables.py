r"""The NMT comparison tables: BLEU, speed and attention heads of the attention variants.

Builders of :class:`~components.reporting.table.ComparisonTable` from the NMT stages' plain
metric dicts; each docstring gives the expected input shape.

* :func:`ast_bleu_table` — test BLEU beside AST Table 4.1 and EST Table 4 (de-en).
* :func:`speed_comparison_table` — training and inference tokens/s and their ratios to softmax
  (computed by the speed stage) beside EST Table 4 and AST's in-text training speeds.
* :func:`head_summary_table` — head diversity (Jensen–Shannon) per attention block, and the
  head-role counts beside AST's positional and BPE-merging heads.

Variants are named as in :data:`VARIANT_LABELS` (their display names, in the row order of EST
Table 4), head roles as in ``components.analysis.blocks.ROLES`` (display names:
:data:`ROLE_LABELS`); corpora as in ``components.data.registry``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from components.analysis.blocks import ROLES, block_order
from components.errors import LearnableSparsityError
from components.reporting.published import (
    AST_HEADS_CORPUS,
    EST_SPEED_CORPUS,
    paper_table,
    published_row,
)
from components.reporting.table import (
    Cell,
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    check_known,
    check_names,
    check_number,
    check_ordered,
    check_seed_values,
    file_stem,
)

# Display names of the attention variants, in the row order of EST Table 4.
VARIANT_LABELS: dict[str, str] = {
    "softmax": "Transformer (softmax)",
    "sparsemax": "Sparsemax",
    "entmax15": "1.5-entmax",
    "entmax_alpha": "α-entmax",
    "topk": "top-k",
}
_BLEU_ORDER = ("softmax", "entmax15", "entmax_alpha", "sparsemax", "topk")
_AST_BLEU_SYSTEMS = {
    "softmax": "softmax",
    "entmax15": "1.5-entmax",
    "entmax_alpha": "alpha-entmax (learned alpha per head)",
}
_EST_SYSTEMS = {
    "softmax": "Transformer (softmax)",
    "sparsemax": "Sparsemax (Martins & Astudillo, 2016)",
    "entmax15": "Entmax-1.5 (Peters et al., 2019)",
    "entmax_alpha": "Entmax-alpha (Correia et al., 2019)",
    "topk": "Proposal (top-k before softmax)",
}


def ast_bleu_table(
    bleu_by_variant_seed: Mapping[str, Sequence[float]],
    profile: str,
    data: str | Sequence[str],
    signature: str | Sequence[str] | None = None,
) -> ComparisonTable:
    """Test BLEU of the attention variants beside AST Table 4.1 and EST Table 4 (de-en).

    ``bleu_by_variant_seed``: {variant: [BLEU of each seed]} with variants among softmax,
    entmax15, entmax_alpha, sparsemax, topk (rows in that order; only given variants appear).
    ``data``: the corpus (or corpora) the BLEU was measured on. Published columns: the AST
    column of that corpus when it is one of AST's four (iwslt17_de_en, kftt_ja_en, wmt16_ro_en,
    wmt14_en_de), otherwise all four for reference; and EST Table 4 BLEU de-en
    (iwslt14_de_en) for every variant. ``signature``: the sacreBLEU signature(s).
    """
    corpora = check_names("data", data)
    variants = check_ordered("variant", bleu_by_variant_seed, _BLEU_ORDER)
    ast = paper_table("ast_mt_bleu")
    ast_corpora = [m["name"].removeprefix("bleu_") for m in ast["metrics"]]
    shown = [c for c in ast_corpora if c in corpora] or ast_corpora
    est_id = "est_sparse_attention_speed"
    rows = []
    for variant in variants:
        refs = [
            Reference(
                f"published {corpus} (AST Table 4.1)",
                published_row("ast_mt_bleu", _AST_BLEU_SYSTEMS[variant])[f"bleu_{corpus}"]
                if variant in _AST_BLEU_SYSTEMS
                else None,
                data=corpus,
            )
            for corpus in shown
        ]
        refs.append(
            Reference(
                f"published {EST_SPEED_CORPUS} (EST Table 4)",
                published_row(est_id, _EST_SYSTEMS[variant])["bleu_de_en"],
                data=EST_SPEED_CORPUS,
            )
        )
        values = check_seed_values(
            f"bleu_by_variant_seed[{variant!r}]", bleu_by_variant_seed[variant]
        )
        rows.append(Row(VARIANT_LABELS[variant], {"bleu": Cell(values, tuple(refs))}))
    return ComparisonTable(
        name=file_stem("ast_bleu", corpora),
        title=f"NMT test BLEU by attention variant ({', '.join(corpora)})",
        caption=(
            "Test BLEU of the Transformer with each attention normalizer. Reproduced BLEU is "
            "sacreBLEU (signature below); AST Table 4.1 reports tokenized BLEU and EST Table 4 "
            "BLEU on IWSLT 2014 De-En, so small differences can come from tokenization alone."
        ),
        metrics=(Metric("bleu", "BLEU"),),
        rows=tuple(rows),
        provenance=Provenance(profile, corpora, check_names("signature", signature)),
        sources=(ast["source"], paper_table(est_id)["source"]),
    )


# Per phase: the input key of the measured tokens/s and of its ratio to softmax.
_SPEED_KEYS = {
    "train": ("train_tokens_per_second", "train_ratio_to_softmax"),
    "inference": ("inference_tokens_per_second", "inference_ratio_to_softmax"),
}
_EST_SPEED_KEYS = {"train": "train_speed_ktok_per_s", "inference": "infer_speed_ktok_per_s"}
_AST_SPEED_SYSTEMS = {"entmax15": "1.5-entmax", "entmax_alpha": "alpha-entmax"}


def speed_comparison_table(
    rows: Sequence[Mapping[str, Any]],
    profile: str,
    device: str,
    data: str | Sequence[str],
) -> ComparisonTable:
    """Training / inference tokens per second and their ratios to softmax, as in EST Table 4.

    ``rows``: [{"variant": …, "train_tokens_per_second": …, "inference_tokens_per_second": …,
    "train_ratio_to_softmax": …, "inference_ratio_to_softmax": …}], one per variant and
    measurement round (variants as in ``VARIANT_LABELS``, softmax required); every value a
    number ≥ 0. The ratios are the speed stage's (tokens/s of the variant ÷ tokens/s of softmax);
    this table shows them as given and computes none. Published: EST Table 4 speeds (thousand
    tokens/s, shown ×1000) and their ratios to its softmax row, measured on iwslt14_de_en, and
    AST's in-text training speeds relative to softmax (α-entmax 75%, 1.5-entmax 90%; no data set
    is attached, so no difference is computed). Absolute speeds depend on the hardware and are
    never differenced. ``data``: the corpus the speeds were measured on.
    """
    corpora = check_names("data", data)
    measured: dict[str, dict[str, list[float]]] = {}
    for i, row in enumerate(rows):
        variant = check_known(f"rows[{i}] variant", row.get("variant"), VARIANT_LABELS)
        values = measured.setdefault(variant, {})
        for phase, keys in _SPEED_KEYS.items():
            for cell, key in zip((f"{phase}_speed", f"{phase}_ratio"), keys, strict=True):
                if key not in row:
                    raise LearnableSparsityError(f"rows[{i}] ({variant}) lacks {key!r}")
                number = check_number(f"rows[{i}] {key}", row[key], low=0.0)
                values.setdefault(cell, []).append(number)
    if "softmax" not in measured:
        raise LearnableSparsityError(f"the softmax baseline is missing, got {sorted(measured)}")
    est_id = "est_sparse_attention_speed"
    est_softmax = published_row(est_id, _EST_SYSTEMS["softmax"])
    est_source = f"published {EST_SPEED_CORPUS} (EST Table 4, FP16)"
    table_rows = []
    for variant in check_ordered("variant", measured, VARIANT_LABELS):
        est = published_row(est_id, _EST_SYSTEMS[variant])
        cells = {}
        for phase in _SPEED_KEYS:
            published = est[_EST_SPEED_KEYS[phase]]
            ratio_refs = [
                Reference(
                    est_source,
                    published / est_softmax[_EST_SPEED_KEYS[phase]],
                    data=EST_SPEED_CORPUS,
                )
            ]
            if phase == "train" and variant in _AST_SPEED_SYSTEMS:
                pct = published_row("ast_training_speed", _AST_SPEED_SYSTEMS[variant])
                ratio_refs.append(
                    Reference("published AST (in text)", pct["relative_train_speed_pct"] / 100)
                )
            cells[f"{phase}_speed"] = Cell(
                tuple(measured[variant][f"{phase}_speed"]),
                (Reference(est_source, published * 1000, data=EST_SPEED_CORPUS),),
            )
            cells[f"{phase}_ratio"] = Cell(
                tuple(measured[variant][f"{phase}_ratio"]), tuple(ratio_refs)
            )
        table_rows.append(Row(VARIANT_LABELS[variant], cells))
    return ComparisonTable(
        name=file_stem("speed", corpora),
        title="Training and inference speed by attention variant (EST Table 4 layout)",
        caption=(
            "Tokens per second of the same Transformer with each attention normalizer, and the "
            "ratio to softmax (per measurement round). EST measured with FP16 training and "
            "128-sentence inference batches on unstated hardware: absolute speeds are shown for "
            "reference only, ratios are the comparable quantity."
        ),
        metrics=(
            Metric("train_speed", "train tokens/s", digits=0, comparable=False),
            Metric("train_ratio", "train ratio to softmax"),
            Metric("inference_speed", "inference tokens/s", digits=0, comparable=False),
            Metric("inference_ratio", "inference ratio to softmax"),
        ),
        rows=tuple(table_rows),
        provenance=Provenance(profile, corpora, device=device),
        sources=(
            paper_table(est_id)["source"],
            paper_table("ast_training_speed")["source"],
        ),
    )


_AST_HEAD_SYSTEMS = {"softmax": "softmax", "entmax15": "1.5-entmax", "entmax_alpha": "alpha-entmax"}
ROLE_LABELS: dict[str, str] = {
    "positional_prev": "positional (previous token)",
    "positional_next": "positional (next token)",
    "bpe_merge": "BPE merging",
    "interrogation": "interrogation",
}


def _published_roles(variant: str, role: str) -> tuple[float | None, float | None]:
    """(number of heads, median confidence %) that AST reports for ``variant`` and ``role``."""
    if variant not in _AST_HEAD_SYSTEMS or role == "interrogation":
        return None, None
    system = _AST_HEAD_SYSTEMS[variant]
    if role == "positional_prev":
        row = published_row("ast_positional_heads", system)
        return row["n_heads"], row["median_confidence_pct"]
    if role == "positional_next":
        row = published_row("ast_positional_heads", "each of the three models")
        return row["n_heads"], row["confidence_pct_approx"]
    row = published_row("ast_bpe_merging_heads", system)
    scores = row["scores_pct"]
    return row["heads_above_80pct"], statistics.median(scores) if scores else None


def head_summary_table(
    js_by_variant: Mapping[str, Mapping[str, float | Sequence[float]]],
    roles: Sequence[Mapping[str, Any]],
    profile: str,
    data: str | Sequence[str],
) -> tuple[ComparisonTable, ComparisonTable]:
    """Two tables: head diversity (JS) per attention block, and head-role counts.

    ``js_by_variant``: {variant: {block key: mean JS}} with block keys as in
    :meth:`components.analysis.heads.HeadAnalysis.result` ("encoder.self.layer0", …; layers
    0-based) and a float (one model) or a list of per-seed floats per block. ``roles``: the
    entries of :func:`components.analysis.heads.roles`, each with an added "variant"; only
    "role", "variant" and "confidence" (in [0, 1]) are read. ``data``: the corpus analysed.

    The JS table has one row per block and one column per variant (nothing is published). The
    role table has one row per (variant, role) with the number of heads found and their median
    confidence (%), beside AST's positional and BPE-merging heads (WMT 2014 en→de models; the
    next-token figures are "each of the three models", ≈95%; the BPE median is the median of
    the published scores).
    """
    corpora = check_names("data", data)
    role_variants = [
        check_known(f"roles[{i}] variant", r.get("variant"), VARIANT_LABELS)
        for i, r in enumerate(roles)
    ]
    variants = check_ordered("variant", [*js_by_variant, *role_variants], VARIANT_LABELS)
    provenance = Provenance(profile, corpora)
    blocks = sorted({b for by_block in js_by_variant.values() for b in by_block}, key=block_order)
    js_variants = [v for v in variants if v in js_by_variant]
    js_table = ComparisonTable(
        name=file_stem("head_js", corpora),
        title="Head diversity (Jensen–Shannon divergence) per attention block",
        caption=(
            "Mean generalized Jensen–Shannon divergence among the heads of each block "
            "(0 = identical heads); layers are 0-based. No published values exist."
        ),
        metrics=tuple(Metric(v, VARIANT_LABELS[v], digits=3) for v in js_variants),
        rows=tuple(
            Row(
                block,
                {
                    v: Cell(
                        check_seed_values(
                            f"js_by_variant[{v!r}][{block!r}]", js_by_variant[v][block]
                        )
                    )
                    for v in js_variants
                    if block in js_by_variant[v]
                },
            )
            for block in blocks
        ),
        provenance=provenance,
        row_header="Attention block",
    )
    confidences: dict[tuple[str, str], list[float]] = {}
    for i, entry in enumerate(roles):
        role = check_known(f"roles[{i}] role", entry.get("role"), ROLES)
        confidence = check_number(f"roles[{i}] confidence", entry.get("confidence"), 0.0, 1.0)
        confidences.setdefault((role_variants[i], role), []).append(100 * confidence)
    source = f"published {AST_HEADS_CORPUS} (AST)"
    role_rows = []
    for variant in variants:
        for role in ROLES:
            found = confidences.get((variant, role), [])
            heads, median = _published_roles(variant, role)
            role_rows.append(
                Row(
                    f"{VARIANT_LABELS[variant]} — {ROLE_LABELS[role]}",
                    {
                        "heads": Cell(
                            (float(len(found)),), (Reference(source, heads, data=AST_HEADS_CORPUS),)
                        ),
                        "median_confidence": Cell(
                            (statistics.median(found),) if found else (),
                            (Reference(source, median, data=AST_HEADS_CORPUS),),
                        ),
                    },
                )
            )
    role_table = ComparisonTable(
        name=file_stem("head_roles", corpora),
        title="Specialized attention heads by role",
        caption=(
            "Heads whose role score passes the analysis threshold, and their median score (%). "
            "AST counts BPE-merging heads above 80%; its next-token figures hold for each of "
            "the three models (≈95%)."
        ),
        metrics=(
            Metric("heads", "heads", digits=0),
            Metric("median_confidence", "median confidence (%)", digits=1),
        ),
        rows=tuple(role_rows),
        provenance=provenance,
        sources=tuple(
            paper_table(i)["source"] for i in ("ast_positional_heads", "ast_bpe_merging_heads")
        ),
    )
    return js_table, role_table
