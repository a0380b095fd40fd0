"""Head statistics: JS, density, the analysis settings, α flags, and the analysis of a tiny
Transformer (role scores on planted maps: test_roles.py)."""

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

from learnable_sparsity.analysis.alpha import (
    FLAT_TAIL_ALPHAS,
    STEEPEST_SLOPE,
    alpha_movement,
    alpha_statistics,
    alpha_trajectories,
    flagged_heads,
    modality,
    softmax_then_sparser,
)
from learnable_sparsity.analysis.blocks import split_block
from learnable_sparsity.analysis.heads import (
    AnalysisSettings,
    HeadAnalysis,
    analyze,
    analyze_heads,
    attention_density,
    js_divergence,
    pooled_within_sd,
    summary,
)
from learnable_sparsity.analysis.roles import QUESTION_MARKS, roles, source_word_features
from learnable_sparsity.core.attention import ALPHA_MAX, ALPHA_MIN, alpha_of_logit, logit_of_alpha
from learnable_sparsity.data.bpe import BpeModel, train_joint_bpe
from learnable_sparsity.data.generated import (
    SOURCE_LANGUAGE,
    WH_ADVERBS,
    WH_PRONOUNS,
    generate_splits,
)
from learnable_sparsity.data.registry import CORPORA
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.nmt.model import Transformer
from learnable_sparsity.settings import SettingsError, build
from tests.conftest import refused
from tests.tiny_transformer import tiny_model

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


def test_pooled_within_sd_matches_numpy_on_groups() -> None:
    rng = np.random.default_rng(0)
    groups = {3: rng.random((5, 2)), 7: rng.random((4, 2)), 9: rng.random((1, 2))}
    sums = torch.zeros(10, 2, dtype=torch.float64)
    squares, counts = torch.zeros_like(sums), torch.zeros(10, dtype=torch.float64)
    for n, values in groups.items():
        sums[n], squares[n], counts[n] = (
            torch.tensor(values.sum(0)),
            torch.tensor((values**2).sum(0)),
            len(values),
        )
    # the oracle: squared deviations from each group's own mean over the groups' degrees of
    # freedom (the one-value group adds neither)
    deviations = sum(((v - v.mean(0)) ** 2).sum(0) for v in groups.values() if len(v) > 1)
    expected = np.sqrt(deviations / (5 - 1 + 4 - 1))
    torch.testing.assert_close(pooled_within_sd(sums, squares, counts), torch.tensor(expected))
    single = torch.zeros(10, dtype=torch.float64)
    single[9] = 1
    assert pooled_within_sd(sums, squares, single) is None


