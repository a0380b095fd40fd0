"""Tests for ``learnable_sparsity.nmt.search``.

Oracle: an independent greedy loop that re-runs the full (non-incremental) model on the whole
prefix at every step, one sentence at a time (so without source padding). It follows the search's
conventions: pad and bos are never generated and eos is forced after max_len tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from learnable_sparsity.core.attention import NORMALIZERS
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.nmt.search import beam_search, greedy_decode, length_penalty

PAD, BOS, EOS = 0, 2, 3


@torch.no_grad()
def _oracle_greedy(model: Transformer, src: torch.Tensor, max_len: int) -> list[int]:
    """Greedy decoding of one unpadded sentence [1, src_len] by full decoding of each prefix."""
    ys = [BOS]
    for step in range(max_len + 1):
        logits = model(src, torch.tensor([ys]))[0, -1]
        logits[[PAD, BOS]] = -math.inf
        token = EOS if step == max_len else int(logits.argmax())
        if token == EOS:
            return ys[1:]
        ys.append(token)
    raise AssertionError("unreachable: eos is forced at max_len")


@torch.no_grad()
def _log_probs(model: Transformer, src: torch.Tensor, hyps: list[list[int]]) -> list[float]:
    """log P(hyp + [eos] | src) of each hyp by one batched teacher-forced pass; src [1, len]."""
    longest = max(map(len, hyps)) + 1
    tgt_in = torch.tensor([[BOS, *h] + [PAD] * (longest - len(h) - 1) for h in hyps])
    tgt_out = torch.tensor([[*h, EOS] + [PAD] * (longest - len(h) - 1) for h in hyps])
    log_p = torch.log_softmax(model(src.expand(len(hyps), -1), tgt_in), dim=-1)
    token_log_p = log_p.gather(2, tgt_out[..., None])[..., 0].masked_fill(tgt_out == PAD, 0.0)
    return token_log_p.sum(1).tolist()


def _unpadded(src: torch.Tensor, b: int) -> torch.Tensor:
    return src[b : b + 1, : int((src[b] != PAD).sum())]


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_beam_size_one_equals_full_decoding_greedy_loop(
    make_model, make_tokens, normalizer
) -> None:
    model = make_model(normalizer, seed=0)
    src = make_tokens([5, 2, 7, 4], seed=20)
    result = beam_search(
        model, src, beam_size=1, length_penalty_exponent=0.0, max_len_a=1.0, max_len_b=2
    )
    expected = [
        _oracle_greedy(model, _unpadded(src, b), max_len=int((src[b] != PAD).sum()) + 2)
        for b in range(4)
    ]
    assert result.tokens == expected
    assert greedy_decode(model, src, max_len_a=1.0, max_len_b=2).tokens == expected
    # Coverage: some sentences stop at eos, others hit max_len.
    lengths = [len(t) for t in expected]
    max_lens = [int((src[b] != PAD).sum()) + 2 for b in range(4)]
    assert any(n < m for n, m in zip(lengths, max_lens, strict=True))
    assert any(n == m for n, m in zip(lengths, max_lens, strict=True))


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_larger_beam_scores_at_least_greedy_and_scores_are_model_scores(
    make_model, make_tokens, normalizer, seed
) -> None:
    model = make_model(normalizer, seed=seed)
    src = make_tokens([6, 3, 5], seed=30 + seed)
    greedy = greedy_decode(model, src)
    beam = beam_search(model, src, beam_size=4, length_penalty_exponent=0.0)
    for b in range(3):
        sentence = _unpadded(src, b)
        beam_score, greedy_score = _log_probs(model, sentence, [beam.tokens[b], greedy.tokens[b]])
        assert beam_score == pytest.approx(beam.scores[b].item(), abs=1e-4)
        assert beam_score >= greedy_score - 1e-5


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_beam_wide_enough_for_every_prefix_is_exact(make_model, make_tokens, alpha) -> None:
    """max_len 2 and 18 generable ids (all but pad, bos) give 1 + 17 + 17² hypotheses; a beam of
    400 keeps every prefix, so the search must return the brute-force best. Output weights ×3
    sharpen the model so that the best hypotheses are not empty (and differ from greedy's)."""
    model = make_model("sparsemax", seed=3)
    with torch.no_grad():
        model.output_proj.weight *= 3
    src = make_tokens([4, 2], seed=60)
    result = beam_search(
        model, src, beam_size=400, length_penalty_exponent=alpha, max_len_a=0.0, max_len_b=2
    )
    ordinary = [v for v in range(20) if v not in (PAD, BOS, EOS)]
    hyps = [[], *([a] for a in ordinary), *([a, b] for a in ordinary for b in ordinary)]
    for b in range(2):
        log_probs = _log_probs(model, _unpadded(src, b), hyps)
        scores = [
            lp / length_penalty(len(h) + 1, alpha) for lp, h in zip(log_probs, hyps, strict=True)
        ]
        best = max(range(len(hyps)), key=scores.__getitem__)
        assert result.tokens[b] == hyps[best] != [], (b, alpha)
        assert result.scores[b].item() == pytest.approx(scores[best], abs=1e-4)


def test_scores_are_length_normalized(make_model, make_tokens) -> None:
    model = make_model("entmax15", seed=5)
    src = make_tokens([6, 4], seed=40)
    result = beam_search(model, src, beam_size=3, length_penalty_exponent=0.6)
    for b, hyp in enumerate(result.tokens):
        (log_prob,) = _log_probs(model, _unpadded(src, b), [hyp])
        expected = log_prob / length_penalty(len(hyp) + 1, 0.6)
        assert result.scores[b].item() == pytest.approx(expected, abs=1e-4)


def test_outputs_respect_max_len(make_model, make_tokens) -> None:
    model = make_model("topk", seed=6)
    src = make_tokens([6, 1, 4], seed=50)
    for beam_size in (1, 3):
        result = beam_search(model, src, beam_size=beam_size, max_len_a=0.5, max_len_b=1)
        assert all(len(t) <= n for t, n in zip(result.tokens, (4, 1, 3), strict=True))
        assert all(PAD not in t and BOS not in t and EOS not in t for t in result.tokens)


def test_beam_search_refuses_training_mode(make_model, make_tokens) -> None:
    with pytest.raises(LearnableSparsityError, match="eval"):
        beam_search(make_model().train(), make_tokens([3], seed=0))


@pytest.mark.parametrize("normalizer", ["softmax", "entmax_alpha"])
def test_fixed_length_search_fills_every_output_to_its_limit(
    make_model, make_tokens, normalizer
) -> None:
    """With ``fixed_length`` every output is exactly ⌊a · src_len + b⌋ tokens long, whatever the
    model prefers (the free search ends some of them earlier), and its score is still the model's
    length-normalized log-probability of it."""
    model = make_model(normalizer, seed=8)
    src = make_tokens([6, 1, 4], seed=60)
    free = beam_search(model, src, beam_size=3, max_len_a=1.0, max_len_b=3)
    fixed = beam_search(model, src, beam_size=3, max_len_a=1.0, max_len_b=3, fixed_length=True)
    assert [len(t) for t in fixed.tokens] == [9, 4, 7]
    assert [len(t) for t in free.tokens] != [9, 4, 7]
    for b, hyp in enumerate(fixed.tokens):
        assert PAD not in hyp and BOS not in hyp and EOS not in hyp
        (log_prob,) = _log_probs(model, _unpadded(src, b), [hyp])
        expected = log_prob / length_penalty(len(hyp) + 1, 0.6)
        assert fixed.scores[b].item() == pytest.approx(expected, abs=1e-4)
