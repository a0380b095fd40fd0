r"""Per-head attention statistics of Correia et al. (2019), chapter 4 analyses.

Notation: p ∈ Δ^K is one head's attention over the K keys of one query; the *available* keys of
a query are the ones it may attend to (real source tokens for encoder self- and context
attention; real target positions ≤ the query for causal decoder self-attention), n their number.

* Density: the fraction of available keys with p_k > 0 (``threshold`` 0, exact zeros — which
  the sparse normalizers produce; softmax is dense up to float underflow), averaged over queries.
  Beside each head's mean, how much its density changes from one input to another: the standard
  deviation of the density among queries with the same number n of available keys, pooled over n
  (:func:`pooled_within_sd`). Grouping by n leaves out what the length alone explains (a top-k
  head attends to min(k, n) of n keys: it varies with n, never between inputs of one length);
  what remains is the head adapting its support to the input (AST: one head of α = 1.33 attends
  to a few or to many tokens in two sentences of similar length).
* Head diversity, generalized Jensen–Shannon among the H heads of a block at one query:
      JS = 𝓗_n((1/H) Σ_j p_j) − (1/H) Σ_j 𝓗_n(p_j),      𝓗_n(p) = −Σ_k p_k log p_k / log n,
  with 0·log 0 = 0; the base n makes JS ∈ [0, 1], and JS = 0 when n = 1.
* Head roles (positional, BPE merging, interrogation): their scores, and which heads hold them,
  are defined in :mod:`learnable_sparsity.analysis.roles`.

:class:`HeadAnalysis` accumulates all of these over batches of ``Transformer.forward``
attention maps; :func:`analyze` drives a model over encoded examples (teacher forcing, eval
mode, no gradients); :func:`analyze_heads` does all of it for a model and sentence pairs as the
``analysis`` params describe, and :func:`summary` gives the numbers the reports show. The learned
α are analysed in :mod:`learnable_sparsity.analysis.alpha`. Layers and heads are 0-based (the thesis
counts from 1).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from learnable_sparsity.analysis.alpha import alpha_statistics
from learnable_sparsity.analysis.blocks import ROLES, block_order, split_block
from learnable_sparsity.analysis.roles import (
    POSITIONAL_OFFSETS,
    QUESTION_MARKS,
    best_heads,
    bpe_sums,
    interrogation_sums,
    positional_sums,
    role_results,
    source_word_features,
    word_form,
)
from learnable_sparsity.data.bpe import BpeModel, word_ids
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import Example, batches_of, collate_examples, encode_pairs, pad
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.settings import Settings, SettingsError, setting


def _check_keys(probs: Tensor, key_mask: Tensor) -> tuple[int, ...]:
    """The query shape ``probs.shape[:-2]`` broadcast with ``key_mask.shape[:-1]``."""
    if probs.dim() < 2 or key_mask.dim() < 1 or key_mask.shape[-1] != probs.shape[-1]:
        raise LearnableSparsityError(
            f"key_mask {tuple(key_mask.shape)} does not match probs {tuple(probs.shape)} "
            f"([..., heads, keys] vs [..., keys])"
        )
    try:
        return tuple(torch.broadcast_shapes(probs.shape[:-2], key_mask.shape[:-1]))
    except RuntimeError:
        raise LearnableSparsityError(
            f"key_mask {tuple(key_mask.shape)} does not broadcast against probs "
            f"{tuple(probs.shape)}"
        ) from None


def _entropy(p: Tensor) -> Tensor:
    """Shannon entropy −Σ_k p_k ln p_k over the last dimension, with 0·ln 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def js_divergence(probs: Tensor, key_mask: Tensor) -> Tensor:
    """Generalized Jensen–Shannon divergence among H heads, per query, in base n.

    JS = 𝓗_n((1/H) Σ_j p_j) − (1/H) Σ_j 𝓗_n(p_j), 𝓗_n(p) = −Σ_k p_k ln p_k / ln n, where n is
    the number of available keys of the query (``key_mask`` True); JS ∈ [0, 1], and JS = 0 for
    n ≤ 1. Entries of unavailable keys are taken as 0 (the model gives them exactly 0).

    Args:
        probs: attention [..., H, n_keys].
        key_mask: boolean [..., n_keys], broadcastable against ``probs`` without its head dim.

    Returns:
        JS per query, shape ``broadcast(probs.shape[:-2], key_mask.shape[:-1])``.
    """
    shape = _check_keys(probs, key_mask)
    p = probs * key_mask.unsqueeze(-2).to(probs.dtype)
    n = key_mask.sum(-1).to(probs.dtype).expand(shape)
    js = (_entropy(p.mean(-2)) - _entropy(p).mean(-1)).expand(shape)
    return torch.where(n > 1, js / torch.log(n.clamp(min=2)), torch.zeros_like(js))


