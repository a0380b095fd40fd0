"""Head roles: positional, BPE-merging and interrogation scores on planted maps, the heads that
hold a role and the roles that cannot be measured, and the word features of source pieces."""

from __future__ import annotations

import math

import pytest
import torch

from learnable_sparsity.analysis.heads import HeadAnalysis, summary
from learnable_sparsity.analysis.roles import (
    QUESTION_MARKS,
    argmax_share,
    best_heads,
    bpe_merge_score,
    interrogation_score,
    positional_confidence,
    role_results,
    roles,
    source_word_features,
)


def uniform_maps(lengths: list[int], H: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-attention probs [B, H, L, L] uniform over each sentence's real tokens, and the mask."""
    L = max(lengths)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    probs = mask[:, None, None, :].double().expand(len(lengths), H, L, L).clone()
    return probs / probs.sum(-1, keepdim=True), mask


def planted_result(
    probs: torch.Tensor,
    mask: torch.Tensor,
    word_ids: torch.Tensor,
    interrogative: torch.Tensor,
    question_mark: torch.Tensor,
) -> dict:
    """``HeadAnalysis.result()`` of one encoder self-attention block with the given maps."""
    analysis = HeadAnalysis()
    B = probs.shape[0]
    tgt_mask = torch.ones(B, 1, dtype=torch.bool)
    analysis.update(
        {"encoder.self.layer0": probs},
        mask,
        tgt_mask,
        word_ids,
        torch.full((B, 1), -1),
        interrogative,
        question_mark,
    )
    return analysis.result()


def distinct_words(mask: torch.Tensor) -> torch.Tensor:
    """Every real token its own word (no BPE split); −1 on padding."""
    return torch.where(mask, torch.arange(mask.shape[1]).expand_as(mask), -1)


def test_positional_head_is_found_with_its_confidence() -> None:
    probs, mask = uniform_maps([5, 3], H=3)
    for b, n in enumerate([5, 3]):
        probs[b, 1] = 0.0
        probs[b, 1, 0, 0] = 1.0
        for q in range(1, n):
            probs[b, 1, q, q - 1], probs[b, 1, q, q] = 0.9, 0.1
    uniform = (4 * (1 / 5) + 2 * (1 / 3)) / 6  # queries 1..4 of sentence 0, 1..2 of sentence 1
    torch.testing.assert_close(
        positional_confidence(probs, mask, -1),
        torch.tensor([uniform, 0.9, uniform], dtype=torch.float64),
    )
    no_words = torch.zeros_like(mask)
    result = planted_result(probs, mask, distinct_words(mask), no_words, no_words)
    assert result["blocks"]["encoder.self.layer0"]["scores"]["bpe_merge"] is None
    assert result["blocks"]["encoder.self.layer0"]["scores"]["interrogation"] is None
    found = roles(result, threshold=0.8)
    assert [(r["role"], r["head"]) for r in found] == [("positional_prev", 1)]
    assert found[0]["confidence"] == pytest.approx(0.9)
    assert found[0]["block"] == "encoder.self.layer0" and found[0]["layer"] == 0
    assert found[0]["alpha"] is None


def test_positional_next_and_out_of_range_offsets() -> None:
    probs, mask = uniform_maps([4], H=1)
    probs[0, 0] = torch.diag(torch.ones(3, dtype=torch.float64), 1) + torch.diag(
        torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)
    )
    assert positional_confidence(probs, mask, 1).item() == pytest.approx(1.0)
    assert math.isnan(positional_confidence(probs, mask, 4).item())


def test_bpe_merging_head_is_found_with_its_confidence() -> None:
    # Sentence 0: "▁un bel iev able ▁story ▁." → words [0, 0, 0, 0, 1, 2];
    # sentence 1: "▁sto ry ▁is ▁ama zing" → words [0, 0, 1, 2, 2] (padded to 6).
    word_ids = torch.tensor([[0, 0, 0, 0, 1, 2], [0, 0, 1, 2, 2, -1]])
    probs, mask = uniform_maps([6, 5], H=2)
    planted = torch.eye(6, dtype=torch.float64).repeat(2, 1, 1)  # every token attends itself
    planted[0, 1, :2] = torch.tensor([0.5, 0.5])
    planted[0, 3, :4] = torch.tensor([0.35, 0.3, 0.3, 0.05])  # 0.95 on its word's others
    planted[1, 1, :2] = torch.tensor([0.9, 0.1])  # "ry" → "▁sto": 0.9
    planted[1, 3, 3:5] = torch.tensor([0.2, 0.8])  # "▁ama" → "zing": 0.8
    planted[1, 5] = 0.0
    probs[:, 1] = planted
    expected = (0.95 + 0.9 + 0.8) / 3
    # Uniform head: the best subword of a k-subword word in a sentence of n tokens has (k−1)/n.
    uniform = (3 / 6 + 1 / 5 + 1 / 5) / 3
    torch.testing.assert_close(
        bpe_merge_score(probs, word_ids, mask),
        torch.tensor([uniform, expected], dtype=torch.float64),
    )
    no_words = torch.zeros_like(mask)
    found = roles(planted_result(probs, mask, word_ids, no_words, no_words), threshold=0.8)
    assert [(r["role"], r["head"]) for r in found] == [("bpe_merge", 1)]
    assert found[0]["confidence"] == pytest.approx(expected)


