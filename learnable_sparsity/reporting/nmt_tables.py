r"""The NMT comparison tables: BLEU, speed and attention heads of the attention variants.

Builders of :class:`~learnable_sparsity.reporting.table.ComparisonTable` from the NMT stages' plain
metric dicts; each docstring gives the expected input shape.

* :func:`ast_bleu_table` — test BLEU beside AST Table 4.1 and EST Table 4 (de-en), and the
  number of empty hypotheses.
* :func:`speed_comparison_table` — training and inference tokens/s and their ratios to softmax
  (computed by the speed stage) beside EST Table 4 and AST's in-text training speeds.
* :func:`head_summary_table` — head diversity (Jensen–Shannon) per attention block, and the
  head-role counts beside AST's positional and BPE-merging heads ("not measurable" where the
  corpus gives a role nothing to measure on; the strongest head where none passes).

Variants are the names of ``learnable_sparsity.core.registry.NORMALIZERS`` (the params key
``nmt.variants`` lists normalizer names): each one's ``label`` is its row name, its ``published``
names find its rows in the published tables (a table that does not report it gets no published
number there), and the registry's order (EST Table 4's) is the row order; head roles as in
``learnable_sparsity.analysis.blocks.ROLES`` (display names: :data:`ROLE_LABELS`); corpora as in
``learnable_sparsity.data.registry``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from learnable_sparsity.analysis.blocks import ROLES, block_order
from learnable_sparsity.core.registry import (
    AST_BLEU,
    AST_BPE_HEADS,
    AST_POSITIONAL_HEADS,
    AST_SPEED,
    EST_TABLE_4,
    NORMALIZERS,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.reporting.published import (
    AST_HEADS_CORPUS,
    EST_SPEED_CORPUS,
    paper_table,
    published_row,
)
from learnable_sparsity.reporting.table import (
    ComparisonTable,
    Metric,
    Provenance,
    Reference,
    Row,
    TableCell,
    check_known,
    check_names,
    check_number,
    check_ordered,
    check_seed_values,
    file_stem,
)

# sacreBLEU with tokenize none splits on whitespace only: the number means something only when
# the text was tokenised beforehand (the smoke corpus, KFTT's tokenized files).
TOKENIZED_BLEU_LABEL = "BLEU (tok none, pre-tokenised text only)"


def variant_labels() -> dict[str, str]:
    """{variant: its row name}, in the registry's order (EST Table 4's rows)."""
    return {name: normalizer.label for name, normalizer in NORMALIZERS.items()}


def _bleu_order() -> tuple[str, ...]:
    """The BLEU table's rows: the variants AST Table 4.1 reports, then the others (each group in
    the registry's order)."""
    reported = [name for name, n in NORMALIZERS.items() if AST_BLEU in n.published]
    return (*reported, *(name for name in NORMALIZERS if name not in reported))


def _published(table_id: str, variant: str) -> dict[str, Any] | None:
    """The row of published table ``table_id`` for ``variant``; None when it reports none."""
    system = NORMALIZERS[variant].published.get(table_id)
    return None if system is None else published_row(table_id, system)


def _published_value(table_id: str, variant: str, key: str) -> float | None:
    """Field ``key`` of :func:`_published`, None when the table reports no row."""
    row = _published(table_id, variant)
    return None if row is None else row[key]