def attention_density(probs: Tensor, key_mask: Tensor, threshold: float = 0.0) -> Tensor:
    """Fraction of available keys that a head attends to: |{k available : p_k > threshold}| / n.

    The default threshold 0 counts exact non-zeros (sparse normalizers return exact zeros; a
    softmax map has density 1 unless exp underflows). A query with no available key gets 0.

    Args:
        probs: attention [..., H, n_keys].
        key_mask: boolean [..., n_keys] (True = available), broadcastable as in
            :func:`js_divergence`.
        threshold: weights above it count as attended; must be ≥ 0.

    Returns:
        density [..., H] with ... = ``broadcast(probs.shape[:-2], key_mask.shape[:-1])``.
    """
    if not threshold >= 0:
        raise LearnableSparsityError(f"density threshold must be >= 0, got {threshold!r}")
    shape = _check_keys(probs, key_mask)
    attended = ((probs > threshold) & key_mask.unsqueeze(-2)).sum(-1)
    n = key_mask.sum(-1, keepdim=True).clamp(min=1)
    return (attended / n).expand(*shape, probs.shape[-2])


def pooled_within_sd(sums: Tensor, squares: Tensor, counts: Tensor) -> Tensor | None:
    """The pooled within-group standard deviation of per-head values from their sums by group.

    With groups g (here: queries with n available keys), ``counts`` [G] values per group and
    ``sums`` / ``squares`` [G, H] the sums of the values and of their squares per head:

        s² = Σ_g (Σ x² − (Σ x)² / c_g) / Σ_g (c_g − 1),

    over the groups with c_g ≥ 2 (a single value has no spread). Returns s [H], or None when no
    group holds two values.
    """
    pooled = counts >= 2
    dof = float((counts[pooled] - 1).sum())
    if dof == 0:
        return None
    within = squares[pooled] - sums[pooled] ** 2 / counts[pooled, None]
    return (within.sum(0) / dof).clamp(min=0).sqrt()


