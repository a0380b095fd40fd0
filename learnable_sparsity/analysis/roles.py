r"""Head roles of Correia et al. (2019, §5): per-head role scores and the heads that hold a role.

Notation: p_q ∈ Δ^K is one head's self-attention over the K keys of query q; the *real* tokens
of a sentence are its positions that are not padding. Every score is per head, in [0, 1]:

* positional(δ), δ = −1 (previous token) or +1 (next token): the *argmax share*, the fraction of
  the queries q whose key q + δ is a real token that put their largest weight on q + δ. Ties: a
  query whose maximum weight is shared by m keys, q + δ among them, counts 1/m (the argmax drawn
  uniformly among the maxima), so a uniform head scores 1/n, not 1. Beside it the *confidence*,
  the mean weight p_q[q + δ] over the same queries. A head is positional when its share is
  ≥ ``positional_share`` (AST: 90%);
* BPE merging: for each word split into ≥ 2 subwords, the largest mass that one of its subwords
  puts on the word's *other* subwords; averaged over such words. A head that is positional (at
  either offset) in its block is not counted as BPE merging: a previous-token head puts its
  weight on the previous subword of every split word and would score ≈ 1 here, but AST counts
  the two roles apart;
* interrogation: mean of Σ_{k a question-mark key} p_q[k] over queries q that are interrogative
  words, in sentences that contain a question mark. Words and question marks are compared after
  Unicode NFKC and case folding, words without their leading and trailing question marks
  (:func:`source_word_features`).

The queries (words, for BPE merging) a role's mean runs over are its *matched* queries; a role
with none in the analysed sentences (no interrogative word in a question, no word split into
≥ 2 subwords) is *not measurable*: its score is undefined (None), never 0.

Each score has a ``*_sums`` form (sums and a count, so that means add up over batches, as
:class:`learnable_sparsity.analysis.heads.HeadAnalysis` does). :func:`roles` lists the heads of a
``HeadAnalysis.result()`` whose role score passes its threshold, :func:`role_results` sums them up
per role (heads, count, measurable, matched queries) and :func:`best_heads` gives the strongest
head of each role whatever its score. Layers and heads are 0-based (the thesis counts from 1).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from learnable_sparsity.analysis.blocks import ROLES
from learnable_sparsity.data.bpe import WORD_START, word_ids
from learnable_sparsity.errors import LearnableSparsityError

# Role → key offset δ of the positional roles (keys q + δ); the decoder only has −1 (causality
# hides the next target token).
POSITIONAL_OFFSETS: dict[str, int] = {"positional_prev": -1, "positional_next": 1}

# Question marks of the source scripts: Latin "?", the Spanish opening "¿" (BPE glues it to the
# next word), the Arabic "؟" and the full-width "？" of Japanese and Chinese text.
QUESTION_MARKS: tuple[str, ...] = ("?", "¿", "؟", "？")


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


def positional_sums(probs: Tensor, query_mask: Tensor, offset: int) -> tuple[Tensor, Tensor, int]:
    """(Σ_q argmax credit of key q + offset, Σ_q p_q[q + offset]), each per head [H] float64,
    and the number of queries q, over the pairs where q and q + offset are real tokens.

    The credit is 1/m when key q + offset is one of the m keys that hold the query's largest
    weight, else 0. Keys a query may not attend to have weight exactly 0, below its maximum.
    Shapes as in :func:`argmax_share`, unchecked.
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
    shares, _, count = positional_sums(probs, query_mask, offset)
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
    _, confidences, count = positional_sums(probs, query_mask, offset)
    return _mean(confidences, count)


def bpe_sums(probs: Tensor, word_ids: Tensor, query_mask: Tensor) -> tuple[Tensor, int]:
    """(Σ over multi-subword words of the word's score per head [H] float64, number of words),
    the score as in :func:`bpe_merge_score` (shapes too, unchecked)."""
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
    return _mean(*bpe_sums(probs, word_ids, query_mask))


def interrogation_sums(
    probs: Tensor, query_is_interrogative: Tensor, key_is_question_mark: Tensor
) -> tuple[Tensor, int]:
    """(Σ_q weight on question marks per head [H] float64, number of interrogative queries q),
    over the queries of :func:`interrogation_score` (shapes as there, unchecked)."""
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
    return _mean(*interrogation_sums(probs, query_is_interrogative, key_is_question_mark))


def _normal(text: str) -> str:
    """``text`` as words and question marks are compared: Unicode NFKC, then case-folded."""
    return unicodedata.normalize("NFKC", text).casefold()


def _word(text: str, marks: str) -> str:
    """The normal form of the word ``text`` without leading and trailing ``marks`` (normal
    question-mark characters)."""
    return _normal(text).strip(marks)


def word_form(word: str, question_marks: Iterable[str]) -> str:
    """The form in which :func:`source_word_features` compares ``word`` with the interrogatives:
    NFKC, case-folded, without leading and trailing ``question_marks`` ("" for marks only)."""
    return _word(word, _normal("".join(question_marks)))


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
    """The heads that hold a role in a ``HeadAnalysis.result()``.

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


def best_heads(
    result: Mapping[str, object],
    alphas: Mapping[str, Sequence[float] | Tensor] | None = None,
    positional_share: float = 0.9,
) -> list[dict[str, object]]:
    """The strongest head of each role with a defined score, whatever the score, as entries of
    :func:`roles` in the order of :data:`ROLES` (a head positional at either offset is never the
    BPE-merging one)."""
    best: dict[str, dict[str, object]] = {}
    for head in _ranked(result, alphas, positional_share):
        best.setdefault(head["role"], head)
    return list(best.values())


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