def ast_bleu_table(
    bleu_by_variant_seed: Mapping[str, Sequence[float]],
    profile: str,
    data: str | Sequence[str],
    signature: str | Sequence[str] | None = None,
    empty_by_variant_seed: Mapping[str, Sequence[float]] | None = None,
) -> ComparisonTable:
    """Test BLEU of the attention variants beside AST Table 4.1 and EST Table 4 (de-en).

    ``bleu_by_variant_seed``: {variant: [tokenized BLEU of each seed]} (sacreBLEU with
    ``tokenize="none"``, as the papers report: meaningful on pre-tokenised text only; the column
    header says so) with variants among the registered normalizers (rows: those AST Table 4.1
    reports first, softmax, entmax15, entmax_alpha, then sparsemax, topk and any other; only
    given variants appear). ``data``: the corpus (or corpora) the BLEU was
    measured on. Published columns: the AST column of that corpus when it is one of AST's four
    (iwslt17_de_en, kftt_ja_en, wmt16_ro_en, wmt14_en_de), otherwise all four for reference; and
    EST Table 4 BLEU de-en (iwslt14_de_en) for every variant. ``signature``: the sacreBLEU
    signature(s). ``empty_by_variant_seed``: {variant: [empty hypotheses of each seed]}, shown
    in a column of its own when given (nothing is published).
    """
    corpora = check_names("data", data)
    variants = check_ordered("variant", bleu_by_variant_seed, _bleu_order())
    ast = paper_table("ast_mt_bleu")
    ast_corpora = [m["name"].removeprefix("bleu_") for m in ast["metrics"]]
    shown = [c for c in ast_corpora if c in corpora] or ast_corpora
    rows = []
    for variant in variants:
        refs = [
            Reference(
                f"published {corpus} (AST Table 4.1)",
                _published_value(AST_BLEU, variant, f"bleu_{corpus}"),
                data=corpus,
            )
            for corpus in shown
        ]
        refs.append(
            Reference(
                f"published {EST_SPEED_CORPUS} (EST Table 4)",
                _published_value(EST_TABLE_4, variant, "bleu_de_en"),
                data=EST_SPEED_CORPUS,
            )
        )
        values = check_seed_values(
            f"bleu_by_variant_seed[{variant!r}]", bleu_by_variant_seed[variant]
        )
        cells = {"bleu": TableCell(values, tuple(refs))}
        if empty_by_variant_seed is not None and variant in empty_by_variant_seed:
            cells["empty"] = TableCell(
                check_seed_values(
                    f"empty_by_variant_seed[{variant!r}]", empty_by_variant_seed[variant]
                )
            )
        rows.append(Row(NORMALIZERS[variant].label, cells))
    metrics = [Metric("bleu", TOKENIZED_BLEU_LABEL)]
    caption = (
        "Test BLEU of the Transformer with each attention normalizer. Reproduced BLEU is "
        "sacreBLEU with tokenize none (signature below), as AST Table 4.1 reports tokenized "
        "BLEU: it splits on whitespace only, so it is meaningful on pre-tokenised text only (on "
        "raw text punctuation stays glued to the words). EST Table 4 reports BLEU on IWSLT 2014 "
        "De-En; small differences can come from tokenization alone."
    )
    if empty_by_variant_seed is not None:
        metrics.append(Metric("empty", "empty hypotheses", digits=1, comparable=False))
        caption += (
            " Empty hypotheses: test sentences for which the decoder emitted end-of-sentence at "
            "once."
        )
    return ComparisonTable(
        name=file_stem("ast_bleu", corpora),
        title=f"NMT test BLEU by attention variant ({', '.join(corpora)})",
        caption=caption,
        metrics=tuple(metrics),
        rows=tuple(rows),
        provenance=Provenance(profile, corpora, check_names("signature", signature)),
        sources=(ast["source"], paper_table(EST_TABLE_4)["source"]),
    )


# Per phase: the input key of the measured tokens/s and of its ratio to softmax.
_SPEED_KEYS = {
    "train": ("train_tokens_per_second", "train_ratio_to_softmax"),
    "inference": ("inference_tokens_per_second", "inference_ratio_to_softmax"),
}
_EST_SPEED_KEYS = {"train": "train_speed_ktok_per_s", "inference": "infer_speed_ktok_per_s"}