def _by_length(values: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per length n: the sums of ``values`` [N, H] and of their squares, and the counts [n_max
    + 1], of the N queries with ``lengths`` [N] available keys."""
    size = int(lengths.max()) + 1 if lengths.numel() else 1
    sums = torch.zeros(size, values.shape[-1], dtype=values.dtype).index_add_(0, lengths, values)
    squares = torch.zeros_like(sums).index_add_(0, lengths, values**2)
    counts = torch.zeros(size, dtype=values.dtype).index_add_(
        0, lengths, torch.ones_like(lengths, dtype=values.dtype)
    )
    return sums, squares, counts


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    """``tensor`` with zero rows appended up to ``rows`` rows."""
    return torch.nn.functional.pad(tensor, (0, 0) * (tensor.dim() - 1) + (0, rows - len(tensor)))


def _mean_list(sums: Tensor, count: int) -> list[float] | None:
    """sums / count as a list, or None when count is 0 (JSON has no NaN)."""
    return (sums / count).tolist() if count else None


def _confidence_key(role: str) -> str:
    """Where :class:`HeadAnalysis` keeps the weight sums beside a positional role's shares."""
    return f"{role}.confidence"


class HeadAnalysis:
    """Streaming accumulator of density, JS, role scores and their matched queries per block.

    Feed it the ``attention`` dict of ``Transformer.forward`` batch by batch (:meth:`update`),
    then read the JSON-ready :meth:`result`. Sums and counts are kept per block, so the result is
    the mean over all queries (or words) of all batches, independent of the batching.
    """

    def __init__(self) -> None:
        self._sums: dict[str, dict[str, Tensor]] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self._heads: dict[str, int] = {}
        # block -> (sums [n, H], sums of squares [n, H], counts [n]) of the queries' densities
        # by their number n of available keys (the per-input spread of :func:`pooled_within_sd`)
        self._by_length: dict[str, tuple[Tensor, Tensor, Tensor]] = {}

    def _add(self, block: str, name: str, sums: Tensor, count: int) -> None:
        block_sums = self._sums.setdefault(block, {})
        block_counts = self._counts.setdefault(block, {})
        block_sums[name] = block_sums.get(name, 0) + sums.detach().double().cpu()
        block_counts[name] = block_counts.get(name, 0) + count

    def _add_by_length(self, block: str, density: Tensor, lengths: Tensor) -> None:
        """Add per-query densities [N, H] to the block's sums per number of available keys."""
        new = _by_length(density.detach().double().cpu(), lengths.detach().long().cpu())
        old = self._by_length.get(block)
        if old is not None:
            rows = max(len(old[0]), len(new[0]))
            new = tuple(
                _pad_rows(a, rows) + _pad_rows(b, rows) for a, b in zip(old, new, strict=True)
            )
        self._by_length[block] = new

    def update(
        self,
        attention: Mapping[str, Tensor],
        src_mask: Tensor,
        tgt_mask: Tensor,
        src_word_ids: Tensor,
        tgt_word_ids: Tensor,
        src_interrogative: Tensor,
        src_question_mark: Tensor,
    ) -> None:
        """Add one batch of attention maps.

        Args:
            attention: block key → probs [batch, H, queries, keys], as filled by
                ``Transformer.forward(src, tgt_in, attention=...)``.
            src_mask, tgt_mask: boolean [batch, S] and [batch, T], True on real ``src`` and
                ``tgt_in`` tokens.
            src_word_ids, tgt_word_ids: long [batch, S] and [batch, T], word index per position
                (negative outside any word, e.g. bos and padding); see
                :func:`~learnable_sparsity.analysis.roles.bpe_merge_score`.
            src_interrogative, src_question_mark: boolean [batch, S]: interrogative-word and
                question-mark positions of the source (see :func:`source_word_features`).

        Encoder self-attention: queries and keys are the real source tokens. Decoder
        self-attention: queries are real target positions, keys the real positions ≤ the query
        (causal). Context attention: target queries, real source keys. Scores: positional −1
        for both self-attentions and +1 for the encoder only (causality hides the next target
        token); BPE merging for both self-attentions; interrogation for encoder self-attention.
        """
        B, S = src_mask.shape
        T = tgt_mask.shape[1]
        for name, tensor, width in (
            ("tgt_mask", tgt_mask, T),
            ("src_word_ids", src_word_ids, S),
            ("tgt_word_ids", tgt_word_ids, T),
            ("src_interrogative", src_interrogative, S),
            ("src_question_mark", src_question_mark, S),
        ):
            if tuple(tensor.shape) != (B, width):
                raise LearnableSparsityError(
                    f"{name} has shape {tuple(tensor.shape)}, expected {(B, width)}"
                )
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_mask.device).tril()
        for block, probs in attention.items():
            kind, _ = split_block(block)
            if kind == "encoder.self":
                queries, keys = src_mask, src_mask[:, None, :]
            elif kind == "decoder.self":
                queries, keys = tgt_mask, causal & tgt_mask[:, None, :]
            else:
                queries, keys = tgt_mask, src_mask[:, None, :]
            expected = (B, probs.shape[1], queries.shape[1], keys.shape[-1])
            if probs.dim() != 4 or tuple(probs.shape) != expected:
                raise LearnableSparsityError(
                    f"attention {block} has shape {tuple(probs.shape)}, expected {expected}"
                )
            if self._heads.setdefault(block, probs.shape[1]) != probs.shape[1]:
                raise LearnableSparsityError(
                    f"attention {block} has {probs.shape[1]} heads, earlier batches had "
                    f"{self._heads[block]}"
                )
            probs = probs.detach()
            per_query = probs.double().transpose(1, 2)  # [B, Q, H, K]
            n_queries = int(queries.sum())
            density = attention_density(per_query, keys)[queries]  # [N, H]
            self._add(block, "density", density.sum(0), n_queries)
            available = keys.sum(-1).expand(queries.shape)[queries]  # [N]
            self._add_by_length(block, density, available)
            self._add(block, "js", js_divergence(per_query, keys)[queries].sum(), n_queries)
            if kind == "decoder.context":
                continue
            word_ids = src_word_ids if kind == "encoder.self" else tgt_word_ids
            for role, offset in POSITIONAL_OFFSETS.items():
                if offset > 0 and kind == "decoder.self":
                    continue
                shares, confidences, count = positional_sums(probs, queries, offset)
                self._add(block, role, shares, count)
                self._add(block, _confidence_key(role), confidences, count)
            self._add(block, "bpe_merge", *bpe_sums(probs, word_ids, queries))
            if kind == "encoder.self":
                self._add(
                    block,
                    "interrogation",
                    *interrogation_sums(
                        probs, src_interrogative & src_mask, src_question_mark & src_mask
                    ),
                )

    def result(self) -> dict[str, object]:
        """JSON-ready means: {"blocks": {key: {...}}, "densities": {attention type: [...]}}.

        Per block key ("encoder.self.layer0", …): "attention" (type), "layer", "heads" (H),
        "queries" (number of queries), "density" ([H] mean density), "density_within_length_sd"
        ([H] :func:`pooled_within_sd` of the queries' densities grouped by their number of
        available keys, or None when no length has two queries), "js" (mean JS over
        queries), "scores" {role: [H] role score (positional roles: the argmax share), or None
        when the role is not measurable in the block}, "confidence" {positional role: [H] mean
        weight on the key at the role's offset, or None} and "matched" {role: number of queries
        — words, for BPE merging — the role's means run over}, with the roles of
        :func:`HeadAnalysis.update`. "densities" lists every head's density per attention type,
        layer by layer (for histograms).
        """
        blocks: dict[str, dict[str, object]] = {}
        densities: dict[str, list[float]] = {}
        for block in sorted(self._sums, key=block_order):
            kind, layer = split_block(block)
            sums, counts = self._sums[block], self._counts[block]
            n = counts["density"]
            density = (sums["density"] / max(n, 1)).tolist()
            within_sd = pooled_within_sd(*self._by_length[block])
            measured = [role for role in ROLES if role in sums]
            blocks[block] = {
                "attention": kind,
                "layer": layer,
                "heads": self._heads[block],
                "queries": n,
                "density": density,
                "density_within_length_sd": None if within_sd is None else within_sd.tolist(),
                "js": float(sums["js"]) / n if n else None,
                "scores": {role: _mean_list(sums[role], counts[role]) for role in measured},
                "confidence": {
                    role: _mean_list(sums[_confidence_key(role)], counts[role])
                    for role in measured
                    if role in POSITIONAL_OFFSETS
                },
                "matched": {role: counts[role] for role in measured},
            }
            densities.setdefault(kind, []).extend(density)
        return {"blocks": blocks, "densities": densities}


