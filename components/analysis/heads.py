r"""Per-head attention statistics of Correia et al. (2019), chapter 4 analyses.

Notation: p ∈ Δ^K is one head's attention over the K keys of one query; the *available* keys of
a query are the ones it may attend to (real source tokens for encoder self- and context
attention; real target positions ≤ the query for causal decoder self-attention), n their number.

* Density: the fraction of available keys with p_k > 0 (``threshold`` 0, exact zeros — which
  the sparse normalizers produce; softmax is dense up to float underflow), averaged over queries.
* Head diversity, generalized Jensen–Shannon among the H heads of a block at one query:
      JS = 𝓗_n((1/H) Σ_j p_j) − (1/H) Σ_j 𝓗_n(p_j),      𝓗_n(p) = −Σ_k p_k log p_k / log n,
  with 0·log 0 = 0; the base n makes JS ∈ [0, 1], and JS = 0 when n = 1.
* Head roles (per head, in [0, 1]), as in §5 of Correia et al. (2019):
  - positional(δ), δ = −1 (previous token) or +1 (next token): the *argmax share*, the fraction
    of the queries q whose key q + δ is a real token that put their largest weight on q + δ.
    Ties: a query whose maximum weight is shared by m keys, q + δ among them, counts 1/m (the
    argmax drawn uniformly among the maxima), so a uniform head scores 1/n, not 1. Beside it the
    *confidence*, the mean weight p_q[q + δ] over the same queries. A head is positional when
    its share is ≥ ``positional_share`` (AST: 90%);
  - BPE merging: for each word split into ≥ 2 subwords, the largest mass that one of its
    subwords puts on the word's *other* subwords; averaged over such words. A head that is
    positional (at either offset) in its block is not counted as BPE merging: a previous-token
    head puts its weight on the previous subword of every split word and would score ≈ 1 here,
    but AST counts the two roles apart;
  - interrogation: mean of Σ_{k a question-mark key} p_q[k] over queries q that are
    interrogative words, in sentences that contain a question mark.
  The queries (words, for BPE merging) a role's mean runs over are its *matched* queries; a role
  with none in the analysed sentences (no interrogative word in a question, no word split into
  ≥ 2 subwords) is *not measurable*: its score is undefined (None), never 0.

:class:`HeadAnalysis` accumulates all of these over batches of ``Transformer.forward``
attention maps; :func:`analyze` drives a model over encoded examples (teacher forcing, eval
mode, no gradients), :func:`roles` lists the heads whose role score passes its threshold and
:func:`role_results` sums them up per role (heads, count, measurable, matched queries);
:func:`analyze_heads` does all of it for a model and sentence pairs as the ``analysis`` params
describe, and :func:`summary` gives the numbers the reports show. The learned α are analysed in
:mod:`components.analysis.alpha`. Layers and heads are 0-based (the thesis counts from 1).
"""

from __future__ import annotations

import math
import statistics
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from components.analysis.alpha import alpha_statistics
from components.analysis.blocks import ROLES, block_order, split_block
from components.data.bpe import WORD_START, BpeModel, word_ids
from components.errors import LearnableSparsityError
from components.nmt.batching import Example, batches_of, collate_examples, encode_pairs, pad
from components.nmt.model import Transformer
from components.settings import Settings, SettingsError, setting


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


def _check_self(probs: Tensor, **masks: Tensor) -> None:
    """``probs`` is [batch, H, L, L] and every mask is [batch, L]."""
    if probs.dim() != 4 or probs.shape[-1] != probs.shape[-2]:
        raise LearnableSparsityError(
            f"self-attention probs must be [batch, heads, L, L], got {tuple(probs.shape)}"
        )
    for name, mask in masks.items():
        if tuple(mask.shape) != (probs.shape[0], probs.shape[-1]):
            raise LearnableSparsityError(
                f"{name} {tuple(mask.shape)} does not match probs {tuple(probs.shape)} "
                f"(expected [batch, L])"
            )


def _mean(sums: Tensor, count: int) -> Tensor:
    """sums / count, or NaN per head when count is 0 (the mean is undefined)."""
    return sums / count if count else torch.full_like(sums, math.nan)


def _mean_list(sums: Tensor, count: int) -> list[float] | None:
    """sums / count as a list, or None when count is 0 (JSON has no NaN)."""
    return (sums / count).tolist() if count else None


