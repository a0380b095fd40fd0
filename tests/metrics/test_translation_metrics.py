"""Translation metrics against hand computation and sacreBLEU's own API."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import sacrebleu

from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.metrics.translation import (
    corpus_bleu,
    corpus_chrf,
    empty_hypotheses,
    tokenized_bleu,
    translation_metrics,
)

HYPS = ["the cat sat on the mat .", "a dog barks loudly"]
REFS = ["the cat sat on a mat .", "the dog barks loudly"]


def manual_bleu(hyps: list[str], refs: list[str]) -> float:
    """Corpus BLEU-4 from clipped n-gram counts over whitespace tokens (no smoothing needed)."""
    log_precision = 0.0
    for n in range(1, 5):
        matched = total = 0
        for h, r in zip(hyps, refs, strict=True):
            h_grams = Counter(tuple(h.split()[i : i + n]) for i in range(len(h.split()) - n + 1))
            r_grams = Counter(tuple(r.split()[i : i + n]) for i in range(len(r.split()) - n + 1))
            matched += sum(min(c, r_grams[g]) for g, c in h_grams.items())
            total += sum(h_grams.values())
        log_precision += math.log(matched / total) / 4
    hyp_len = sum(len(h.split()) for h in hyps)
    ref_len = sum(len(r.split()) for r in refs)
    brevity = min(1.0, math.exp(1 - ref_len / hyp_len))
    return 100 * brevity * math.exp(log_precision)


def test_identical_text_scores_100() -> None:
    assert corpus_bleu(REFS, REFS).score == pytest.approx(100)
    assert tokenized_bleu(REFS, REFS).score == pytest.approx(100)
    assert corpus_chrf(REFS, REFS).score == pytest.approx(100)


def test_tokenized_bleu_matches_hand_computation() -> None:
    assert tokenized_bleu(HYPS, REFS).score == pytest.approx(manual_bleu(HYPS, REFS))


def test_detokenized_bleu_is_sacrebleu_default() -> None:
    expected = sacrebleu.corpus_bleu(HYPS, [REFS]).score
    score = corpus_bleu(HYPS, REFS)
    assert score.score == pytest.approx(expected)
    assert "tok:13a" in score.signature
    assert "tok:none" in tokenized_bleu(HYPS, REFS).signature
    assert score.details["sys_len"] == 11 and len(score.details["precisions"]) == 4


def test_chrf_is_sacrebleu_chrf2() -> None:
    score = corpus_chrf(HYPS, REFS)
    assert score.score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert "nc:6" in score.signature and "nw:0" in score.signature


def test_metrics_dict_and_errors() -> None:
    metrics = translation_metrics(HYPS, REFS)
    assert set(metrics) == {"bleu", "tokenized_bleu", "chrf"}
    assert all("signature" in m and "score" in m for m in metrics.values())
    with pytest.raises(LearnableSparsityError, match="2 hypotheses but 1 references"):
        corpus_bleu(HYPS, REFS[:1])
    with pytest.raises(LearnableSparsityError, match="no hypotheses"):
        corpus_chrf([], [])


def test_empty_hypotheses_are_counted() -> None:
    assert empty_hypotheses(["a b", "", "  ", "c"]) == 2
    assert empty_hypotheses(HYPS) == 0