@torch.no_grad()
def analyze(
    model: Transformer,
    examples: Sequence[Example],
    src_word_ids: Sequence[Sequence[int]],
    tgt_word_ids: Sequence[Sequence[int]],
    src_interrogative: Sequence[Sequence[bool]],
    src_question_mark: Sequence[Sequence[bool]],
    max_tokens: int,
) -> dict[str, object]:
    """:meth:`HeadAnalysis.result` of ``model`` over ``examples`` (teacher forcing, eval mode).

    ``examples`` are (source ids, target ids) without bos/eos, as for training; the per-example
    lists align with the source ids (``src_*``) and the target ids (``tgt_word_ids``; the bos
    the collate prepends gets word id −1). Batches hold at most ``max_tokens`` tokens.
    """
    per_example = {
        "src_word_ids": (src_word_ids, 0),
        "tgt_word_ids": (tgt_word_ids, 1),
        "src_interrogative": (src_interrogative, 0),
        "src_question_mark": (src_question_mark, 0),
    }
    for name, (rows, side) in per_example.items():
        if len(rows) != len(examples):
            raise LearnableSparsityError(
                f"{name} has {len(rows)} entries for {len(examples)} examples"
            )
        for i, (row, example) in enumerate(zip(rows, examples, strict=True)):
            if len(row) != len(example[side]):
                raise LearnableSparsityError(
                    f"{name}[{i}] has {len(row)} entries for {len(example[side])} tokens"
                )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = model.config.pad_id
    analysis = HeadAnalysis()
    try:
        for indices in batches_of(examples, max_tokens, None):
            batch = collate_examples(examples, indices, model)
            S, T = batch.src.shape[1], batch.tgt_in.shape[1]
            features = [
                pad([src_word_ids[i] for i in indices], -1, width=S),
                pad([[-1, *tgt_word_ids[i]] for i in indices], -1, width=T),
                pad([src_interrogative[i] for i in indices], False, width=S, dtype=torch.bool),
                pad([src_question_mark[i] for i in indices], False, width=S, dtype=torch.bool),
            ]
            src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
            attention: dict[str, Tensor] = {}
            model(src, tgt_in, attention=attention)
            analysis.update(
                attention, src != pad_id, tgt_in != pad_id, *(f.to(device) for f in features)
            )
    finally:
        model.train(was_training)
    return analysis.result()