def _confidence_key(role: str) -> str:
    """Where :class:`HeadAnalysis` keeps the weight sums beside a positional role's shares."""
    return f"{role}.confidence"


# Role → key offset δ of the positional roles (keys q + δ); the decoder only has −1 (causality
# hides the next target token).
POSITIONAL_OFFSETS: dict[str, int] = {"positional_prev": -1, "positional_next": 1}


def _positional_sums(probs: Tensor, query_mask: Tensor, offset: int) -> tuple[Tensor, Tensor, int]:
    """(Σ_q argmax credit of key q + offset, Σ_q p_q[q + offset]), each per head [H] float64,
    and the number of queries q, over the pairs where q and q + offset are real tokens.

    The credit is 1/m when key q + offset is one of the m keys that hold the query's largest
    weight, else 0. Keys a query may not attend to have weight exactly 0, below its maximum.
    """
    L = probs.shape[-1]
    rows = torch.arange(max(0, -offset), L - max(0, offset), device=probs.device)
    if rows.numel() == 0:
        zeros = torch.zeros(probs.shape[1], dtype=torch.float64)
        return zeros, zeros, 0
    valid = (query_mask[:, rows] & query_mask[:, rows + offset])[:, None]  # [B, 1, R]
    # diagonal(offset) holds p[b, h, r, r + offset] for every row r listed in ``rows``.
    weights = probs.diagonal(offset=offset, dim1=-2, dim2=-1)  # [B, H, R]
    queries = probs[:, :, rows]  # [B, H, R, L]
    top = queries.amax(-1)
    ties = (queries == top[..., None]).sum(-1)  # m ≥ 1 wherever the row is a number
    credit = (weights == top).double() / ties.clamp(min=1)
    zero = torch.zeros((), dtype=torch.float64, device=probs.device)
    shares = torch.where(valid, credit, zero).sum((0, 2))
    confidences = torch.where(valid, weights.double(), zero).sum((0, 2))
    return shares.cpu(), confidences.cpu(), int(valid.sum())


def argmax_share(probs: Tensor, query_mask: Tensor, offset: int) -> Tensor:
    """Positional-head score per head: the share of queries q whose largest weight is on key
    q + offset (self-attention).

    share = (1/N) Σ_q [p_q[q + offset] = max_k p_q[k]] / |argmax_k p_q[k]|: a query whose
    maximum is shared by m keys, q + offset among them, counts 1/m (so a uniform head gets 1/n,
    not 1); the mean runs over the N queries for which both q and q + offset are real tokens
    (``query_mask`` True). Offset −1 is the previous token, +1 the next.

    Args:
        probs: self-attention [batch, H, L, L].
        query_mask: boolean [batch, L], True on real tokens.
        offset: key position relative to the query.

    Returns:
        float64 [H] in [0, 1]; NaN where no query has a key at that offset.
    """
    _check_self(probs, query_mask=query_mask)
    shares, _, count = _positional_sums(probs, query_mask, offset)
    return _mean(shares, count)


def positional_confidence(probs: Tensor, query_mask: Tensor, offset: int) -> Tensor:
    """Positional-head confidence per head: mean_q p_q[q + offset] (self-attention).

    The mean runs over the queries q for which both q and q + offset are real tokens
    (``query_mask`` True); offset −1 is the previous token, +1 the next.

    Args:
        probs: self-attention [batch, H, L, L].
        query_mask: boolean [batch, L], True on real tokens.
        offset: key position relative to the query.

    Returns:
        float64 [H]; NaN where no query has a key at that offset.
    """
    _check_self(probs, query_mask=query_mask)
    _, confidences, count = _positional_sums(probs, query_mask, offset)
    return _mean(confidences, count)


