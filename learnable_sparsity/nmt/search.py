r"""Batched beam search with incremental decoding for a
:class:`~learnable_sparsity.nmt.seq2seq.Seq2Seq` model (the NMT Transformer, the APE model).

A hypothesis y (ending in eos) is ranked by its length-normalized log-probability
    score(y) = log P(y | x) / lp(|y|),    lp(n) = ((5 + n) / 6)^β    (GNMT, Wu et al. 2016),
where |y| counts the generated tokens including eos and β is the length-penalty exponent (GNMT
calls it α; here α is the entmax parameter); β = 0 ranks by log P(y | x) itself. GNMT's form is
the one of OpenNMT-py (the AST experiments) and tensor2tensor (β = 0.6 in the EST En-Vi setup).

Search, per sentence with K beams: each step scores all K·V one-token extensions of the live
beams, takes the 2K best; those ending in eos among the first K become finished hypotheses, the
K best others stay live (their caches follow them via the cache's ``reorder``). pad and bos are
never generated. The output length is at most max_len = ⌊a · src_len + b⌋ tokens plus eos (eos is
forced at that step). A sentence stops when its best finished score cannot be beaten by any
live beam: log-probabilities only decrease and lp only grows, so a live beam with log P = s can
at best reach s / lp(max_len + 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.batching import pad
from learnable_sparsity.nmt.seq2seq import Seq2Seq
from learnable_sparsity.settings import Settings, setting


class SearchOutput(NamedTuple):
    """Best hypothesis per sentence (ids without bos/eos) and its normalized score, [batch]."""

    tokens: list[list[int]]
    scores: Tensor


def length_penalty(length: int | Tensor, exponent: float) -> float | Tensor:
    """GNMT length penalty lp(n) = ((5 + n) / 6)^exponent."""
    return ((5 + length) / 6) ** exponent


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    *,
    beam_size: int = 5,
    length_penalty_exponent: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    fixed_length: bool = False,
) -> SearchOutput:
    """Translate ``src`` [batch, src_len] (pad-padded ids) with beam search; model in eval mode.

    ``length_penalty_exponent`` is the exponent of lp (0 disables it); each output has at most
    ⌊max_len_a · src_len + max_len_b⌋ tokens before eos (also capped by max_positions − 1).
    ``fixed_length`` allows eos only at that limit, so every output has exactly that length
    whatever the model: equal work for any two models (the speed table's decoding).
    """
    config = model.config
    if model.training:
        raise LearnableSparsityError("beam_search needs model.eval(): dropout randomizes search")
    if beam_size < 1:
        raise LearnableSparsityError(f"beam_size must be a positive integer, got {beam_size}")
    if length_penalty_exponent < 0:
        raise LearnableSparsityError(
            f"length_penalty_exponent must be >= 0, got {length_penalty_exponent}"
        )
    B, K, V, device = src.shape[0], beam_size, config.tgt_vocab, src.device

    memory, src_mask = model.encode(src)
    memory = memory.repeat_interleave(K, dim=0)
    src_mask = src_mask.repeat_interleave(K, dim=0)
    src_len = (src != config.pad_id).sum(1)
    max_len = (max_len_a * src_len.double() + max_len_b).floor().long()
    max_len = max_len.clamp(0, config.max_positions - 1)
    best_possible_lp = length_penalty(max_len + 1, length_penalty_exponent)

    tokens = torch.full((B * K, 1), config.bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, K), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    best_scores = torch.full((B,), -math.inf, device=device)
    best_tokens = torch.full((B, int(max_len.max()) + 1), config.pad_id, device=device)
    best_lengths = torch.zeros(B, dtype=torch.long, device=device)
    batch_offsets = (torch.arange(B, device=device) * K)[:, None]
    cache = None

    for step in range(int(max_len.max()) + 1):
        logits, cache = model.decode(tokens[:, -1:], memory, src_mask, cache, use_cache=True)
        log_p = torch.log_softmax(logits[:, -1].float(), dim=-1).view(B, K, V)
        log_p[..., config.pad_id] = -math.inf
        log_p[..., config.bos_id] = -math.inf
        at_limit = step == max_len
        log_p[at_limit] = log_p[at_limit].masked_fill(
            torch.arange(V, device=device) != config.eos_id, -math.inf
        )
        if fixed_length:
            log_p[~at_limit, :, config.eos_id] = -math.inf

        cand_scores, cand = (scores[:, :, None] + log_p).view(B, K * V).topk(2 * K, dim=1)
        cand_beam, cand_token = cand // V, cand % V
        is_eos = cand_token == config.eos_id

        # Finished: eos candidates among the K best; keep the best per sentence.
        finished = is_eos[:, :K] & torch.isfinite(cand_scores[:, :K])
        normalized = cand_scores[:, :K] / length_penalty(step + 1, length_penalty_exponent)
        normalized = normalized.masked_fill(~finished, -math.inf)
        top_finished, top_rank = normalized.max(dim=1)
        improved = top_finished > best_scores
        if improved.any():
            origin = (batch_offsets[:, 0] + cand_beam.gather(1, top_rank[:, None])[:, 0])[improved]
            best_scores[improved] = top_finished[improved]
            best_tokens[improved, :step] = tokens[origin, 1:]
            best_lengths[improved] = step

        # Live: the K best non-eos candidates (at most K of the 2K end in eos).
        live_rank = torch.argsort(is_eos.long() * 2 * K + torch.arange(2 * K, device=device))
        live_rank = live_rank[:, :K]
        scores = cand_scores.gather(1, live_rank)
        origin = (batch_offsets + cand_beam.gather(1, live_rank)).view(-1)
        tokens = torch.cat([tokens[origin], cand_token.gather(1, live_rank).view(-1, 1)], dim=1)
        cache = cache.reorder(origin)

        done = best_scores >= scores.max(dim=1).values / best_possible_lp
        if done.all():
            break
        scores = scores.masked_fill(done[:, None], -math.inf)

    hyps = [best_tokens[b, : best_lengths[b]].tolist() for b in range(B)]
    return SearchOutput(hyps, best_scores)


def greedy_decode(
    model: Seq2Seq, src: Tensor, *, max_len_a: float = 1.2, max_len_b: int = 10
) -> SearchOutput:
    """Greedy decoding: beam search with one beam and no length penalty (raw log P scores)."""
    return beam_search(
        model,
        src,
        beam_size=1,
        length_penalty_exponent=0.0,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
    )


@dataclass(frozen=True, kw_only=True)
class DecodeSettings(Settings):
    """How test sets are translated (params ``nmt.decode``; also the speed table's decoding).

    ``average_last`` > 1 decodes with the mean weights of the last saved checkpoints.
    """

    beam_size: int = setting(5, at_least=1)
    length_penalty: float = setting(0.6, at_least=0)  # the exponent β of lp; 0: none
    max_len_a: float = setting(1.2, at_least=0)
    max_len_b: int = setting(10, at_least=1)
    batch_sentences: int = setting(100, at_least=1)
    average_last: int = setting(1, at_least=1)

    def search(self, model: Seq2Seq, src: Tensor, fixed_length: bool = False) -> SearchOutput:
        """:func:`beam_search` of the padded ``src`` with these settings."""
        return beam_search(
            model,
            src,
            beam_size=self.beam_size,
            length_penalty_exponent=self.length_penalty,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            fixed_length=fixed_length,
        )


def translate(
    model: Seq2Seq,
    sources: Sequence[Sequence[int]],
    settings: DecodeSettings,
    *,
    batch_size: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Beam-search translations (ids without bos/eos) of ``sources`` (ids without padding), in
    order, ``batch_size`` sentences at a time (default ``settings.batch_sentences``) on the
    model's device; ``on_batch(done)`` reports progress after each batch."""
    size = settings.batch_sentences if batch_size is None else batch_size
    device = next(model.parameters()).device
    hypotheses: list[list[int]] = []
    for start in range(0, len(sources), size):
        src = pad(sources[start : start + size], model.config.pad_id).to(device)
        hypotheses += settings.search(model, src).tokens
        if on_batch is not None:
            on_batch(len(hypotheses))
    return hypotheses