@dataclass(frozen=True, kw_only=True)
class AnalysisSettings(Settings):
    """Params ``analysis``: which validation sentences are analysed and how roles are read.

    ``positional_share``: the argmax share a positional head needs (AST: 90% of the time);
    ``role_threshold``: the score a BPE-merging or interrogation head needs (AST counts
    BPE-merging heads above 80%). ``question_marks``: characters; a source piece that contains
    one is a question-mark key. ``interrogatives``: the question words per source language (the
    corpus's, e.g. "en", "de"; see ``learnable_sparsity.data.corpora.source_language``); a language
    without an entry has none, and its interrogation role is not measurable. Each entry is one
    word, matched as :func:`source_word_features` says (a multi-word question such as "por qué"
    is found by its question word, "qué").
    """

    max_sentences: int = setting(500, at_least=1)
    max_tokens: int = setting(4000, at_least=1)  # per teacher-forced batch
    positional_share: float = setting(0.9, above=0, at_most=1)
    role_threshold: float = setting(0.8, above=0, at_most=1)
    question_marks: tuple[str, ...] = QUESTION_MARKS
    interrogatives: dict[str, tuple[str, ...]]

    def validate(self) -> None:
        if not self.question_marks:
            raise SettingsError("question_marks", "must list at least one question mark")
        for i, mark in enumerate(self.question_marks):
            if len(mark) != 1 or mark.isspace():
                raise SettingsError(f"question_marks[{i}]", f"must be one character, got {mark!r}")
        for language, words in self.interrogatives.items():
            for i, word in enumerate(words):
                if not word_form(word, self.question_marks) or any(c.isspace() for c in word):
                    raise SettingsError(
                        f"interrogatives.{language}[{i}]",
                        f"must be one word (words are matched one by one), got {word!r}",
                    )


def analyze_heads(
    model: Transformer,
    bpe: BpeModel,
    pairs: Sequence[tuple[str, str]],
    settings: AnalysisSettings,
    source_language: str | None,
) -> dict[str, object]:
    """The head analysis of ``model`` on the first ``settings.max_sentences`` of ``pairs``,
    whose source side is in ``source_language`` (None: unknown).

    Returns {"analysis": :func:`analyze`'s result, "source_language", "roles":
    :func:`role_results` with the settings' thresholds, "best_heads": :func:`best_heads` (the
    strongest head of each role whatever its score), "alphas": {block: [α per head]} (empty
    unless α-entmax), "example": the index of the first sentence with a question mark (0 if
    none; the one to draw heat maps of), "pieces": its (source, target) BPE pieces}.
    """
    pairs = pairs[: settings.max_sentences]
    examples = encode_pairs(bpe, pairs)
    src_pieces = [bpe.encode(source) for source, _ in pairs]
    tgt_pieces = [bpe.encode(target) for _, target in pairs]
    interrogatives = settings.interrogatives.get(source_language or "", ())
    features = [
        source_word_features(p, interrogatives, settings.question_marks) for p in src_pieces
    ]
    result = analyze(
        model,
        examples,
        [f[0] for f in features],
        [word_ids(p) for p in tgt_pieces],
        [f[1] for f in features],
        [f[2] for f in features],
        settings.max_tokens,
    )
    alphas = {key: value.tolist() for key, value in model.alphas().items()}
    example = next((i for i, f in enumerate(features) if any(f[2])), 0)
    return {
        "analysis": result,
        "source_language": source_language,
        "roles": role_results(
            result, alphas or None, settings.role_threshold, settings.positional_share
        ),
        "best_heads": best_heads(result, alphas or None, settings.positional_share),
        "alphas": alphas,
        "example": example,
        "pieces": (src_pieces[example], tgt_pieces[example]),
    }


def summary(report: Mapping[str, object], flagged: Sequence[tuple[str, int]]) -> dict[str, object]:
    """The numbers of one model's :func:`analyze_heads` report that the tables and claims read:
    JS per block, mean density per attention type, each head's mean density and its spread
    between inputs of one length per block, the source language, the per-role results of
    :func:`role_results`, the strongest head per role, α statistics and the number of
    ``flagged`` (softmax-then-sparser) heads."""
    blocks = report["analysis"]["blocks"]
    densities = report["analysis"]["densities"]
    return {
        "js": {key: block["js"] for key, block in blocks.items()},
        "mean_density": {kind: statistics.fmean(v) for kind, v in densities.items() if v},
        "head_density": {key: block["density"] for key, block in blocks.items()},
        "density_within_length_sd": {
            key: block["density_within_length_sd"] for key, block in blocks.items()
        },
        "source_language": report["source_language"],
        "roles": report["roles"],
        "best_heads": {
            head["role"]: {k: head[k] for k in ("block", "head", "alpha", "score", "confidence")}
            for head in report["best_heads"]
        },
        "alpha": alpha_statistics(report["alphas"]),
        "heads_towards_softmax_then_sparser": len(flagged),
    }