def _bpe_sums(probs: Tensor, word_ids: Tensor, query_mask: Tensor) -> tuple[Tensor, int]:
    """(Σ over multi-subword words of the word's score per head [H] float64, number of words)."""
    B, H, L, _ = probs.shape
    valid = query_mask & (word_ids >= 0)
    same = (word_ids[:, :, None] == word_ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    other = same & ~torch.eye(L, dtype=torch.bool, device=probs.device)
    mass = (probs.double() * other[:, None]).sum(-1)  # [B, H, L]: mass on the word's others
    dummy = int(word_ids.max().clamp(min=0)) + 1  # bucket of positions outside any word
    index = torch.where(valid, word_ids, torch.full_like(word_ids, dummy))
    best = mass.new_zeros(B, H, dummy + 1).scatter_reduce(
        -1, index[:, None].expand(B, H, L), mass, "amax", include_self=False
    )
    size = torch.zeros(B, dummy + 1, dtype=torch.long, device=probs.device)
    size = size.scatter_add(-1, index, valid.long())
    split = size >= 2  # words of ≥ 2 subwords (the dummy bucket has size 0)
    return (best * split[:, None]).sum((0, 2)).cpu(), int(split.sum())


def bpe_merge_score(probs: Tensor, word_ids: Tensor, query_mask: Tensor) -> Tensor:
    """BPE-merging score per head (self-attention).

    For each word w split into |w| ≥ 2 subwords, score(w) = max_{i ∈ w} Σ_{j ∈ w, j ≠ i} p_i[j]
    (the most that one of its subwords attends to the word's other subwords); the result is the
    mean of score(w) over all such words of all sentences. Single-subword words are skipped.

    Args:
        probs: self-attention [batch, H, L, L].
        word_ids: long [batch, L], the word index of each position (equal ids within a sentence
            form one word); negative ids mark positions outside any word (bos, padding).
        query_mask: boolean [batch, L], True on real tokens.

    Returns:
        float64 [H]; NaN where no word has ≥ 2 subwords.
    """
    _check_self(probs, word_ids=word_ids, query_mask=query_mask)
    return _mean(*_bpe_sums(probs, word_ids, query_mask))


def _interrogation_sums(
    probs: Tensor, query_is_interrogative: Tensor, key_is_question_mark: Tensor
) -> tuple[Tensor, int]:
    """(Σ_q weight on question marks per head [H] float64, number of interrogative queries q)."""
    queries = query_is_interrogative & key_is_question_mark.any(-1, keepdim=True)
    weight = (probs.double() * key_is_question_mark[:, None, None, :]).sum(-1)  # [B, H, Q]
    return (weight * queries[:, None]).sum((0, 2)).cpu(), int(queries.sum())


def interrogation_score(
    probs: Tensor, query_is_interrogative: Tensor, key_is_question_mark: Tensor
) -> Tensor:
    """Interrogation-head score per head: mean_q Σ_{k a question mark} p_q[k].

    The mean runs over the queries q that are interrogative words (who, what, …) in sentences
    containing at least one question-mark key (an interrogative word in a statement has no
    question mark to find).

    Args:
        probs: encoder self-attention [batch, H, L, L].
        query_is_interrogative: boolean [batch, L], True at (subwords of) interrogative words.
        key_is_question_mark: boolean [batch, L], True at question-mark tokens.

    Returns:
        float64 [H]; NaN where no interrogative word occurs in a question.
    """
    _check_self(
        probs,
        query_is_interrogative=query_is_interrogative,
        key_is_question_mark=key_is_question_mark,
    )
    return _mean(*_interrogation_sums(probs, query_is_interrogative, key_is_question_mark))


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

    def _add(self, block: str, name: str, sums: Tensor, count: int) -> None:
        block_sums = self._sums.setdefault(block, {})
        block_counts = self._counts.setdefault(block, {})
        block_sums[name] = block_sums.get(name, 0) + sums.detach().double().cpu()
        block_counts[name] = block_counts.get(name, 0) + count

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
                (negative outside any word, e.g. bos and padding); see :func:`bpe_merge_score`.
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
            self._add(
                block, "density", attention_density(per_query, keys)[queries].sum(0), n_queries
            )
            self._add(block, "js", js_divergence(per_query, keys)[queries].sum(), n_queries)
            if kind == "decoder.context":
                continue
            word_ids = src_word_ids if kind == "encoder.self" else tgt_word_ids
            for role, offset in POSITIONAL_OFFSETS.items():
                if offset > 0 and kind == "decoder.self":
                    continue
                shares, confidences, count = _positional_sums(probs, queries, offset)
                self._add(block, role, shares, count)
                self._add(block, _confidence_key(role), confidences, count)
            self._add(block, "bpe_merge", *_bpe_sums(probs, word_ids, queries))
            if kind == "encoder.self":
                self._add(
                    block,
                    "interrogation",
                    *_interrogation_sums(
                        probs, src_interrogative & src_mask, src_question_mark & src_mask
                    ),
                )

    def result(self) -> dict[str, object]:
        """JSON-ready means: {"blocks": {key: {...}}, "densities": {attention type: [...]}}.

        Per block key ("encoder.self.layer0", …): "attention" (type), "layer", "heads" (H),
        "queries" (number of queries), "density" ([H] mean density), "js" (mean JS over
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
            measured = [role for role in ROLES if role in sums]
            blocks[block] = {
                "attention": kind,
                "layer": layer,
                "heads": self._heads[block],
                "queries": n,
                "density": density,
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


def _required(role: str, threshold: float, positional_share: float) -> float:
    """The score a head needs to hold ``role``: the argmax share for positional roles."""
    return positional_share if role in POSITIONAL_OFFSETS else threshold


def _ranked(
    result: Mapping[str, object],
    alphas: Mapping[str, Sequence[float] | Tensor] | None,
    positional_share: float,
) -> list[dict[str, object]]:
    """Every head with a defined role score, as :func:`roles` describes its entries, sorted by
    role (order of :data:`ROLES`), then by decreasing score; heads whose argmax share at either
    offset is ≥ ``positional_share`` are left out of BPE merging."""
    found: list[dict[str, object]] = []
    for block, entry in result["blocks"].items():
        block_alphas = None
        if alphas is not None and block in alphas:
            block_alphas = [float(a) for a in alphas[block]]
        positional = {
            head
            for role in POSITIONAL_OFFSETS
            for head, share in enumerate(entry["scores"].get(role) or [])
            if share >= positional_share
        }
        for role, scores in entry["scores"].items():
            confidences = entry["confidence"].get(role) or scores
            for head, score in enumerate(scores or []):
                if role == "bpe_merge" and head in positional:
                    continue
                found.append(
                    {
                        "role": role,
                        "block": block,
                        "attention": entry["attention"],
                        "layer": entry["layer"],
                        "head": head,
                        "alpha": None if block_alphas is None else block_alphas[head],
                        "score": score,
                        "confidence": confidences[head],
                    }
                )
    return sorted(found, key=lambda r: (ROLES.index(r["role"]), -r["score"]))


def roles(
    result: Mapping[str, object],
    alphas: Mapping[str, Sequence[float] | Tensor] | None = None,
    threshold: float = 0.8,
    positional_share: float = 0.9,
) -> list[dict[str, object]]:
    """The heads that hold a role in a :meth:`HeadAnalysis.result`.

    Positional roles: argmax share ≥ ``positional_share``; BPE merging and interrogation: score
    ≥ ``threshold``, and a head positional at either offset in its block is not BPE merging.
    Each entry: {"role", "block" (key), "attention" (type), "layer", "head", "alpha" (the
    head's α from ``alphas`` keyed by block, e.g. ``Transformer.alphas()``, else None),
    "score" (the role score), "confidence" (positional roles: the mean weight on the key at the
    role's offset; the other roles: the score, itself a mean weight)}; sorted by role (order of
    :data:`ROLES`), then by decreasing score.
    """
    return [
        head
        for head in _ranked(result, alphas, positional_share)
        if head["score"] >= _required(head["role"], threshold, positional_share)
    ]


def role_results(
    result: Mapping[str, object],
    alphas: Mapping[str, Sequence[float] | Tensor] | None = None,
    threshold: float = 0.8,
    positional_share: float = 0.9,
) -> dict[str, dict[str, object]]:
    """Per role of :data:`ROLES`, the heads of :func:`roles` and the evidence behind them.

    {role: {"measurable": whether any block has a matched query (word) for the role,
    "matched": the number of them — per attention type (each layer of a type sees the same
    ones), summed over the types —, "threshold": the score a head needs, "count": the number of
    heads holding the role (None when not measurable: not 0), "heads": [{"block", "attention",
    "layer", "head", "alpha", "score", "confidence"}] as :func:`roles` orders them}}.
    """
    found = roles(result, alphas, threshold, positional_share)
    results: dict[str, dict[str, object]] = {}
    for role in ROLES:
        per_type: dict[str, int] = {}
        for entry in result["blocks"].values():
            kind, n = entry["attention"], entry["matched"].get(role, 0)
            per_type[kind] = max(per_type.get(kind, 0), n)
        matched = sum(per_type.values())
        heads = [{k: v for k, v in h.items() if k != "role"} for h in found if h["role"] == role]
        results[role] = {
            "measurable": matched > 0,
            "matched": matched,
            "threshold": _required(role, threshold, positional_share),
            "count": len(heads) if matched else None,
            "heads": heads,
        }
    return results


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


# Question marks of the source scripts: Latin "?", the Spanish opening "¿" (BPE glues it to the
# next word), the Arabic "؟" and the full-width "？" of Japanese and Chinese text.
QUESTION_MARKS: tuple[str, ...] = ("?", "¿", "؟", "？")


def _normal(text: str) -> str:
    """``text`` as words and question marks are compared: Unicode NFKC, then case-folded."""
    return unicodedata.normalize("NFKC", text).casefold()


def _word(text: str, marks: str) -> str:
    """The normal form of the word ``text`` without leading and trailing ``marks`` (normal
    question-mark characters)."""
    return _normal(text).strip(marks)


def source_word_features(
    pieces: Sequence[str], interrogatives: Iterable[str], question_marks: Iterable[str]
) -> tuple[list[int], list[bool], list[bool]]:
    """Per BPE piece of a source sentence: its word index (:func:`word_ids`), whether its word is
    one of ``interrogatives`` and whether the piece contains one of the ``question_marks``
    (single characters).

    Words are compared after Unicode NFKC, case folding and stripping leading and trailing
    question marks, so "¿Qué" (one piece or two) is the interrogative "qué", and its piece that
    holds "¿" is a question-mark key.
    """
    marks = _normal("".join(question_marks))
    wanted = {_word(word, marks) for word in interrogatives}
    words = word_ids(pieces)
    text: dict[int, str] = {}
    for piece, word in zip(pieces, words, strict=True):
        text[word] = text.get(word, "") + piece.removeprefix(WORD_START)
    interrogative = [_word(text[w], marks) in wanted for w in words]
    question = [any(mark in _normal(piece) for mark in marks) for piece in pieces]
    return words, interrogative, question


@dataclass(frozen=True, kw_only=True)
class AnalysisSettings(Settings):
    """Params ``analysis``: which validation sentences are analysed and how roles are read.

    ``positional_share``: the argmax share a positional head needs (AST: 90% of the time);
    ``role_threshold``: the score a BPE-merging or interrogation head needs (AST counts
    BPE-merging heads above 80%). ``question_marks``: characters; a source piece that contains
    one is a question-mark key. ``interrogatives``: the question words per source language (the
    corpus's, e.g. "en", "de"; see ``components.data.corpora.source_language``); a language
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
        marks = _normal("".join(self.question_marks))
        for language, words in self.interrogatives.items():
            for i, word in enumerate(words):
                if not _word(word, marks) or any(c.isspace() for c in word):
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
    :func:`role_results` with the settings' thresholds, "best_heads": the strongest head of each
    role whatever its score (a positional head is never the BPE-merging one), "alphas": {block:
    [α per head]} (empty unless α-entmax), "example": the index of the first sentence with a
    question mark (0 if none; the one to draw heat maps of), "pieces": its (source, target) BPE
    pieces}.
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
    ranked = _ranked(result, alphas or None, settings.positional_share)
    best = [
        next(h for h in ranked if h["role"] == role)
        for role in ROLES
        if any(h["role"] == role for h in ranked)
    ]
    example = next((i for i, f in enumerate(features) if any(f[2])), 0)
    return {
        "analysis": result,
        "source_language": source_language,
        "roles": role_results(
            result, alphas or None, settings.role_threshold, settings.positional_share
        ),
        "best_heads": best,
        "alphas": alphas,
        "example": example,
        "pieces": (src_pieces[example], tgt_pieces[example]),
    }


def summary(report: Mapping[str, object], flagged: Sequence[tuple[str, int]]) -> dict[str, object]:
    """The numbers of one model's :func:`analyze_heads` report that the tables show: JS per
    block, mean density per attention type, the source language, the per-role results of
    :func:`role_results`, the strongest head per role, α statistics and the number of
    ``flagged`` (softmax-then-sparser) heads."""
    blocks = report["analysis"]["blocks"]
    densities = report["analysis"]["densities"]
    return {
        "js": {key: block["js"] for key, block in blocks.items()},
        "mean_density": {kind: statistics.fmean(v) for kind, v in densities.items() if v},
        "source_language": report["source_language"],
        "roles": report["roles"],
        "best_heads": {
            head["role"]: {k: head[k] for k in ("block", "head", "alpha", "score", "confidence")}
            for head in report["best_heads"]
        },
        "alpha": alpha_statistics(report["alphas"]),
        "heads_towards_softmax_then_sparser": len(flagged),
    }
