"""Head statistics: JS, density, role scores on planted maps, α flags, and a tiny Transformer."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from components.analysis.alpha import (
    BIMODALITY_THRESHOLD,
    alpha_trajectories,
    bimodality_coefficient,
    softmax_then_sparser,
)
from components.analysis.blocks import split_block
from components.analysis.heads import (
    QUESTION_MARKS,
    AnalysisSettings,
    HeadAnalysis,
    analyze,
    analyze_heads,
    argmax_share,
    attention_density,
    bpe_merge_score,
    interrogation_score,
    js_divergence,
    positional_confidence,
    role_results,
    roles,
    source_word_features,
    summary,
)
from components.data.bpe import BpeModel, train_joint_bpe
from components.data.generated import SOURCE_LANGUAGE, WH_ADVERBS, WH_PRONOUNS, generate_splits
from components.data.registry import CORPORA
from components.errors import LearnableSparsityError
from components.nmt.model import Transformer, TransformerConfig
from components.settings import SettingsError, build

ROOT = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- JS and density


def test_js_of_identical_heads_is_zero() -> None:
    p = torch.softmax(torch.randn(5, 1, 7, dtype=torch.float64), -1).expand(5, 4, 7)
    js = js_divergence(p, torch.ones(7, dtype=torch.bool))
    assert js.shape == (5,)
    torch.testing.assert_close(js, torch.zeros(5, dtype=torch.float64), atol=1e-12, rtol=0)


def test_js_of_one_hot_heads_on_distinct_keys_is_one() -> None:
    H = 4
    p = torch.eye(H, dtype=torch.float64)  # head j attends key j only; n = H
    js = js_divergence(p, torch.ones(H, dtype=torch.bool))
    assert js.item() == pytest.approx(1.0, abs=1e-12)


def test_js_matches_hand_computation() -> None:
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    mean_entropy = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    expected = mean_entropy - (0.0 + 1.0) / 2
    assert js_divergence(p, torch.ones(2, dtype=torch.bool)).item() == pytest.approx(expected)


def test_js_uses_the_base_of_the_available_keys() -> None:
    # Four one-hot heads on the 4 available keys of 6: JS = ln 4 / ln 4 = 1 (not ln 4 / ln 6).
    p = torch.zeros(4, 6, dtype=torch.float64)
    p[torch.arange(4), torch.tensor([0, 1, 3, 4])] = 1.0
    mask = torch.tensor([True, True, False, True, True, False])
    assert js_divergence(p, mask).item() == pytest.approx(1.0, abs=1e-12)
    # One available key: JS is defined as 0.
    single = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    assert js_divergence(single, torch.tensor([True, False])).item() == 0.0


def test_js_with_causal_mask_broadcasts_per_query() -> None:
    T, H = 4, 3
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # query t sees t + 1 keys
    p = torch.zeros(T, H, T, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            p[t, h, min(h, t)] = 1.0  # distinct keys while available
    js = js_divergence(p, causal)
    # query 0: n = 1 → 0; query 1: two heads on key 1 and one on key 0 → H₂([1/3, 2/3]);
    # query ≥ 2: three distinct keys out of n = t + 1.
    h2 = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3)) / math.log(2)
    expected = [0.0, h2, math.log(3) / math.log(3), math.log(3) / math.log(4)]
    torch.testing.assert_close(js, torch.tensor(expected, dtype=torch.float64))


def test_density_of_softmax_is_one_and_of_a_planted_map_its_fraction() -> None:
    mask = torch.tensor([True, True, True, True, False])
    scores = torch.randn(3, 2, 5).masked_fill(~mask, -math.inf)
    dense = attention_density(torch.softmax(scores, -1), mask)
    assert torch.equal(dense, torch.ones(3, 2))
    sparse = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1, 0.0]])
    assert attention_density(sparse, mask).tolist() == [0.5, 1.0]
    assert attention_density(sparse, mask, threshold=0.2).tolist() == [0.5, 0.25]


def test_shape_errors_name_the_shapes() -> None:
    with pytest.raises(LearnableSparsityError, match=r"\(5,\)"):
        js_divergence(torch.ones(2, 3, 4), torch.ones(5, dtype=torch.bool))
    with pytest.raises(LearnableSparsityError, match=re.escape("-0.1")):
        attention_density(torch.ones(2, 4), torch.ones(4, dtype=torch.bool), threshold=-0.1)
    with pytest.raises(LearnableSparsityError, match=re.escape("encoder.cross.layer0")):
        split_block("encoder.cross.layer0")
    assert split_block("decoder.context.layer11") == ("decoder.context", 11)


# ----------------------------------------------------------------------------- planted roles


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


def test_analysis_settings_check_words_and_marks() -> None:
    base = {"interrogatives": {"en": ["who"]}}
    assert build(AnalysisSettings, base, "analysis").question_marks == QUESTION_MARKS
    with pytest.raises(SettingsError, match=re.escape("analysis.interrogatives.es[1] must be one")):
        build(AnalysisSettings, {"interrogatives": {"es": ["qué", "por qué"]}}, "analysis")
    with pytest.raises(SettingsError, match=re.escape("analysis.question_marks[0] must be one")):
        build(AnalysisSettings, {**base, "question_marks": ["?!"]}, "analysis")
    with pytest.raises(
        SettingsError, match=re.escape("analysis.positional_share must be > 0 and <= 1")
    ):
        build(AnalysisSettings, {**base, "positional_share": 1.5}, "analysis")
    with pytest.raises(SettingsError, match=re.escape("analysis.interrogatives is missing")):
        build(AnalysisSettings, {}, "analysis")


def test_smoke_corpus_questions_are_measurable_with_the_committed_settings() -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["analysis"]
    settings = build(AnalysisSettings, params, "analysis")
    # Every corpus of the registry has its source language's question words.
    assert {spec.source_lang for spec in CORPORA.values()} <= set(settings.interrogatives)
    english = settings.interrogatives[SOURCE_LANGUAGE]
    assert {*WH_PRONOUNS, *WH_ADVERBS, "which", "where"} <= set(english)
    # The ci profile analyses the first 20 validation sentences of a 400/40/40 corpus.
    valid = generate_splits({"train": 400, "valid": 40, "test": 40}, 0)["valid"][:20]
    matched = 0
    for source, _ in valid:
        pieces = [f"▁{word}" for word in source.split()]
        _, interrogative, question = source_word_features(pieces, english, settings.question_marks)
        matched += sum(interrogative) if any(question) else 0
    assert matched > 0


# ----------------------------------------------------------------------------- α statistics


def test_bimodality_separates_bimodal_from_unimodal_samples() -> None:
    rng = np.random.default_rng(0)
    unimodal = rng.normal(1.5, 0.1, 400)
    bimodal = np.concatenate([rng.normal(1.2, 0.05, 200), rng.normal(1.95, 0.05, 200)])
    assert bimodality_coefficient(unimodal.tolist()) < BIMODALITY_THRESHOLD
    assert bimodality_coefficient(torch.from_numpy(bimodal)) > BIMODALITY_THRESHOLD
    uniform = np.linspace(0, 1, 10_001)
    assert bimodality_coefficient(uniform.tolist()) == pytest.approx(5 / 9, abs=1e-3)
    with pytest.raises(LearnableSparsityError, match="got 3"):
        bimodality_coefficient([1.0, 2.0, 3.0])
    with pytest.raises(LearnableSparsityError, match=re.escape("1.5")):
        bimodality_coefficient([1.5] * 5)


def test_softmax_then_sparser_flag() -> None:
    assert softmax_then_sparser([1.45, 1.35, 1.3, 1.5, 1.9], alpha_init=1.5)
    assert softmax_then_sparser([1.5, 1.3, 1.36])  # start = first value
    assert not softmax_then_sparser([1.5, 1.4, 1.3, 1.2], alpha_init=1.5)  # softmax only
    assert not softmax_then_sparser([1.55, 1.7, 1.9], alpha_init=1.5)  # sparser only
    assert not softmax_then_sparser([1.5, 1.47, 1.5, 1.49], alpha_init=1.5)  # wiggle < tol
    assert not softmax_then_sparser([1.5, 1.3, 1.33], alpha_init=1.5)  # rise < tol
    assert softmax_then_sparser([1.5, 1.3, 1.33], alpha_init=1.5, tolerance=0.01)
    with pytest.raises(LearnableSparsityError, match="empty"):
        softmax_then_sparser([])


def test_alpha_trajectories_transpose_the_history() -> None:
    history = [
        {"step": 10, "alphas": {"decoder.self.layer0": [1.4, 1.6], "encoder.self.layer0": [1.5]}},
        {"step": 20, "alphas": {"decoder.self.layer0": [1.3, 1.7], "encoder.self.layer0": [1.6]}},
    ]
    steps, series = alpha_trajectories(history)
    assert steps == [10, 20]
    assert list(series) == ["encoder.self.layer0", "decoder.self.layer0"]
    assert series["decoder.self.layer0"] == [[1.4, 1.3], [1.6, 1.7]]
    with pytest.raises(LearnableSparsityError, match="step 30"):
        alpha_trajectories([*history, {"step": 30, "alphas": {"encoder.self.layer0": [1.6]}}])


# ----------------------------------------------------------------------------- tiny Transformer


def tiny_transformer(normalizer: str, **overrides: object) -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab=20,
        tgt_vocab=20,
        d_model=16,
        n_heads=2,
        d_ff=32,
        enc_layers=2,
        dec_layers=2,
        normalizer=normalizer,
        max_positions=32,
        **overrides,
    )
    return Transformer(config)


def tiny_corpus() -> tuple[list, list, list, list, list]:
    """Examples with token ids 4..19, two subwords per word, "?"-ending questions (id 5)."""
    rng = random.Random(0)
    examples, src_words, tgt_words, interrogative, question = [], [], [], [], []
    for _ in range(12):
        src = [rng.randrange(6, 20) for _ in range(rng.randrange(2, 9))]
        tgt = [rng.randrange(4, 20) for _ in range(rng.randrange(2, 9))]
        asks = rng.random() < 0.5
        if asks:
            src = [4, *src, 5]  # 4 = an interrogative word, 5 = "?"
        examples.append((src, tgt))
        src_words.append([i // 2 for i in range(len(src))])
        tgt_words.append([i // 2 for i in range(len(tgt))])
        interrogative.append([t == 4 for t in src])
        question.append([t == 5 for t in src])
    return examples, src_words, tgt_words, interrogative, question


def densities(result: dict) -> list[float]:
    return [d for block in result["blocks"].values() for d in block["density"]]


def test_softmax_transformer_is_dense_everywhere() -> None:
    model = tiny_transformer("softmax")
    result = analyze(model, *tiny_corpus(), max_tokens=40)
    assert model.training  # the caller's mode is restored
    assert len(result["blocks"]) == 6
    assert densities(result) == [1.0] * 12  # exactly 1: causal availability is respected
    assert set(result["densities"]) == {"encoder.self", "decoder.context", "decoder.self"}
    assert all(0.0 <= block["js"] <= 1.0 for block in result["blocks"].values())
    encoder = result["blocks"]["encoder.self.layer0"]["scores"]
    decoder = result["blocks"]["decoder.self.layer1"]["scores"]
    assert set(encoder) == {"positional_prev", "positional_next", "bpe_merge", "interrogation"}
    assert set(decoder) == {"positional_prev", "bpe_merge"}
    assert result["blocks"]["decoder.context.layer0"]["scores"] == {}


def test_sparsemax_transformer_densities_and_batching_invariance() -> None:
    model = tiny_transformer("sparsemax").eval()
    corpus = tiny_corpus()
    result = analyze(model, *corpus, max_tokens=40)
    values = densities(result)
    assert all(0.0 < d <= 1.0 for d in values)
    assert min(values) < 1.0
    one_batch = analyze(model, *corpus, max_tokens=10_000)
    for key, block in result["blocks"].items():
        assert block["queries"] == one_batch["blocks"][key]["queries"]
        assert block["density"] == pytest.approx(one_batch["blocks"][key]["density"])
        assert block["js"] == pytest.approx(one_batch["blocks"][key]["js"])


def test_roles_carry_the_learned_alphas() -> None:
    model = tiny_transformer("entmax_alpha", alpha_init=None)
    result = analyze(model, *tiny_corpus(), max_tokens=10_000)
    alphas = model.alphas()
    found = roles(result, alphas, threshold=0.0, positional_share=1.0)
    assert {r["role"] for r in found} == {"bpe_merge", "interrogation"}  # no share of exactly 1
    for r in found:
        assert r["alpha"] == pytest.approx(alphas[r["block"]][r["head"]].item())
    scores = [r["score"] for r in found if r["role"] == "bpe_merge"]
    assert scores == sorted(scores, reverse=True)
    # At share 0 every head is positional at both offsets, so none is left for BPE merging.
    found = roles(result, alphas, threshold=0.0, positional_share=0.0)
    assert {r["role"] for r in found} == {"positional_prev", "positional_next", "interrogation"}


def test_update_rejects_mismatched_inputs() -> None:
    probs, mask = uniform_maps([3], H=2)
    analysis = HeadAnalysis()
    tgt_mask = torch.ones(1, 2, dtype=torch.bool)
    args = (mask, tgt_mask, distinct_words(mask), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(LearnableSparsityError, match="tgt_word_ids"):
        analysis.update({"encoder.self.layer0": probs}, *args, mask, mask)
    with pytest.raises(LearnableSparsityError, match=re.escape("decoder.self.layer0")):
        analysis.update(
            {"decoder.self.layer0": probs},
            mask,
            torch.ones(1, 2, dtype=torch.bool),
            distinct_words(mask),
            torch.zeros(1, 2, dtype=torch.long),
            mask,
            mask,
        )


def test_analyze_heads_reads_the_question_words_of_the_source_language(tmp_path: Path) -> None:
    pairs = generate_splits({"train": 300, "valid": 20, "test": 1}, 0)
    bpe = BpeModel(train_joint_bpe(pairs["train"], tmp_path / "joint", 200))
    config = tiny_transformer("softmax").config.for_vocabulary(bpe.vocab_size, "softmax")
    model = Transformer(replace(config, max_positions=128))
    settings = build(
        AnalysisSettings,
        {"interrogatives": {"en": ["who", "what", "which", "where", "when", "why", "how"]}},
        "analysis",
    )
    english = analyze_heads(model, bpe, pairs["valid"], settings, "en")
    unknown = analyze_heads(model, bpe, pairs["valid"], settings, None)
    assert english["roles"]["interrogation"]["measurable"]
    assert english["roles"]["interrogation"]["matched"] > 0
    assert english["roles"]["interrogation"]["count"] is not None
    assert unknown["roles"]["interrogation"] == {
        "measurable": False,
        "matched": 0,
        "threshold": 0.8,
        "count": None,
        "heads": [],
    }
    for report in (english, unknown):
        assert report["roles"]["bpe_merge"]["measurable"]  # 200 pieces split many words
        assert "?" in "".join(report["pieces"][0])  # the heat-map example is a question
    cell = summary(english, [])
    assert cell["source_language"] == "en"
    assert cell["roles"] == english["roles"]