# Why measured ratios differ from EST's, said where the reader sees them.
_SPEED_CAVEAT = (
    "Inference decodes at fixed length, so every variant generates the same tokens. The ratios "
    "compare implementations on this hardware, not the methods."
)
_FUSED_SPEED_CAVEAT = (
    "On CPU the normalizers run as fused kernels (their gain over the PyTorch solvers: the "
    "'(eager)' rows of `results/benchmarks/normalizers.json`), and the attention normalizer is a "
    "smaller share of a small model's step than in EST's GPU Transformer, so the ratios sit "
    "closer to 1 than EST's. " + _SPEED_CAVEAT
)

# A noisy ratio is not a finding: e.g. 1.5-entmax trained at 1.18x softmax's tokens/s (IQR
# 1.07-1.22) in a `make repro` whose every variant swung between 23K and 36K tokens/s from one
# measurement to the next, and at 0.99x (range 0.97-1.03) when the stage ran alone.
_NOISY_SPEED_CAVEAT = (
    " Ratios marked noisy varied by more than 10% between rounds: the machine's speed changed "
    "during the timing (other load, a shared host), so they are not findings; "
    "`dvc repro -f -s speed` on a quiet machine measures them again."
)


def _any_noisy(spreads: Mapping[str, Mapping[str, Mapping[str, Any]]] | None) -> bool:
    return any(
        summary.get("noisy") is True
        for phases in (spreads or {}).values()
        for summary in phases.values()
    )


def speed_comparison_table(
    rows: Sequence[Mapping[str, Any]],
    profile: str,
    device: str,
    data: str | Sequence[str],
    spreads: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    *,
    fused_kernels: bool = False,
) -> ComparisonTable:
    """Training / inference tokens per second and their ratios to softmax, as in EST Table 4.

    ``rows``: [{"variant": …, "train_tokens_per_second": …, "inference_tokens_per_second": …,
    "train_ratio_to_softmax": …, "inference_ratio_to_softmax": …}], one per variant and
    measurement round (variants: registered normalizers, softmax required); every value a
    number ≥ 0. The ratios are the speed stage's (tokens/s of the variant ÷ tokens/s of softmax);
    this table shows them as given and computes none. Published: EST Table 4 speeds (thousand
    tokens/s, shown ×1000) and their ratios to its softmax row, measured on iwslt14_de_en, and
    AST's in-text training speeds relative to softmax (α-entmax 75%, 1.5-entmax 90%; no data set
    is attached, so no difference is computed). Absolute speeds depend on the hardware and are
    never differenced. ``data``: the corpus the speeds were measured on. ``spreads`` (optional,
    the speed stage's summary): variant → phase → {"ratio": median of the per-round ratios,
    "ratio_quartiles": [q1, q3], "noisy": bool}; shown after the ratio cell as "median …,
    IQR …–…", with "noisy" when flagged. ``fused_kernels``: the normalizers ran on the fused
    CPU kernels; the caption then says how that moves the ratios towards 1.
    """
    corpora = check_names("data", data)
    labels = variant_labels()
    measured: dict[str, dict[str, list[float]]] = {}
    for i, row in enumerate(rows):
        variant = check_known(f"rows[{i}] variant", row.get("variant"), labels)
        values = measured.setdefault(variant, {})
        for phase, keys in _SPEED_KEYS.items():
            for cell, key in zip((f"{phase}_speed", f"{phase}_ratio"), keys, strict=True):
                if key not in row:
                    raise LearnableSparsityError(f"rows[{i}] ({variant}) lacks {key!r}")
                number = check_number(f"rows[{i}] {key}", row[key], low=0.0)
                values.setdefault(cell, []).append(number)
    if "softmax" not in measured:
        raise LearnableSparsityError(f"the softmax baseline is missing, got {sorted(measured)}")
    est_softmax = _published(EST_TABLE_4, "softmax")
    est_source = f"published {EST_SPEED_CORPUS} (EST Table 4, FP16)"
    table_rows = []
    for variant in check_ordered("variant", measured, labels):
        est = _published(EST_TABLE_4, variant)
        cells = {}
        for phase in _SPEED_KEYS:
            published = None if est is None else est[_EST_SPEED_KEYS[phase]]
            ratio_refs = [
                Reference(
                    est_source,
                    None if published is None else published / est_softmax[_EST_SPEED_KEYS[phase]],
                    data=EST_SPEED_CORPUS,
                )
            ]
            ast_speed = _published(AST_SPEED, variant)
            if phase == "train" and ast_speed is not None:
                ratio_refs.append(
                    Reference(
                        "published AST (in text)", ast_speed["relative_train_speed_pct"] / 100
                    )
                )
            cells[f"{phase}_speed"] = TableCell(
                tuple(measured[variant][f"{phase}_speed"]),
                (
                    Reference(
                        est_source,
                        None if published is None else published * 1000,
                        data=EST_SPEED_CORPUS,
                    ),
                ),
            )
            cells[f"{phase}_ratio"] = TableCell(
                tuple(measured[variant][f"{phase}_ratio"]),
                tuple(ratio_refs),
                note=_spread_note(spreads, variant, phase),
            )
        table_rows.append(Row(labels[variant], cells))
    return ComparisonTable(
        name=file_stem("speed", corpora),
        title="Training and inference speed by attention variant (EST Table 4 layout)",
        caption=(
            "Tokens per second of the same Transformer with each attention normalizer, and the "
            "ratio to softmax (per measurement round). EST measured with FP16 training and "
            "128-sentence inference batches on unstated hardware: absolute speeds are shown for "
            "reference only, ratios are the comparable quantity. "
            + (_FUSED_SPEED_CAVEAT if fused_kernels else _SPEED_CAVEAT)
            + (_NOISY_SPEED_CAVEAT if _any_noisy(spreads) else "")
        ),
        metrics=(
            Metric("train_speed", "train tokens/s", digits=0, comparable=False),
            Metric("train_ratio", "train ratio to softmax"),
            Metric("inference_speed", "inference tokens/s", digits=0, comparable=False),
            Metric("inference_ratio", "inference ratio to softmax"),
        ),
        rows=tuple(table_rows),
        provenance=Provenance(profile, corpora, device=device, replicates="timing rounds"),
        sources=(
            paper_table(EST_TABLE_4)["source"],
            paper_table(AST_SPEED)["source"],
        ),
    )