def test_interrogation_head_is_found_with_its_confidence() -> None:
    # Sentence 0: "who saw the dog ?"; sentence 1: "the dog who ran ." (no "?": not counted).
    interrogative = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.bool)
    question_mark = torch.tensor([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    probs, mask = uniform_maps([5, 5], H=3)
    probs[:, 2] = torch.eye(5, dtype=torch.float64)
    probs[0, 2, 0] = torch.tensor([0.03, 0, 0, 0, 0.97], dtype=torch.float64)
    torch.testing.assert_close(
        interrogation_score(probs, interrogative, question_mark),
        torch.tensor([0.2, 0.2, 0.97], dtype=torch.float64),
    )
    found = roles(
        planted_result(probs, mask, distinct_words(mask), interrogative, question_mark),
        alphas={"encoder.self.layer0": [1.5, 1.7, 1.05]},
        threshold=0.8,
    )
    assert [(r["role"], r["head"], r["alpha"]) for r in found] == [("interrogation", 2, 1.05)]
    assert found[0]["confidence"] == pytest.approx(0.97)


def test_positional_role_is_the_argmax_share_with_the_mean_weight_as_confidence() -> None:
    # Sentence of 6 tokens, queries 1..5 have a previous token.
    probs, mask = uniform_maps([6], H=3)
    prev = torch.zeros(6, 6, dtype=torch.float64)
    prev[0, 0] = 1.0
    for q in range(1, 6):
        prev[q, q - 1], prev[q, q] = 0.6, 0.4  # largest weight on q − 1, but only 0.6 of it
    probs[0, 0] = prev
    mostly = prev.clone()
    mostly[5, 4], mostly[5, 5] = 0.3, 0.7  # query 5 looks at itself: share 4/5 < 0.9
    probs[0, 1] = mostly
    shares = argmax_share(probs, mask, -1)
    assert shares[0].item() == pytest.approx(1.0)
    assert shares[1].item() == pytest.approx(0.8)
    assert shares[2].item() == pytest.approx(1 / 6)  # uniform: six-way tie, credit 1/6
    assert positional_confidence(probs, mask, -1)[0].item() == pytest.approx(0.6)
    no_words = torch.zeros_like(mask)
    result = planted_result(probs, mask, distinct_words(mask), no_words, no_words)
    block = result["blocks"]["encoder.self.layer0"]
    assert block["scores"]["positional_prev"] == pytest.approx([1.0, 0.8, 1 / 6])
    assert block["confidence"]["positional_prev"][0] == pytest.approx(0.6)
    assert block["matched"]["positional_prev"] == 5
    assert block["matched"]["positional_next"] == 5
    found = roles(result, threshold=0.8, positional_share=0.9)
    assert [(r["role"], r["head"]) for r in found] == [("positional_prev", 0)]
    assert found[0]["score"] == pytest.approx(1.0)
    assert found[0]["confidence"] == pytest.approx(0.6)  # below 0.8, positional all the same
    assert [r["head"] for r in roles(result, positional_share=0.8)] == [0, 1]


def test_argmax_ties_split_the_credit_among_the_maxima() -> None:
    probs, mask = uniform_maps([3], H=2)
    probs[0, 0] = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0.5]], dtype=torch.float64)
    probs[0, 1] = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]], dtype=torch.float64)
    # Head 0: queries 1 and 2 tie between q − 1 and q → ½ each; head 1 is a clean previous-token
    # head. Padding keys (weight 0) never tie with a positive maximum.
    torch.testing.assert_close(
        argmax_share(probs, mask, -1), torch.tensor([0.5, 1.0], dtype=torch.float64)
    )
    padded, padded_mask = uniform_maps([3, 2], H=1)
    padded[1, 0, 1] = torch.tensor([1.0, 0, 0], dtype=torch.float64)
    assert argmax_share(padded, padded_mask, -1).item() == pytest.approx((1 / 3 + 1 / 3 + 1) / 3)