def test_density_spread_between_inputs_of_one_length() -> None:
    """Softmax and top-k heads attend to a number of keys fixed by the length: no spread within
    a length although their density differs between lengths; a head whose support changes with
    the input at one length has one."""
    H, L = 2, 6
    keys = torch.tensor([[1] * 6, [1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=bool)
    words = torch.arange(L).expand(4, L)
    flags = torch.zeros(4, L, dtype=torch.bool)
    scores = torch.randn(4, H, L, L, generator=torch.Generator().manual_seed(0))
    scores = scores.masked_fill(~keys[:, None, None, :], -math.inf)
    topk = scores.masked_fill(scores < scores.topk(2, -1).values[..., -1:], -math.inf)
    for probs, spread in ((scores.softmax(-1), 0.0), (topk.softmax(-1), 0.0)):
        analysis = HeadAnalysis()
        analysis.update({"encoder.self.layer0": probs}, keys, keys[:, :1], words, words[:, :1],
                        flags, flags)  # fmt: skip
        block = analysis.result()["blocks"]["encoder.self.layer0"]
        assert block["density_within_length_sd"] == pytest.approx([spread] * H, abs=1e-12)
    # a planted head: at length 6 half its queries attend to 1 key and half to all 6
    planted = torch.zeros(4, 1, L, L, dtype=torch.float64)
    planted[:2, 0, :3, 0] = 1.0
    planted[:2, 0, 3:, :] = 1 / 6
    planted[2:, 0, :, :3] = 1 / 3
    analysis = HeadAnalysis()
    analysis.update({"encoder.self.layer0": planted}, keys, keys[:, :1], words, words[:, :1],
                    flags, flags)  # fmt: skip
    block = analysis.result()["blocks"]["encoder.self.layer0"]
    # length 6: 12 queries, six at 1/6 and six at 1 (sd of the group, 11 degrees of freedom);
    # length 3: 6 queries all at 1 (no spread, 5 degrees of freedom)
    group = np.array([1 / 6] * 6 + [1.0] * 6)
    expected = math.sqrt(((group - group.mean()) ** 2).sum() / (11 + 5))
    assert block["density_within_length_sd"] == pytest.approx([expected])


def test_shape_errors_name_the_shapes() -> None:
    with pytest.raises(LearnableSparsityError, match=r"\(5,\)"):
        js_divergence(torch.ones(2, 3, 4), torch.ones(5, dtype=torch.bool))
    with pytest.raises(LearnableSparsityError, match=re.escape("-0.1")):
        attention_density(torch.ones(2, 4), torch.ones(4, dtype=torch.bool), threshold=-0.1)
    with pytest.raises(LearnableSparsityError, match=re.escape("encoder.cross.layer0")):
        split_block("encoder.cross.layer0")
    assert split_block("decoder.context.layer11") == ("decoder.context", 11)


# ----------------------------------------------------------------------------- settings


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


def _skewed_unimodal(rng: np.random.Generator, n: int = 24) -> np.ndarray:
    """α piled near the lower bound with a long right tail: one mode, strong skew."""
    return ALPHA_MIN + (ALPHA_MAX - ALPHA_MIN) * rng.beta(0.7, 4.0, n)


def test_modality_separates_two_modes_from_one_and_locates_them() -> None:
    rng = np.random.default_rng(0)
    bimodal = np.concatenate([rng.normal(1.2, 0.05, 12), rng.normal(1.95, 0.02, 12)])
    found = modality(torch.from_numpy(bimodal))
    assert found.p_unimodal < 0.01 and found.n == 24
    assert found.modes == pytest.approx((1.2, 1.95), abs=0.05)
    assert modality(rng.normal(1.5, 0.1, 24).tolist()).p_unimodal > 0.05
    with pytest.raises(LearnableSparsityError, match="got 3"):
        modality([1.0, 2.0, 3.0])
    with pytest.raises(LearnableSparsityError, match=re.escape("1.5")):
        modality([1.5] * 5)


def test_skew_does_not_make_alpha_look_bimodal() -> None:
    """Sarle's coefficient, which the dip test replaced, called about 65% of these samples
    bimodal; the dip test at 5% must call at most its level of them so."""
    rng = np.random.default_rng(1)
    samples = [_skewed_unimodal(rng) for _ in range(200)]
    rejected = sum(modality(sample).p_unimodal < 0.05 for sample in samples)
    assert rejected <= 10, f"{rejected} of 200 skewed unimodal samples called multimodal"
    stats = alpha_statistics({"encoder.self.layer0": samples[0].tolist()})
    assert stats["encoder.self"]["p_unimodal"] > 0.05


def test_heads_in_the_flat_tails_are_counted_where_the_slope_is_a_tenth_of_its_steepest() -> None:
    low, high = (logit_of_alpha(torch.tensor(a, dtype=torch.float64)) for a in FLAT_TAIL_ALPHAS)
    for w in (low, high):  # the slope dα/dw there is a tenth of the one at w = 0
        w = w.clone().requires_grad_(True)
        alpha_of_logit(w).backward()
        assert w.grad.item() == pytest.approx(0.1 * STEEPEST_SLOPE)
    alphas = {"encoder.self.layer0": [1.02, 1.034, 1.036, 1.5], "decoder.self.layer0": [1.98, 1.9]}
    stats = alpha_statistics(alphas)
    assert (
        stats["encoder.self"]["flat_tail_softmax"],
        stats["encoder.self"]["flat_tail_sparsemax"],
    ) == (2, 0)
    assert (
        stats["decoder.self"]["flat_tail_softmax"],
        stats["decoder.self"]["flat_tail_sparsemax"],
    ) == (0, 1)


def test_alpha_movement_reads_the_logit() -> None:
    # Interior: the logit's move at the sigmoid's steepest slope bounds |Δα| from above.
    assert alpha_movement(1.5, 1.5, 0.02) == 0.0
    assert alpha_movement(1.5, 1.52, 0.02) == pytest.approx(0.02, rel=0.01)
    # A head in the tail on its way back out: α moves 0.004, its logit by 0.8.
    w = torch.tensor([-6.0, -5.2], dtype=torch.float64)
    before, after = alpha_of_logit(w).tolist()
    assert after - before < 0.005
    assert alpha_movement(before, after, 0.02) == pytest.approx(0.8 * STEEPEST_SLOPE)
    # The same head moving into the bound it lies within 0.02 of: α cannot move by more.
    assert alpha_movement(after, before, 0.02) == pytest.approx(after - before)
    # Values logged on a bound (float rounding) are read just inside it.
    assert math.isfinite(alpha_movement(ALPHA_MIN, ALPHA_MIN + 0.3, 0.02))


def test_softmax_then_sparser_needs_the_thesis_magnitudes() -> None:
    # AST's example: from about 1.5 down to 1.3, then up to about 2
    assert softmax_then_sparser([1.5, 1.38, 1.3, 1.6, 1.95])
    assert softmax_then_sparser([1.45, 1.35, 1.3, 1.5, 1.9], alpha_init=1.5)
    assert not softmax_then_sparser([1.5, 1.4, 1.3, 1.2])  # softmax only
    assert not softmax_then_sparser([1.55, 1.7, 1.9], alpha_init=1.5)  # sparser only
    # a dip and rebound of 0.05 — the old tolerance's hit on heads that all end near softmax
    assert not softmax_then_sparser([1.3, 1.25, 1.3])
    assert not softmax_then_sparser([1.5, 1.3, 1.5])  # rebound 0.2 < 0.35
    assert softmax_then_sparser([1.5, 1.3, 1.33], min_dip=0.05, min_rebound=0.01)
    with pytest.raises(LearnableSparsityError, match="empty"):
        softmax_then_sparser([])
    with pytest.raises(LearnableSparsityError, match=re.escape("-0.1")):
        softmax_then_sparser([1.5], min_dip=-0.1)


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
    """The shared tiny model at half its width, in training mode (``analyze`` must restore it)."""
    return tiny_model(normalizer, d_model=16, d_ff=32, max_positions=32, training=True, **overrides)


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
    probs = torch.full((1, 2, 3, 3), 1 / 3, dtype=torch.float64)  # two uniform heads
    mask = torch.ones(1, 3, dtype=torch.bool)
    words = torch.arange(3)[None]  # every token its own word
    analysis = HeadAnalysis()
    tgt_mask = torch.ones(1, 2, dtype=torch.bool)
    args = (mask, tgt_mask, words, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(LearnableSparsityError, match="tgt_word_ids"):
        analysis.update({"encoder.self.layer0": probs}, *args, mask, mask)
    with pytest.raises(LearnableSparsityError, match=re.escape("decoder.self.layer0")):
        analysis.update(
            {"decoder.self.layer0": probs},
            mask,
            torch.ones(1, 2, dtype=torch.bool),
            words,
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


def test_softmax_then_sparser_on_its_edges() -> None:
    """A dip and a rebound of exactly the bounds count (binary fractions, exact); bounds of 0
    are allowed; ``alpha_init`` replaces the first logged α as the start."""
    assert softmax_then_sparser([1.5, 1.25, 1.75], min_dip=0.25, min_rebound=0.5)
    assert softmax_then_sparser([1.5], min_dip=0.0, min_rebound=0.0)
    assert softmax_then_sparser([1.35, 1.3, 1.7], alpha_init=1.5)  # dip 0.2 from 1.5
    assert not softmax_then_sparser([1.35, 1.3, 1.7])  # dip 0.05 from 1.35
    with refused("softmax_then_sparser needs a non-empty α trajectory"):
        softmax_then_sparser([])


def test_alpha_trajectories_of_one_step_and_a_step_with_other_heads() -> None:
    steps, series = alpha_trajectories([{"step": 10, "alphas": {"encoder.self.layer0": [1.2]}}])
    assert (steps, series) == ([10], {"encoder.self.layer0": [[1.2]]})
    with refused("the α history is empty (was the model α-entmax?)"):
        alpha_trajectories([])
    uneven = [
        {"step": 10, "alphas": {"encoder.self.layer0": [1.2]}},
        {"step": 20, "alphas": {"encoder.self.layer0": [1.2, 1.3]}},
    ]
    with refused("α history at step 20 has 2 heads in encoder.self.layer0, expected 1"):
        alpha_trajectories(uneven)


def test_alpha_statistics_on_their_edges() -> None:
    """The dip test from exactly 4 values, of two distinct values too, never of equal ones; a
    head exactly on a flat tail's edge is not in the tail; every field named."""
    two_values = alpha_statistics({"encoder.self.layer0": [1.2, 1.2, 1.8, 1.8]})["encoder.self"]
    assert two_values["p_unimodal"] is not None
    assert (
        alpha_statistics({"encoder.self.layer0": [1.5] * 4})["encoder.self"]["p_unimodal"] is None
    )
    assert (
        alpha_statistics({"encoder.self.layer0": [1.2, 1.8, 1.5]})["encoder.self"]["p_unimodal"]
        is None
    )
    edges = alpha_statistics({"decoder.self.layer0": list(FLAT_TAIL_ALPHAS)})["decoder.self"]
    assert edges == {
        "mean": pytest.approx(sum(FLAT_TAIL_ALPHAS) / 2),
        "min": FLAT_TAIL_ALPHAS[0],
        "max": FLAT_TAIL_ALPHAS[1],
        "p_unimodal": None,
        "flat_tail_softmax": 0,
        "flat_tail_sparsemax": 0,
    }  # fmt: skip


def test_flagged_heads_are_the_heads_that_dip_then_turn_sparser() -> None:
    history = [
        {"step": s, "alphas": {"encoder.self.layer0": [a, 1.5], "decoder.self.layer0": [b]}}
        for s, a, b in [(10, 1.5, 1.5), (20, 1.3, 1.3), (30, 1.9, 1.35)]
    ]
    assert flagged_heads(history) == [("encoder.self.layer0", 0)]