def _spread_note(
    spreads: Mapping[str, Mapping[str, Mapping[str, Any]]] | None, variant: str, phase: str
) -> str | None:
    """ "median m, IQR q1–q3" (", noisy" when flagged) of the given summary, None without one."""
    summary = (spreads or {}).get(variant, {}).get(phase)
    if summary is None:
        return None
    key = f"spreads[{variant}][{phase}]"
    for field in ("ratio", "ratio_quartiles", "noisy"):
        if field not in summary:
            raise LearnableSparsityError(f"{key} lacks {field!r}")
    median = check_number(f"{key} ratio", summary["ratio"], low=0.0)
    q1, q3 = (check_number(f"{key} quartile", q, low=0.0) for q in summary["ratio_quartiles"])
    if not isinstance(summary["noisy"], bool):
        raise LearnableSparsityError(f"{key} noisy must be true or false, got {summary['noisy']!r}")
    note = f"median {median:.2f}, IQR {q1:.2f}–{q3:.2f}"
    return f"{note}, noisy" if summary["noisy"] else note


NOT_MEASURABLE = "not measurable"  # a role cell whose corpus gives the role no query
NONE_PASSES = "none passes"  # a measured role that no head holds (the strongest head follows)
ROLE_LABELS: dict[str, str] = {
    "positional_prev": "positional (previous token)",
    "positional_next": "positional (next token)",
    "bpe_merge": "BPE merging",
    "interrogation": "interrogation",
}


def _published_roles(variant: str, role: str) -> tuple[float | None, float | None]:
    """(number of heads, median confidence %) that AST reports for ``variant`` and ``role``."""
    positional = _published(AST_POSITIONAL_HEADS, variant)
    if positional is None or role == "interrogation":
        return None, None
    if role == "positional_prev":
        return positional["n_heads"], positional["median_confidence_pct"]
    if role == "positional_next":
        row = published_row(AST_POSITIONAL_HEADS, "each of the three models")
        return row["n_heads"], row["confidence_pct_approx"]
    row = _published(AST_BPE_HEADS, variant)
    scores = row["scores_pct"]
    return row["heads_above_80pct"], statistics.median(scores) if scores else None