def test_previous_token_head_is_positional_not_bpe_merging() -> None:
    # "▁sto ry ▁ama zing ▁ok": words [0, 0, 1, 1, 2]. Head 0 attends the previous token (so
    # every second subword puts all its mass on its word's first one: BPE score 1). Head 1 merges
    # BPE pieces without being positional: first subwords look ahead, single words at themselves.
    word_ids = torch.tensor([[0, 0, 1, 1, 2]])
    probs, mask = uniform_maps([5], H=2)
    probs[0, 0] = torch.diag(torch.ones(4, dtype=torch.float64), -1)
    probs[0, 0, 0, 0] = 1.0
    merge = torch.zeros(5, 5, dtype=torch.float64)
    for q, k in ((0, 1), (1, 0), (2, 3), (3, 2), (4, 4)):
        merge[q, k] = 1.0
    probs[0, 1] = merge
    no_words = torch.zeros_like(mask)
    result = planted_result(probs, mask, word_ids, no_words, no_words)
    scores = result["blocks"]["encoder.self.layer0"]["scores"]
    assert scores["bpe_merge"] == pytest.approx([1.0, 1.0])  # the JSON keeps both scores
    assert scores["positional_prev"] == pytest.approx([1.0, 0.5])
    found = roles(result)
    assert [(r["role"], r["head"]) for r in found] == [("positional_prev", 0), ("bpe_merge", 1)]
    summed = role_results(result)
    assert summed["positional_prev"]["count"] == 1 and summed["bpe_merge"]["count"] == 1
    assert summed["bpe_merge"]["heads"][0]["head"] == 1
    assert summed["bpe_merge"]["matched"] == 2  # two words of two subwords
    # The strongest head of each measurable role, whatever its score; never the positional head
    # for BPE merging, though it ties at 1.
    best = [(h["role"], h["head"]) for h in best_heads(result)]
    assert best == [("positional_prev", 0), ("positional_next", 1), ("bpe_merge", 1)]


def test_roles_without_matched_queries_are_not_measurable() -> None:
    # No word split into subwords, no interrogative word: neither role can be measured.
    probs, mask = uniform_maps([4, 3], H=2)
    no_words = torch.zeros_like(mask)
    question = torch.zeros_like(mask)
    question[0, 3] = True  # a question without a question word
    result = planted_result(probs, mask, distinct_words(mask), no_words, question)
    summed = role_results(result, threshold=0.8, positional_share=0.9)
    for role in ("bpe_merge", "interrogation"):
        assert summed[role] == {
            "measurable": False,
            "matched": 0,
            "threshold": 0.8,
            "count": None,
            "heads": [],
        }
    assert summed["positional_prev"]["measurable"] and summed["positional_prev"]["count"] == 0
    assert summed["positional_prev"]["threshold"] == 0.9
    assert summed["positional_prev"]["matched"] == 3 + 2
    report = {
        "analysis": result,
        "source_language": "xx",
        "roles": summed,
        "best_heads": roles(result, threshold=0.0, positional_share=0.0)[:1],
        "alphas": {},
    }
    cell = summary(report, [])
    assert cell["roles"]["interrogation"]["count"] is None
    assert cell["source_language"] == "xx"
    assert set(cell["best_heads"]["positional_prev"]) == {
        "block",
        "head",
        "alpha",
        "score",
        "confidence",
    }


def test_glued_spanish_question_mark_counts_as_mark_and_word() -> None:
    marks = QUESTION_MARKS
    # One piece "▁¿Qué": it is the interrogative "qué" and a question-mark key.
    words, interrogative, question = source_word_features(
        ["▁¿Qué", "▁hora", "▁es", "?"], ["qué", "quién"], marks
    )
    assert words == [0, 1, 2, 2]
    assert interrogative == [True, False, False, False]
    assert question == [True, False, False, True]
    # Split in two pieces, with the mark glued at the end of a word too.
    _, interrogative, question = source_word_features(
        ["▁¿", "qu", "é", "▁pasa", "?"], ["QUÉ"], marks
    )
    assert interrogative == [True, True, True, False, False]
    assert question == [True, False, False, False, True]
    # English, upper case; a word that only contains an interrogative is none.
    _, interrogative, question = source_word_features(
        ["▁Who", "▁is", "▁somewhat", "▁here", "？"], ["who", "what"], marks
    )
    assert interrogative == [True, False, False, False, False]
    assert question == [False, False, False, False, True]
    _, interrogative, _ = source_word_features(["▁who", "?"], [], marks)
    assert interrogative == [False, False]  # a language without interrogatives