def _best_head_text(key: str, best: Mapping[str, Any], threshold: float) -> str:
    """The strongest head of a role that no head holds, as "<block> h<head>, <score> <
    <threshold>", with ", α=<α>" when the head has a learned α (α-entmax)."""
    score = check_number(f"{key} score", best["score"], 0.0, 1.0)
    text = f"{best['block']} h{best['head']}, {score:.2f} < {threshold:.2f}"
    if best.get("alpha") is not None:
        text += f", α={check_number(f'{key} alpha', best['alpha']):.2f}"
    return text


def _below_threshold_note(best_by_run: Sequence[tuple[int, str]], runs: int) -> str | None:
    """The note of a role cell naming the strongest head of every run (seed, 0-based position)
    on which no head holds the role; None when every run has one."""
    if not best_by_run:
        return None
    if runs == 1:
        return f"{NONE_PASSES}; best: {best_by_run[0][1]}"
    return "; ".join(f"{NONE_PASSES} on run {i + 1}, best: {text}" for i, text in best_by_run)


def _role_row(
    variant: str,
    role: str,
    seeds: Sequence[Mapping[str, Mapping[str, Any]]],
    best_seeds: Sequence[Mapping[str, Mapping[str, Any]]],
) -> Row:
    """The role table's row of ``variant`` and ``role``: heads found and their median
    confidence per seed, beside AST's; a seed on which no head passes names its strongest."""
    counts, medians, below = [], [], []
    for i, (by_role, best) in enumerate(zip(seeds, best_seeds, strict=True)):
        key = f"roles_by_variant[{variant!r}][{i}][{role!r}]"
        if role not in by_role:
            raise LearnableSparsityError(f"{key} is missing")
        if not by_role[role]["measurable"]:
            continue
        counts.append(check_number(f"{key} count", by_role[role]["count"], 0.0))
        found = [
            100 * check_number(f"{key} heads[{j}] confidence", h["confidence"], 0.0, 1.0)
            for j, h in enumerate(by_role[role]["heads"])
        ]
        if found:
            medians.append(statistics.median(found))
        elif role in best:  # none passes (BPE merging has no best when every head is positional)
            threshold = check_number(f"{key} threshold", by_role[role]["threshold"], 0.0, 1.0)
            best_key = f"best_by_variant[{variant!r}][{i}][{role!r}]"
            below.append((i, _best_head_text(best_key, best[role], threshold)))
    not_measured = None if counts or not seeds else NOT_MEASURABLE
    heads, median = _published_roles(variant, role)
    source = f"published {AST_HEADS_CORPUS} (AST)"
    return Row(
        f"{NORMALIZERS[variant].label} — {ROLE_LABELS[role]}",
        {
            "heads": TableCell(
                tuple(counts),
                (Reference(source, heads, data=AST_HEADS_CORPUS),),
                not_measured or _below_threshold_note(below, len(seeds)),
            ),
            "median_confidence": TableCell(
                tuple(medians),
                (Reference(source, median, data=AST_HEADS_CORPUS),),
                not_measured,
            ),
        },
    )


def head_summary_table(
    js_by_variant: Mapping[str, Mapping[str, float | Sequence[float]]],
    roles_by_variant: Mapping[str, Sequence[Mapping[str, Mapping[str, Any]]]],
    best_by_variant: Mapping[str, Sequence[Mapping[str, Mapping[str, Any]]]],
    profile: str,
    data: str | Sequence[str],
) -> tuple[ComparisonTable, ComparisonTable]:
    """Two tables: head diversity (JS) per attention block, and head-role counts.

    ``js_by_variant``: {variant: {block key: mean JS}} with block keys as in
    :meth:`learnable_sparsity.analysis.heads.HeadAnalysis.result` ("encoder.self.layer0", …; layers
    0-based) and a float (one model) or a list of per-seed floats per block.
    ``roles_by_variant``: {variant: [one per seed: {role: {"measurable", "count", "heads"}}]},
    the "roles" of :func:`learnable_sparsity.analysis.heads.summary` (only "measurable", "count" and
    each head's "confidence", in [0, 1], are read; every role of ``ROLES`` must be there).
    ``best_by_variant``: {variant: [one per seed, as in ``roles_by_variant``: {role: {"block",
    "head", "alpha", "score"}}]}, the "best_heads" of the same summaries (the strongest head of
    each role whatever its score; "alpha" None unless α-entmax). ``data``: the corpus analysed.

    The JS table has one row per block and one column per variant (nothing is published). The
    role table has one row per (variant, role) with the number of heads found per seed and the
    median confidence (%) of each seed's heads, beside AST's positional and BPE-merging heads
    (WMT 2014 en→de models; the next-token figures are "each of the three models", ≈95%; the BPE
    median is the median of the published scores). Seeds on which a role is not measurable
    (the corpus gives it no query) are left out; a role measurable on no seed reads
    :data:`NOT_MEASURABLE`, never 0 heads. A seed on which the role is measured but no head
    passes its threshold is named after the count (:data:`NONE_PASSES`), with its strongest
    head: block, head, score < threshold (and α), so that 0 heads still says how close the
    model came.
    """
    corpora = check_names("data", data)
    labels = variant_labels()
    variants = check_ordered("variant", [*js_by_variant, *roles_by_variant], labels)
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
        metrics=tuple(Metric(v, labels[v], digits=3) for v in js_variants),
        rows=tuple(
            Row(
                block,
                {
                    v: TableCell(
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
    role_rows = []
    for variant in variants:
        seeds = roles_by_variant.get(variant, ())
        best_seeds = best_by_variant.get(variant, ())
        if len(best_seeds) != len(seeds):
            raise LearnableSparsityError(
                f"best_by_variant[{variant!r}] has {len(best_seeds)} seeds, "
                f"roles_by_variant[{variant!r}] {len(seeds)}"
            )
        for i, by_role in enumerate(seeds):
            for role in by_role:
                check_known(f"roles_by_variant[{variant!r}][{i}] role", role, ROLES)
        role_rows += [_role_row(variant, role, seeds, best_seeds) for role in ROLES]
    role_table = ComparisonTable(
        name=file_stem("head_roles", corpora),
        title="Specialized attention heads by role",
        caption=(
            "Heads per seed that hold each role, and the median confidence (%) of a seed's "
            "heads. Positional: the head puts its largest weight on the previous (next) token "
            "for at least analysis.positional_share of the queries (AST: 90%); its confidence is "
            "its mean weight there. BPE merging and interrogation: the role score (itself a "
            "mean weight) passes analysis.role_threshold (AST counts BPE-merging heads above "
            "80%); a positional head is not counted as BPE merging. "
            f"“{NOT_MEASURABLE}”: the analysed sentences give the role no query (no word split "
            "into subwords, no question word of the source language in a question), so it "
            "was not measured — not 0 heads. "
            f"“{NONE_PASSES}; best: <block> h<head>, <score> < <threshold>”: no head holds the "
            "role, and this is the strongest one (its role score, below the threshold; α for "
            "α-entmax); with several seeds, “run k” is the k-th. AST's next-token figures hold "
            "for each of the three models (≈95%)."
        ),
        metrics=(
            Metric("heads", "heads", digits=0),
            Metric("median_confidence", "median confidence (%)", digits=1),
        ),
        rows=tuple(role_rows),
        provenance=provenance,
        sources=tuple(paper_table(i)["source"] for i in (AST_POSITIONAL_HEADS, AST_BPE_HEADS)),
    )
    return js_table, role_table
